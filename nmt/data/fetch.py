"""``python -m nmt.data.fetch [--from DIR] [--dest data/spa-eng] [--url URL]``: the default corpus.

The toolkit trains on ``data/spa-eng/{train,valid,test}.tsv`` (UTF-8, one ``English<TAB>Spanish``
pair per line), which git does not keep. This fills such a folder, preferring a prepared copy beside
the checkout (``../shared/data/spa-eng``: no network, and everyone gets identical splits), else
downloading the Tatoeba/Anki export and splitting it deterministically. Every file is written with
``nmt.rundir.atomic_write``, so a present non-empty file is a complete one.
"""

from __future__ import annotations

import argparse
import http.client
import io
import logging
import os
import random
import shutil
import sys
import unicodedata
import urllib.request
import zipfile
from collections.abc import Iterable
from pathlib import Path

from nmt.errors import CorpusError, NmtError
from nmt.rundir import atomic_write

log = logging.getLogger(__name__)

# The TensorFlow tutorial's mirror of the manythings.org/anki export of Tatoeba (manythings.org
# itself refuses scripted downloads).
SPA_ENG_URL = "http://storage.googleapis.com/download.tensorflow.org/data/spa-eng.zip"
SPLITS = ("train", "valid", "test")  # each stored as <name>.tsv
SOURCE_ENV_VAR = "NMT_SPA_ENG_SOURCE"  # names a folder with prepared split files
DOWNLOAD_TIMEOUT_S = 60.0  # so a machine without network fails fast
# Copied along with the splits when present, so the attribution travels with the data and
# `sha256sum -c SHA256SUMS` still works in the copy.
_EXTRA_FILES = ("README.md", "SHA256SUMS", "ATTRIBUTION.tsv.gz")
_SAMPLE_DIR = "sample"
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))  # make equal sentences differ

Pair = tuple[str, str]


def corpus_ready(directory: Path) -> bool:
    """Whether every split file exists and is non-empty (else an earlier fetch never finished)."""
    files = [Path(directory) / f"{split}.tsv" for split in SPLITS]
    return all(f.is_file() and f.stat().st_size > 0 for f in files)


def default_source() -> Path | None:
    """The first prepared corpus folder to copy, or None: ``$NMT_SPA_ENG_SOURCE``, then
    ``../shared/data/spa-eng`` from the current folder and from the repository root, so a fresh clone
    with the corpus beside it needs no network. Only complete folders count, so a half-filled one
    never hides the download."""
    env = os.environ.get(SOURCE_ENV_VAR)
    relative = Path("..") / "shared" / "data" / "spa-eng"
    candidates = [Path(env).expanduser()] if env else []
    candidates += [Path.cwd() / relative, Path(__file__).resolve().parents[2] / relative]
    for candidate in candidates:
        if candidate.is_dir() and corpus_ready(candidate):
            return candidate.resolve()
    if env:
        log.warning("%s=%s holds no complete corpus; ignored", SOURCE_ENV_VAR, env)
    return None


def normalize_text(text: str) -> str:
    """One side of a pair in the form in which equal sentences compare equal: Unicode NFC, no
    zero-width characters, every run of whitespace (no-break spaces, tabs, newlines...) one space."""
    text = unicodedata.normalize("NFC", text).translate(_ZERO_WIDTH)
    return " ".join(text.split())


def clean_pairs(pairs: Iterable[Pair]) -> list[Pair]:
    """Normalised pairs without those with an empty side or seen before (the first one is kept, so the
    source's order, and therefore the split, stays deterministic)."""
    seen: set[Pair] = set()
    kept: list[Pair] = []
    empty = duplicates = 0
    for en, es in pairs:
        pair = (normalize_text(en), normalize_text(es))
        if not pair[0] or not pair[1]:
            empty += 1
        elif pair in seen:
            duplicates += 1
        else:
            seen.add(pair)
            kept.append(pair)
    log.info("cleaned pairs: %d kept, %d with an empty side, %d duplicates", len(kept), empty, duplicates)
    return kept


def read_anki_zip(path_or_bytes: str | os.PathLike[str] | bytes) -> list[Pair]:
    """The ``(English, Spanish)`` pairs of an Anki ``spa-eng.zip`` (a path, or its bytes), as found.

    Only the first two tab-separated columns are kept (newer exports add an attribution column);
    lines with fewer are skipped. Raises CorpusError when the zip has no ``spa.txt``.
    """
    data = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with zipfile.ZipFile(data) as archive:
        members = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "spa.txt"]
        if not members:
            raise CorpusError(f"no spa.txt in the zip (members: {archive.namelist()})")
        text = archive.read(members[0]).decode("utf-8")
    pairs: list[Pair] = []
    skipped = 0
    # split("\n"), not splitlines(): that also breaks on U+2028 etc., which may occur inside a sentence.
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) < 2:
            skipped += 1
            continue
        pairs.append((columns[0], columns[1]))
    if skipped:
        log.warning("skipped %d lines with fewer than two columns", skipped)
    return pairs


