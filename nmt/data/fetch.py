"""Fetch the default English→Spanish corpus into a local directory.

The toolkit trains on ``data/spa-eng/{train,valid,test}.tsv`` (UTF-8, one
``English<TAB>Spanish`` pair per line).  Those files are not kept in git, so
this module creates them, preferring a prepared copy beside the checkout
(``../shared/data/spa-eng``: no network needed, and everyone gets identical
splits) and otherwise downloading the Tatoeba/Anki export and splitting it
deterministically.

Command line::

    python -m nmt.data.fetch [--from DIR] [--dest data/spa-eng] [--url URL]
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
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

SPA_ENG_URL = "http://storage.googleapis.com/download.tensorflow.org/data/spa-eng.zip"
"""TensorFlow tutorial mirror of the manythings.org/anki export of Tatoeba.

manythings.org itself refuses scripted downloads, the mirror does not.
"""

SPLITS = ("train", "valid", "test")
"""Split names; each is stored as ``<name>.tsv``."""

SOURCE_ENV_VAR = "NMT_SPA_ENG_SOURCE"
"""Environment variable naming a directory with prepared split files."""

DOWNLOAD_TIMEOUT_S = 60.0
"""Socket timeout for the download, so a machine without network fails fast."""

# Files that describe a prepared corpus (licence, attribution, checksums);
# copied along with the splits when present so the attribution travels with
# the data and ``sha256sum -c SHA256SUMS`` still works in the copy.
_EXTRA_FILES = ("README.md", "SHA256SUMS", "ATTRIBUTION.tsv.gz")
_SAMPLE_DIR = "sample"

# Invisible characters that make otherwise equal sentences differ.
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))

Pair = tuple[str, str]


def corpus_ready(directory: Path) -> bool:
    """Return True when all split files exist and are non-empty.

    Used to decide whether a fetch is needed: an empty or missing file means
    an earlier fetch never finished (files are written atomically, so a
    present non-empty file is complete).
    """
    directory = Path(directory)
    for split in SPLITS:
        path = directory / f"{split}.tsv"
        if not path.is_file() or path.stat().st_size == 0:
            return False
    return True


def default_source() -> Path | None:
    """Return the first prepared corpus directory that can be copied, or None.

    Looks at ``$NMT_SPA_ENG_SOURCE``, then ``../shared/data/spa-eng`` relative
    to the current directory and to the repository root (the parent of the
    ``nmt`` package).  A fresh clone with the provided corpus beside it thus
    gets its data without network.  Only directories holding all split files
    count, so a half-filled directory never hides the download fallback.
    """
    candidates: list[Path] = []
    env = os.environ.get(SOURCE_ENV_VAR)
    if env:
        candidates.append(Path(env).expanduser())
    relative = Path("..") / "shared" / "data" / "spa-eng"
    candidates.append(Path.cwd() / relative)
    repo_root = Path(__file__).resolve().parents[2]
    candidates.append(repo_root / relative)
    for candidate in candidates:
        if candidate.is_dir() and corpus_ready(candidate):
            return candidate.resolve()
    if env:
        logger.warning("%s=%s holds no complete corpus; ignored", SOURCE_ENV_VAR, env)
    return None


def normalize_text(text: str) -> str:
    """Normalise one side of a pair so equal sentences compare equal.

    Unicode NFC, zero-width characters removed, every kind of whitespace
    (no-break spaces, tabs, ...) turned into one plain space, ends stripped.
    """
    text = unicodedata.normalize("NFC", text).translate(_ZERO_WIDTH)
    return " ".join(text.split())


def clean_pairs(pairs: Iterable[Pair]) -> list[Pair]:
    """Normalise pairs, drop those with an empty side and exact duplicates.

    The first occurrence of a duplicate is kept, so the order of the source
    (and therefore the split) stays deterministic.
    """
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
    logger.info(
        "cleaned pairs: %d kept, %d with an empty side, %d duplicates",
        len(kept),
        empty,
        duplicates,
    )
    return kept


def read_anki_zip(path_or_bytes: str | os.PathLike[str] | bytes) -> list[Pair]:
    """Read the ``(English, Spanish)`` pairs of an Anki ``spa-eng.zip``.

    Takes a path or the zip's bytes (so tests need no network).  Only the
    first two tab-separated columns are kept: newer exports add a third
    attribution column.  Lines with fewer than two columns are skipped.
    The text is returned as found; :func:`clean_pairs` normalises it.
    """
    data = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with zipfile.ZipFile(data) as archive:
        members = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "spa.txt"]
        if not members:
            raise ValueError(f"no spa.txt in zip (members: {archive.namelist()})")
        text = archive.read(members[0]).decode("utf-8")
    pairs: list[Pair] = []
    skipped = 0
    # split("\n"), not splitlines(): the latter also breaks on U+2028 etc.,
    # which may occur inside a sentence.
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
        logger.warning("skipped %d lines with fewer than two columns", skipped)
    return pairs


def _group_key(english: str) -> str:
    return " ".join(english.casefold().split())


def split_pairs(
    pairs: list[Pair],
    valid_size: int = 2000,
    test_size: int = 2000,
    seed: int = 20261121,
) -> dict[str, list[Pair]]:
    """Split pairs into train/valid/test with no English sentence in two splits.

    Pairs are grouped by their English side (case-folded, whitespace
    collapsed), so all translations of one sentence land in the same split
    and valid/test measure generalisation rather than recall.  The groups
    are shuffled with ``random.Random(seed)``; whole groups go to valid until
    it has at least ``valid_size`` pairs, then to test likewise, and the rest
    is train.  valid/test keep the group order (translations of a sentence
    stay adjacent, handy for multi-reference scoring); train is shuffled pair
    by pair with ``seed + 1`` so it is not ordered by length or group.
    The result depends only on the input order and the seed.
    """
    groups: dict[str, list[Pair]] = {}
    for pair in pairs:
        groups.setdefault(_group_key(pair[0]), []).append(pair)
    ordered = list(groups.values())
    random.Random(seed).shuffle(ordered)

    result: dict[str, list[Pair]] = {split: [] for split in SPLITS}
    targets = (("valid", valid_size), ("test", test_size))
    index = 0
    for split, size in targets:
        while index < len(ordered) and len(result[split]) < size:
            result[split].extend(ordered[index])
            index += 1
    for group in ordered[index:]:
        result["train"].extend(group)
    random.Random(seed + 1).shuffle(result["train"])
    return result


def _atomic_write_bytes(path: Path, writer: Callable[[BinaryIO], object]) -> None:
    """Write via a temporary file in the same directory, then ``os.replace``.

    A reader (or :func:`corpus_ready`) never sees a half-written file, even
    if the process is killed mid-way.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique name opened with "xb" (not mkstemp, whose files are mode 0600)
    # so the result gets the usual permissions from the umask.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("xb") as handle:
            writer(handle)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_pairs(path: Path, pairs: list[Pair]) -> None:
    for en, es in pairs:
        if any(ch in field for field in (en, es) for ch in "\t\n\r"):
            raise ValueError(f"tab or newline inside a field: {(en, es)!r}")
    data = "".join(f"{en}\t{es}\n" for en, es in pairs).encode("utf-8")
    _atomic_write_bytes(path, lambda handle: handle.write(data))


