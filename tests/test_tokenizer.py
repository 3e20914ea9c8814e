from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import tokenizer_cfg
from nmt.data import build_tokenizer
from nmt.data import tokenizer as tokmod
from nmt.data.corpus import CorpusSpec
from nmt.data.tokenizer import Tokenizer


def test_second_run_reuses_the_cached_model(sample_dir, tmp_path, monkeypatch):
    spec = CorpusSpec(str(sample_dir / "train.tsv"))
    first = build_tokenizer(tokenizer_cfg(tmp_path), spec)

    class Trained(Exception):
        pass

    def no_training(*args, **kwargs):
        raise Trained

    monkeypatch.setattr(tokmod, "_train_one", no_training)
    second = build_tokenizer(tokenizer_cfg(tmp_path), spec)  # would raise Trained if it trained again
    assert second.src_proto == first.src_proto
    with pytest.raises(Trained):  # a different setting is a different cache key
        build_tokenizer(tokenizer_cfg(tmp_path, vocab_size=150), spec)


def test_a_vocabulary_smaller_than_the_corpus_characters_is_one_line_naming_the_key(sample_dir, tmp_path):
    """sentencepiece's own RuntimeError (a C++ check and a traceback) came out of the training command."""
    from nmt.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        build_tokenizer(tokenizer_cfg(tmp_path, vocab_size=10), CorpusSpec(str(sample_dir / "train.tsv")))
    said = str(e.value)
    assert said.startswith("tokenizer.vocab_size=10: too small for this corpus, whose characters and special pieces")
    assert said.endswith("raise tokenizer.vocab_size or lower tokenizer.character_coverage (now 1.0)")
    assert "\n" not in said and int(said.split("need at least ")[1].split(";")[0]) > 10


@pytest.mark.parametrize("model_type,joint", [("unigram", True), ("bpe", False)])
def test_roundtrip_and_serialisation(sample_dir, tmp_path, model_type, joint):
    cfg = tokenizer_cfg(tmp_path, model_type=model_type, joint=joint)
    tok = build_tokenizer(cfg, CorpusSpec(str(sample_dir / "train.tsv")))
    assert tok.joint == joint
    again = Tokenizer.from_state_dict(tok.state_dict())
    text = "¿Dónde está la estación?"
    ids = again.encode_tgt([text])[0]
    assert ids and again.decode_tgt([ids])[0] == text


def test_two_jobs_writing_the_same_cache_at_once_both_get_a_loadable_model(sample_dir, tmp_path, monkeypatch):
    """Sweep jobs started together train the same tokenizer and write the same cache files at the same
    moment (a barrier lines their writes up, many times over): neither may fail or leave a half file."""
    spec = CorpusSpec(str(sample_dir / "train.tsv"))
    reference = build_tokenizer(tokenizer_cfg(tmp_path / "reference", joint=False), spec)
    barrier = threading.Barrier(2)

    def trained_at_once(lines, prefix, *args):
        barrier.wait(timeout=30)  # both jobs have trained: now both write
        return reference.src_proto if prefix.name == "src" else reference.tgt_proto

    monkeypatch.setattr(tokmod, "_train_one", trained_at_once)
    for round_ in range(25):
        cfg = tokenizer_cfg(tmp_path / f"cache{round_}", joint=False)
        with ThreadPoolExecutor(2) as pool:
            jobs = [pool.submit(build_tokenizer, cfg, spec) for _ in range(2)]
            got = [job.result(timeout=60) for job in jobs]
        assert all(t.src_proto == reference.src_proto and t.tgt_proto == reference.tgt_proto for t in got)
        (folder,) = (tmp_path / f"cache{round_}").iterdir()
        assert sorted(p.name for p in folder.iterdir()) == ["settings.json", "src.model", "tgt.model"]
        cached = Tokenizer((folder / "src.model").read_bytes(), (folder / "tgt.model").read_bytes())
        assert cached.encode_src(["Hello."]) == reference.encode_src(["Hello."])