def split_pairs(
    pairs: list[Pair], valid_size: int = 2000, test_size: int = 2000, seed: int = 20261121
) -> dict[str, list[Pair]]:
    """Train/valid/test splits with no English sentence in two of them, depending only on the input
    order and ``seed``.

    Pairs are grouped by their English side (case-folded, whitespace collapsed), so all translations
    of a sentence land in one split and valid/test measure generalisation, not recall. The groups are
    shuffled with ``random.Random(seed)``; whole groups go to valid until it has ``valid_size`` pairs,
    then to test likewise, the rest to train. valid/test keep the translations of a sentence adjacent
    (handy for multi-reference scoring); train is shuffled pair by pair (``seed + 1``).
    """
    groups: dict[str, list[Pair]] = {}
    for pair in pairs:
        groups.setdefault(" ".join(pair[0].casefold().split()), []).append(pair)
    ordered = list(groups.values())
    random.Random(seed).shuffle(ordered)
    result: dict[str, list[Pair]] = {split: [] for split in SPLITS}
    index = 0
    for split, size in (("valid", valid_size), ("test", test_size)):
        while index < len(ordered) and len(result[split]) < size:
            result[split].extend(ordered[index])
            index += 1
    result["train"] = [pair for group in ordered[index:] for pair in group]
    random.Random(seed + 1).shuffle(result["train"])
    return result


def _copy_corpus(source: Path, dest: Path) -> None:
    names = [f"{split}.tsv" for split in SPLITS] + [n for n in _EXTRA_FILES if (source / n).is_file()]
    sample = source / _SAMPLE_DIR
    if sample.is_dir():
        names += [f"{_SAMPLE_DIR}/{p.name}" for p in sorted(sample.iterdir()) if p.is_file()]
    for name in names:
        # copyfileobj, not copy2: the shared corpus is read-only, the local copy must not be.
        with (source / name).open("rb") as src:
            atomic_write(dest / name, lambda dst, src=src: shutil.copyfileobj(src, dst))
    log.info("copied corpus from %s to %s", source, dest)


def _download(url: str) -> bytes:
    log.info("downloading %s", url)
    request = urllib.request.Request(url, headers={"User-Agent": "nmt-fetch/1"})
    try:
        with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
            return response.read()
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts, a bad URL
        raise CorpusError(
            f"could not download {url}: {e}. Without network, pass --from DIR (a directory with train.tsv, "
            f"valid.tsv and test.tsv, e.g. ../shared/data/spa-eng) or set ${SOURCE_ENV_VAR}."
        ) from e


def fetch_spa_eng(
    dest: Path,
    source: Path | None = None,
    url: str = SPA_ENG_URL,
    valid_size: int = 2000,
    test_size: int = 2000,
    seed: int = 20261121,
) -> Path:
    """Fill ``dest`` with ``train.tsv``, ``valid.tsv`` and ``test.tsv``; returns ``dest``.

    From ``source`` (a folder with the three splits) the files are copied, with its ``sample/``
    folder and README, checksums and attribution when present: the prepared splits are the
    reference everyone compares on. Otherwise the Anki zip at ``url`` is downloaded, cleaned
    (:func:`clean_pairs`) and split (:func:`split_pairs`), deterministically for a given download and
    seed. Raises CorpusError (one line, saying what to do) when ``source`` lacks a split or the
    download fails.
    """
    dest = Path(dest)
    if source is not None:
        if not corpus_ready(Path(source)):
            needed = ", ".join(f"{s}.tsv" for s in SPLITS)
            raise CorpusError(f"{source}: the folder to copy from does not hold non-empty {needed}")
        _copy_corpus(Path(source), dest)
        return dest
    data = _download(url)
    try:
        raw = read_anki_zip(data)
    except (zipfile.BadZipFile, ValueError) as e:  # CorpusError is a ValueError
        raise CorpusError(f"{url} did not serve an Anki spa-eng zip ({e}); pass --url or --from DIR") from e
    splits = split_pairs(clean_pairs(raw), valid_size=valid_size, test_size=test_size, seed=seed)
    for split in SPLITS:
        # normalize_text has turned every tab or newline inside a field into a space
        data = "".join(f"{en}\t{es}\n" for en, es in splits[split]).encode("utf-8")
        atomic_write(dest / f"{split}.tsv", lambda f, data=data: f.write(data))
    log.info("wrote %s: %s", dest, ", ".join(f"{split} {len(splits[split])}" for split in SPLITS))
    return dest


def ensure_spa_eng(dest: Path) -> Path:
    """``dest``, fetched first (from :func:`default_source`, else downloaded) if not complete yet."""
    if not corpus_ready(Path(dest)):
        fetch_spa_eng(Path(dest), source=default_source())
    return Path(dest)


def main(argv: list[str] | None = None) -> int:
    """The command line: one summary line on success, one error line (exit status 1) on failure."""
    parser = argparse.ArgumentParser(
        prog="python -m nmt.data.fetch", description="Fill a directory with the spa-eng train/valid/test TSV files."
    )
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=None,
        help="directory with prepared train/valid/test.tsv to copy "
        f"(default: ${SOURCE_ENV_VAR} or ../shared/data/spa-eng if present, else download)",
    )
    parser.add_argument("--dest", type=Path, default=Path("data/spa-eng"), help="output directory")
    parser.add_argument("--url", default=SPA_ENG_URL, help="URL of the Anki spa-eng.zip")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    source = args.source if args.source is not None else default_source()
    try:
        fetch_spa_eng(args.dest, source=source, url=args.url)
    except (NmtError, OSError) as e:  # OSError: the destination cannot be written
        print(f"error: {e}", file=sys.stderr)
        return 1
    origin = f"copied from {source}" if source is not None else f"downloaded from {args.url}"
    counts = []
    for split in SPLITS:
        with (args.dest / f"{split}.tsv").open("rb") as f:
            counts.append(f"{split} {sum(1 for _ in f):,}")
    print(f"spa-eng {origin} into {args.dest}: {', '.join(counts)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
