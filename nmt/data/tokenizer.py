"""Sentencepiece subwords: training on a bounded sample of the stream, caching, (de)serialising.

The trained model travels inside every checkpoint (as bytes), so translation never
depends on the cache or on the training corpus being present.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt.data.subwords import Sampling, sampler_for
from nmt.errors import ConfigError
from nmt.machine import usable_cpus
from nmt.rundir import atomic_write

log = logging.getLogger(__name__)

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # fixed ids, so models and batches agree without lookups


class Tokenizer:
    """Source and target sentencepiece models (the same object twice when joint)."""

    def __init__(self, src_proto: bytes, tgt_proto: bytes | None = None):
        self.src_proto = src_proto
        self.tgt_proto = tgt_proto if tgt_proto is not None else src_proto
        self.joint = tgt_proto is None or tgt_proto == src_proto
        self.src = spm.SentencePieceProcessor(model_proto=self.src_proto)
        self.tgt = self.src if self.joint else spm.SentencePieceProcessor(model_proto=self.tgt_proto)
        self._samplers: tuple | None = None  # (source, target) samplers, built on the first sample_pairs

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return self.src.encode(texts)

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        return self.tgt.encode(texts)

    def sample_pairs(
        self, srcs: list[str], tgts: list[str], sampling: Sampling, seed: int
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Both sides of a set of training pairs, each segmentation sampled (see Sampling).

        Every random choice comes from ``np.random.default_rng(seed)`` (sources first, then targets),
        never from sentencepiece's own generator, so the same ``seed`` gives the same pieces in any
        process: a resumed run re-segments its current epoch exactly as the interrupted one did.
        """
        if self._samplers is None:
            src = sampler_for(self.src)
            self._samplers = (src, src if self.joint else sampler_for(self.tgt))
        rng = np.random.default_rng(seed)
        return self._samplers[0].sample(srcs, sampling, rng), self._samplers[1].sample(tgts, sampling, rng)

    def src_pieces(self, text: str) -> list[str]:
        return self.src.encode(text, out_type=str)

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        return [self.tgt.id_to_piece(i) for i in ids]

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return self.tgt.decode(ids)

    def state_dict(self) -> dict:
        return {"src": self.src_proto, "tgt": None if self.joint else self.tgt_proto}

    @classmethod
    def from_state_dict(cls, state: dict) -> Tokenizer:
        return cls(state["src"], state["tgt"])


def cache_key(corpus_id: str, settings: dict) -> str:
    """Stable key for a corpus + tokenizer settings, so a second run reuses the model."""
    blob = json.dumps({"corpus": corpus_id, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def file_fingerprint(path: str) -> str:
    """Content hash of a local corpus file (cheap next to training: ~20 ms for spa-eng)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _train_one(
    lines: Iterable[str], prefix: Path, model_type: str, vocab_size: int, character_coverage: float
) -> bytes:
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        n = 0
        for line in lines:
            f.write(line.replace("\n", " ") + "\n")
            n += 1
        text_path = f.name
    try:
        spm.SentencePieceTrainer.train(
            input=text_path,
            model_prefix=str(prefix),
            model_type=model_type,
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            hard_vocab_limit=False,  # small corpora (tests, sample/) get a smaller vocabulary, not an error
            num_threads=usable_cpus(),
            minloglevel=2,
        )
    except RuntimeError as e:  # sentencepiece's "Vocabulary size is smaller than required_chars. 10 vs 61. ..."
        if (m := re.search(r"required_chars\. \d+ vs (\d+)", str(e))) is None:
            raise
        raise ConfigError(
            f"tokenizer.vocab_size={vocab_size}: too small for this corpus, whose characters and special pieces "
            f"need at least {m[1]}; raise tokenizer.vocab_size or lower tokenizer.character_coverage "
            f"(now {character_coverage})"
        ) from None
    finally:
        os.unlink(text_path)
    log.info("trained sentencepiece %s (%d pieces) on %d lines", prefix.name, vocab_size, n)
    return prefix.with_suffix(".model").read_bytes()


def train_or_load(
    pairs: Iterable[dict],
    corpus_id: str,
    cache_dir: str,
    model_type: str = "unigram",
    vocab_size: int = 8000,
    joint: bool = True,
    sample_size: int = 300000,
    character_coverage: float = 1.0,
) -> Tokenizer:
    """Return the cached tokenizer for this corpus + settings, training it on first use.

    ``pairs`` is only consumed on a cache miss, and at most ``sample_size`` pairs of it.
    """
    if model_type not in ("unigram", "bpe"):
        raise ConfigError(f"tokenizer.model_type: expected unigram or bpe, got {model_type!r}")
    settings = dict(
        model_type=model_type,
        vocab_size=vocab_size,
        joint=joint,
        sample_size=sample_size,
        character_coverage=character_coverage,
    )
    root = Path(os.path.expanduser(cache_dir)) / cache_key(corpus_id, settings)
    src_file, tgt_file = root / "src.model", root / "tgt.model"
    if src_file.is_file() and (joint or tgt_file.is_file()):
        log.info("reusing sentencepiece model from %s", root)
        return Tokenizer(src_file.read_bytes(), None if joint else tgt_file.read_bytes())

    srcs, tgts = [], []
    for i, row in enumerate(pairs):
        if i >= sample_size:
            break
        srcs.append(row["src"])
        tgts.append(row["tgt"])
    if not srcs:
        raise ConfigError(f"{corpus_id}: no sentence pairs to train sentencepiece on")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        if joint:
            src_proto = _train_one(srcs + tgts, Path(tmp) / "joint", model_type, vocab_size, character_coverage)
            tgt_proto = None
        else:
            src_proto = _train_one(srcs, Path(tmp) / "src", model_type, vocab_size, character_coverage)
            tgt_proto = _train_one(tgts, Path(tmp) / "tgt", model_type, vocab_size, character_coverage)
        # Atomic, with unique temp names: a crash never leaves a half model that later runs would trust,
        # and parallel jobs (a sweep) training the same tokenizer at once each replace the file whole.
        # src.model last, as the cache test above reads it as "complete".
        for proto, dest in ((tgt_proto, tgt_file), (src_proto, src_file)):
            if proto is not None:
                atomic_write(dest, lambda f, proto=proto: f.write(proto))
    settings_json = json.dumps({"corpus": corpus_id, **settings}, indent=1).encode()
    atomic_write(root / "settings.json", lambda f: f.write(settings_json))
    return Tokenizer(src_proto, tgt_proto)