def _copy_file(src: Path, dst: Path) -> None:
    # copyfileobj, not copy2: the shared corpus is read-only and its mode
    # should not make the local copy read-only too.
    with src.open("rb") as source:
        _atomic_write_bytes(dst, lambda handle: shutil.copyfileobj(source, handle))


def _copy_corpus(source: Path, dest: Path) -> None:
    names = [f"{split}.tsv" for split in SPLITS]
    names += [name for name in _EXTRA_FILES if (source / name).is_file()]
    for name in names:
        _copy_file(source / name, dest / name)
    sample = source / _SAMPLE_DIR
    if sample.is_dir():
        for path in sorted(sample.iterdir()):
            if path.is_file():
                _copy_file(path, dest / _SAMPLE_DIR / path.name)
    logger.info("copied corpus from %s to %s", source, dest)


def _download(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "nmt-fetch/1"})
    logger.info("downloading %s", url)
    try:
        with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
            return response.read()
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError, timeouts, bad URL
        raise RuntimeError(
            f"could not download {url}: {exc}. Without network, pass "
            "--from DIR (a directory with train.tsv, valid.tsv and test.tsv, "
            f"e.g. ../shared/data/spa-eng) or set ${SOURCE_ENV_VAR}."
        ) from exc


def fetch_spa_eng(
    dest: Path,
    source: Path | None = None,
    url: str = SPA_ENG_URL,
    valid_size: int = 2000,
    test_size: int = 2000,
    seed: int = 20261121,
) -> Path:
    """Fill ``dest`` with ``train.tsv``, ``valid.tsv`` and ``test.tsv``; return ``dest``.

    With ``source`` (a directory holding the three split files) the files are
    copied, together with a ``sample/`` subfolder and the README, checksums
    and attribution when present: the prepared splits are the reference
    everyone compares on.  Without it, the Anki zip at ``url`` is downloaded,
    cleaned (:func:`clean_pairs`) and split (:func:`split_pairs`); the result
    is deterministic for a given download and seed.  All files are written
    atomically.

    Raises FileNotFoundError if ``source`` lacks a split file, RuntimeError if
    the download fails.
    """
    dest = Path(dest)
    if source is not None:
        source = Path(source)
        if not corpus_ready(source):
            raise FileNotFoundError(f"{source} does not hold non-empty {', '.join(f'{s}.tsv' for s in SPLITS)}")
        _copy_corpus(source, dest)
        return dest

    data = _download(url)
    try:
        raw = read_anki_zip(data)
    except (zipfile.BadZipFile, ValueError) as exc:
        raise RuntimeError(f"{url} did not serve an Anki spa-eng zip: {exc}") from exc
    splits = split_pairs(clean_pairs(raw), valid_size=valid_size, test_size=test_size, seed=seed)
    for split in SPLITS:
        _write_pairs(dest / f"{split}.tsv", splits[split])
    logger.info(
        "wrote %s: %s",
        dest,
        ", ".join(f"{split} {len(splits[split])}" for split in SPLITS),
    )
    return dest


def ensure_spa_eng(dest: Path) -> Path:
    """Return ``dest``, fetching the corpus first if it is not there yet.

    For training code that fetches on first use: copies from
    :func:`default_source` when one exists, else downloads.
    """
    dest = Path(dest)
    if not corpus_ready(dest):
        fetch_spa_eng(dest, source=default_source())
    return dest


def _count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; prints one summary line."""
    parser = argparse.ArgumentParser(
        prog="python -m nmt.data.fetch",
        description="Fill a directory with the spa-eng train/valid/test TSV files.",
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
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    origin = f"copied from {source}" if source is not None else f"downloaded from {args.url}"
    counts = ", ".join(f"{s} {_count_lines(args.dest / f'{s}.tsv'):,}" for s in SPLITS)
    print(f"spa-eng {origin} into {args.dest}: {counts} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
