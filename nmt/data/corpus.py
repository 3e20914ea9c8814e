"""Corpus sources: local TSV files and Hugging Face Hub datasets, both streamed.

Both sources become a ``datasets.IterableDataset`` of ``{"src": str, "tgt": str}``
so nothing downstream cares where pairs come from, and no corpus is ever held in
memory whole. Local TSV is read by our own line reader (wrapped with
``IterableDataset.from_generator``) rather than the ``text`` builder because the
builder splits on Unicode line boundaries (``str.splitlines``), so its line numbers
would not match the file, and one undecodable byte would end the stream.
"""

from __future__ import annotations

import codecs
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from nmt.errors import CorpusError

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

MAX_REPORTED = 20  # malformed lines quoted one by one; the rest only counted
# Files whose malformed lines this process has reported already: every later pass (each epoch, the
# sentencepiece sample, a forked DataLoader worker, which inherits the set) stays quiet about them.
_REPORTED: set[str] = set()


@dataclass(frozen=True)
class CorpusSpec:
    """Where one split lives. ``path`` is a TSV file, or a Hub dataset when ``hub_path`` is set."""

    path: str
    hub_path: str | None = None
    hub_name: str | None = None
    split: str = "train"
    src_lang: str = "en"
    tgt_lang: str = "es"
    strict: bool = False
    columns: tuple[int, int] | None = None  # TSV: (source, target) column; None = exactly two columns, in that order

    @property
    def label(self) -> str:
        return self.path if self.hub_path is None else f"{self.hub_path}[{self.hub_name}]:{self.split}"


class Malformed(NamedTuple):
    kind: str  # what the end-of-pass summary counts
    detail: str  # what the per-line warning says
    columns: int = -1  # how many columns a line of the wrong column count had (-1: another problem)


def layout_hint(path: str, found: set[int], columns: tuple[int, int] | None, key: str) -> str:
    """Why no line of ``path`` could be read, when every one had the same wrong number of columns (``found``):
    the file is laid out otherwise than ``key`` (data.columns, or evaluate's columns) says. '' otherwise."""
    if len(found) != 1:
        return ""
    (n,) = found
    if columns is None and n > 2:
        return (
            f"every line has {n} tab-separated columns and {key} is unset (exactly two: source<TAB>target); "
            f"name the source and target columns, e.g. {key}=[0,1] (0-based; the manythings.org/Anki exports "
            "carry a third, attribution column)"
        )
    if columns is None and n == 1:
        return "no line has a tab (the two columns must be separated by a tab character, not spaces or commas)"
    if columns is not None:
        plural = "s" if n > 1 else ""
        return f"every line has {n} tab-separated column{plural}, too few for {key}=[{columns[0]},{columns[1]}]"
    return ""


def check_layout(path: str, columns: tuple[int, int] | None, key: str = "data.columns", lines: int = 20) -> None:
    """Read the first ``lines`` lines of a TSV file: when none of them parses and all have the same wrong
    number of columns, the file is laid out otherwise than ``key`` says, and a one-line error says how to read
    it, in a second instead of after a pass over the file (or after torch, in a DataLoader worker)."""
    found, bad = set(), 0
    with Path(path).open("rb") as f:
        for lineno, raw in _numbered_lines(f):
            if lineno > lines:
                break
            got = check_line(raw, columns)
            if not isinstance(got, Malformed):
                return  # one good line: the layout is right; bad lines are reported as they are read
            found.add(got.columns)
            bad += 1
    hint = layout_hint(path, found, columns, key)
    if bad and hint:
        raise CorpusError(f"{path}: {hint}")


