"""Data: corpus sources, subword tokenizer, batching, and fetching the default corpus.

``build_*`` here are the only functions that read the ``data``/``tokenizer`` config.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from nmt.data.corpus import CorpusError, CorpusSpec, check_layout, read_tsv, stream_pairs
from nmt.data.tokenizer import Tokenizer, file_fingerprint, train_or_load
from nmt.errors import ConfigError

log = logging.getLogger(__name__)


DEFAULT_DIR = Path("data/spa-eng")  # the one folder that is filled with the default corpus on first use
SPLIT_FILES = "train.tsv and valid.tsv (source<TAB>target, UTF-8, one pair per line)"
TRAINING_SPLITS = ("train", "valid")  # what a run reads; test.tsv is for nmt.evaluate, never read in training


def prepare_corpus(data: Any) -> None:
    """Make sure the local TSV splits a run reads (train, valid) exist. Only the default ``data.dir``
    (data/spa-eng) is ever filled (with the default corpus and its test split, when ``data.fetch``); any
    other folder must already hold the files, and nothing is created at a path that may be a typo."""
    from nmt.data.fetch import corpus_ready, ensure_spa_eng  # lazy: keeps `-m nmt.data.fetch` clean

    if data.source != "tsv":
        return
    d = Path(data.dir)
    files = [d / getattr(data, s) for s in TRAINING_SPLITS]
    if all(f.is_file() for f in files):
        return
    default = d.resolve() == DEFAULT_DIR.resolve()
    if data.fetch and default and (not d.exists() or not any(d.iterdir())):
        log.info("%s is empty: fetching the default English-Spanish corpus (python -m nmt.data.fetch)", d)
        try:
            ensure_spa_eng(d)
        except (OSError, RuntimeError, CorpusError) as e:
            raise CorpusError(
                f"{d}: no corpus and fetching failed ({e}); run "
                f"`python -m nmt.data.fetch --from DIR --dest {d}` or set data.dir=DIR"
            ) from e
        if corpus_ready(d):
            return
    if not d.is_dir():
        raise CorpusError(
            f"data.dir={data.dir}: no such folder; it must hold {SPLIT_FILES}"
            + (
                ""
                if default
                else f" (only {DEFAULT_DIR} is filled automatically: `python -m nmt.data.fetch --dest {d}`)"
            )
        )
    missing = next(f for f in files if not f.is_file())
    raise CorpusError(
        f"{missing}: corpus file not found (data.dir={data.dir} must hold {SPLIT_FILES}); put the files there "
        f"or run `python -m nmt.data.fetch --dest {d}`"
    )


_CHECKED: set[tuple[str, int, int]] = set()  # (path, size, mtime) of the files check_corpus read whole


def check_corpus(specs: dict[str, CorpusSpec]) -> None:
    """Before torch, sentencepiece and training: the first lines of the TSV train and valid files must read as
    the config says (``check_layout``: one line on how to read a file whose every line has, e.g., a third
    column), and under data.strict=true every line of train must (0.2 s for 10^5 lines). ``nmt.train`` checks
    before importing torch and the run checks again (torchrun's ranks, in-process callers): an unchanged file
    is read whole once."""
    for split in TRAINING_SPLITS:
        if specs[split].hub_path is None:
            check_layout(specs[split].path, specs[split].columns)
    train = specs["train"]
    if train.hub_path is not None or not train.strict:
        return
    st = Path(train.path).stat()
    key = (str(Path(train.path).resolve()), st.st_size, st.st_mtime_ns)
    if key in _CHECKED:
        return
    for _ in read_tsv(train.path, strict=True, columns=train.columns):
        pass
    _CHECKED.add(key)


def build_specs(data: Any) -> dict[str, CorpusSpec]:
    """One ``CorpusSpec`` per split (train/valid/test) from the ``data`` config section."""
    columns = tuple(data.columns) if data.get("columns") else None  # .get: configs saved before the key
    common = dict(src_lang=data.src_lang, tgt_lang=data.tgt_lang, strict=data.strict, columns=columns)
    if data.source == "hub":
        if not data.hub_path:
            raise ConfigError("data.source=hub needs data.hub_path (e.g. Helsinki-NLP/opus-100)")
        splits = {"train": data.train_split, "valid": data.valid_split, "test": data.test_split}
        return {
            k: CorpusSpec(path=data.hub_path, hub_path=data.hub_path, hub_name=data.hub_name, split=v, **common)
            for k, v in splits.items()
        }
    if data.source != "tsv":
        raise ConfigError(f"data.source={data.source!r} is unknown; choose tsv or hub")
    return {s: CorpusSpec(path=str(Path(data.dir) / getattr(data, s)), **common) for s in ("train", "valid", "test")}


def corpus_id(train: CorpusSpec) -> str:
    """What names the training text in the sentencepiece cache key: the file's fingerprint (or the Hub split),
    the languages, and which TSV columns are source and target (data.columns; unset adds nothing, so caches of
    earlier versions stay valid), since [1,0] swaps what the source and target models learn from."""
    name = (
        f"hub:{train.hub_path}:{train.hub_name}:{train.split}"
        if train.hub_path
        else f"tsv:{file_fingerprint(train.path)}"
    )
    name += f":{train.src_lang}-{train.tgt_lang}"
    if train.columns is not None:
        name += f":columns{train.columns[0]},{train.columns[1]}"
    return name


def build_tokenizer(tok: Any, train: CorpusSpec) -> Tokenizer:
    """Train sentencepiece on (a sample of) the training stream, or reuse the cached model."""
    return train_or_load(
        stream_pairs(train),
        corpus_id(train),
        tok.cache_dir,
        tok.model_type,
        tok.vocab_size,
        tok.joint,
        tok.sample_size,
        tok.character_coverage,
    )


__all__ = ["CorpusError", "CorpusSpec", "Tokenizer", "build_specs", "build_tokenizer", "check_corpus", "prepare_corpus"]
