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
from typing import TYPE_CHECKING, NamedTuple

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

    @property
    def label(self) -> str:
        return self.path if self.hub_path is None else f"{self.hub_path}[{self.hub_name}]:{self.split}"


class Malformed(NamedTuple):
    kind: str  # what the end-of-pass summary counts
    detail: str  # what the per-line warning says


def check_line(raw: bytes) -> tuple[str, str] | Malformed:
    """Parse one ``src<TAB>tgt`` line into a pair, or say why it is malformed."""
    raw = raw.rstrip(b"\n").rstrip(b"\r")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Malformed("undecodable", f"undecodable bytes (not UTF-8) at byte {e.start}")
    fields = line.split("\t")
    if len(fields) != 2:
        return Malformed(
            "wrong column count",
            f"expected 2 tab-separated columns (source<TAB>target), found {len(fields)}",
        )
    src, tgt = fields[0].strip(), fields[1].strip()
    if not src or not tgt:
        side = "source" if not src else "target"
        return Malformed("empty side", f"empty {side} side")
    return src, tgt


def read_tsv(path: str, strict: bool = False, why_strict: str = "data.strict=true") -> Iterator[dict]:
    """Yield ``{"src", "tgt"}`` from a TSV file, reporting malformed lines by file:line.

    Bad lines are skipped, logged (the first few verbatim) and summarised at the end
    of the pass; ``strict`` turns the first one into a ``CorpusError`` that ends with
    ``(why_strict)``.
    """
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{path}: corpus file not found")
    problems: Counter[str] = Counter()
    n_ok = 0
    quiet = str(p.resolve()) in _REPORTED
    with p.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):  # a "UTF-8 with BOM" export (Excel, Notepad)
                raw = raw[len(codecs.BOM_UTF8) :]
            parsed = check_line(raw)
            if isinstance(parsed, Malformed):
                msg = f"{path}:{lineno}: {parsed.detail}"
                if strict:
                    raise CorpusError(f"{msg} ({why_strict})")
                problems[parsed.kind] += 1
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
        raise CorpusError(f"{path}: no valid source<TAB>target line in the file")


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

    return datasets.IterableDataset.from_generator(read_tsv, gen_kwargs={"path": spec.path, "strict": spec.strict})


def load_pairs(spec: CorpusSpec, limit: int = 0, why_strict: str = "data.strict=true") -> list[tuple[str, str]]:
    """Read a small split (valid/test) into memory, at most ``limit`` pairs (0 = all); a TSV file directly
    (``read_tsv``: no ``datasets`` import for a list in memory), a Hub split through ``stream_pairs``.
    ``why_strict``: what a malformed line's error names as the reason (with ``spec.strict``)."""
    pairs = []
    rows = stream_pairs(spec) if spec.hub_path is not None else read_tsv(spec.path, spec.strict, why_strict)
    for row in rows:
        pairs.append((row["src"], row["tgt"]))
        if limit and len(pairs) >= limit:
            break
    if not pairs:
        raise CorpusError(f"{spec.label}: split is empty")
    return pairs