def _numbered_lines(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` from 1, without the byte-order mark of a "UTF-8 with BOM" export (Excel,
    Notepad) on the first."""
    for lineno, raw in enumerate(f, 1):
        yield lineno, raw[len(codecs.BOM_UTF8) :] if lineno == 1 and raw.startswith(codecs.BOM_UTF8) else raw


def check_line(raw: bytes, columns: tuple[int, int] | None = None) -> tuple[str, str] | Malformed:
    """Parse one ``src<TAB>tgt`` line into a pair, or say why it is malformed. ``columns``: the (source,
    target) columns of a line with any number of columns (None: exactly two, in that order)."""
    raw = raw.rstrip(b"\n").rstrip(b"\r")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Malformed("undecodable", f"undecodable bytes (not UTF-8) at byte {e.start}")
    fields = line.split("\t")
    if columns is None and len(fields) != 2:
        return Malformed(
            "wrong column count",
            f"expected 2 tab-separated columns (source<TAB>target), found {len(fields)}",
            len(fields),
        )
    if columns is not None and len(fields) <= max(columns):
        return Malformed(
            "wrong column count",
            f"expected at least {max(columns) + 1} tab-separated columns (source in column {columns[0]}, target "
            f"in column {columns[1]}, from 0), found {len(fields)}",
            len(fields),
        )
    src, tgt = (fields[0], fields[1]) if columns is None else (fields[columns[0]], fields[columns[1]])
    src, tgt = src.strip(), tgt.strip()
    if not src or not tgt:
        side = "source" if not src else "target"
        return Malformed("empty side", f"empty {side} side")
    return src, tgt


def read_tsv(
    path: str,
    strict: bool = False,
    why_strict: str = "data.strict=true",
    columns: tuple[int, int] | None = None,
    columns_key: str = "data.columns",
) -> Iterator[dict]:
    """Yield ``{"src", "tgt"}`` from a TSV file, reporting malformed lines by file:line.

    Bad lines are skipped, logged (the first few verbatim) and summarised at the end
    of the pass; ``strict`` turns the first one into a ``CorpusError`` that ends with
    ``(why_strict)``. ``columns``: the (source, target) columns (``check_line``), set by ``columns_key``.
    """
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{path}: corpus file not found")
    problems: Counter[str] = Counter()
    found: set[int] = set()  # column counts of the lines with a wrong one (-1: another problem)
    n_ok = 0
    quiet = str(p.resolve()) in _REPORTED
    with p.open("rb") as f:
        for lineno, raw in _numbered_lines(f):
            parsed = check_line(raw, columns)
            if isinstance(parsed, Malformed):
                msg = f"{path}:{lineno}: {parsed.detail}"
                if strict:
                    raise CorpusError(f"{msg} ({why_strict})")
                problems[parsed.kind] += 1
                found.add(parsed.columns)
                if not quiet and sum(problems.values()) <= MAX_REPORTED:
                    log.warning("skipping malformed line %s", msg)
                continue
            n_ok += 1
            yield {"src": parsed[0], "tgt": parsed[1]}
    _REPORTED.add(str(p.resolve()))
    if problems and not quiet:
        detail = ", ".join(f"{k}: {v}" for k, v in problems.most_common())
        log.warning(
            "%s: skipped %d malformed lines of %d (%s)",
            path,
            sum(problems.values()),
            n_ok + sum(problems.values()),
            detail,
        )
    if n_ok == 0:
        hint = layout_hint(path, found, columns, columns_key)
        raise CorpusError(f"{path}: no valid source<TAB>target line in the file{': ' + hint if hint else ''}")


def _hub_pairs(spec: CorpusSpec) -> datasets.IterableDataset:
    """Stream a Hub translation dataset (``{"translation": {src_lang: .., tgt_lang: ..}}`` rows)."""
    import datasets  # lazy: translating and serving never load it

    try:
        ds = datasets.load_dataset(spec.hub_path, spec.hub_name, split=spec.split, streaming=True)
    except (OSError, ValueError) as e:  # offline / unreachable (ConnectionError), no such dataset, config or split
        raise CorpusError(
            f"data.hub_path={spec.hub_path} (data.hub_name={spec.hub_name}, split {spec.split}): {e}. A Hub dataset "
            "needs the network, or a Hugging Face cache that already holds it; or train on local TSV files: "
            "data.source=tsv data.dir=DIR"
        ) from None
    src, tgt = spec.src_lang, spec.tgt_lang

    def to_pair(row: dict) -> dict:
        tr = row["translation"]
        return {"src": (tr.get(src) or "").strip(), "tgt": (tr.get(tgt) or "").strip()}

    ds = ds.map(to_pair, remove_columns=list(ds.column_names or ["translation"]))
    # Rows with an empty side carry no signal; the Hub gives no line numbers to report.
    return ds.filter(lambda r: bool(r["src"]) and bool(r["tgt"]))


def stream_pairs(spec: CorpusSpec) -> datasets.IterableDataset:
    """The split as a streaming ``datasets.IterableDataset`` of ``{"src", "tgt"}``."""
    if spec.hub_path is not None:
        return _hub_pairs(spec)
    if not Path(spec.path).is_file():  # fail here, in the main process, not inside a worker (nor after ~3 s of imports)
        raise CorpusError(f"{spec.path}: corpus file not found")
    import datasets  # lazy: translating and serving never load it

    args = {"path": spec.path, "strict": spec.strict, "columns": spec.columns}
    return datasets.IterableDataset.from_generator(read_tsv, gen_kwargs=args)


def load_pairs(
    spec: CorpusSpec, limit: int = 0, why_strict: str = "data.strict=true", columns_key: str = "data.columns"
) -> list[tuple[str, str]]:
    """Read a small split (valid/test) into memory, at most ``limit`` pairs (0 = all); a TSV file directly
    (``read_tsv``: no ``datasets`` import for a list in memory), a Hub split through ``stream_pairs``.
    ``why_strict``: what a malformed line's error names as the reason (with ``spec.strict``)."""
    pairs = []
    if spec.hub_path is not None:
        rows = stream_pairs(spec)
    else:
        rows = read_tsv(spec.path, spec.strict, why_strict, spec.columns, columns_key)
    for row in rows:
        pairs.append((row["src"], row["tgt"]))
        if limit and len(pairs) >= limit:
            break
    if not pairs:
        raise CorpusError(f"{spec.label}: split is empty")
    return pairs
