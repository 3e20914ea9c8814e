from __future__ import annotations

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


@pytest.mark.parametrize("model_type,joint", [("unigram", True), ("bpe", False)])
def test_roundtrip_and_serialisation(sample_dir, tmp_path, model_type, joint):
    cfg = tokenizer_cfg(tmp_path, model_type=model_type, joint=joint)
    tok = build_tokenizer(cfg, CorpusSpec(str(sample_dir / "train.tsv")))
    assert tok.joint == joint
    again = Tokenizer.from_state_dict(tok.state_dict())
    text = "¿Dónde está la estación?"
    ids = again.encode_tgt([text])[0]
    assert ids and again.decode_tgt([ids])[0] == text
