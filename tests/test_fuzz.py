"""Property tests: any corpus line and any translate-time input is handled, nothing is lost."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from helpers import tokenizer_cfg
from nmt.config import TrainConfig
from nmt.data import build_tokenizer
from nmt.data.corpus import CorpusSpec, Malformed, check_line, read_tsv
from nmt.models.build import build_model
from nmt.search import SearchOptions
from nmt.translate import one_line
from nmt.translator import Translator


@given(st.binary(max_size=200))
def test_check_line_never_raises(raw):
    got = check_line(raw)
    if not isinstance(got, Malformed):
        src, tgt = got
        assert src and tgt and "\t" not in src + tgt and src == src.strip() and tgt == tgt.strip()


good = st.text(
    alphabet=st.characters(blacklist_characters="\t\n\r", blacklist_categories=("Cs",)), min_size=1, max_size=40
).filter(lambda s: s.strip())


def encode(line: tuple[str, str] | bytes) -> bytes:
    return f"{line[0]}\t{line[1]}".encode() if isinstance(line, tuple) else line.replace(b"\n", b" ")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.tuples(good, good), st.binary(max_size=30)), min_size=1, max_size=30))
def test_no_valid_pair_is_lost(tmp_path, lines):
    """Every well-formed line comes out exactly once, in order; everything else is skipped, never a crash."""
    raw = b"".join(encode(x) + b"\n" for x in lines)
    path = tmp_path / "fuzz.tsv"
    path.write_bytes(raw)
    expected = [r for r in (check_line(x) for x in raw.split(b"\n")[:-1]) if not isinstance(r, Malformed)]
    try:
        got = [(r["src"], r["tgt"]) for r in read_tsv(str(path))]
    except ValueError as e:  # only when no line at all is valid
        assert not expected and "no valid" in str(e)
        return
    assert got == expected
    assert len(got) >= sum(isinstance(x, tuple) for x in lines)


@pytest.fixture(scope="module")
def translator(sample_dir, tmp_path_factory):
    tok = build_tokenizer(
        tokenizer_cfg(tmp_path_factory.mktemp("spm"), vocab_size=150, sample_size=500),
        CorpusSpec(str(sample_dir / "train.tsv")),
    )
    cfg = OmegaConf.structured(TrainConfig)
    cfg.attention.name = "bahdanau"
    cfg.encoder.update(emb_size=8, hidden_size=8)
    cfg.decoder.update(emb_size=8, hidden_size=16)
    torch.manual_seed(0)
    model = build_model(cfg.encoder, cfg.attention, cfg.decoder, tok.src_vocab_size, tok.tgt_vocab_size)
    return Translator(model, tok, torch.device("cpu"), SearchOptions(beam_size=2, max_len_ratio=0.5), max_input_len=64)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.text(max_size=300), st.just(""), st.just("   "), st.just("\x00\x07\x1b[31m"), st.just("x" * 10_000)
        ),
        min_size=1,
        max_size=6,
    )
)
def test_translate_gives_one_line_per_input(translator, texts):
    out = translator.translate(texts)
    assert len(out) == len(texts)
    for src, t in zip(texts, out):
        assert "\n" not in one_line(t.text)
        if not src.strip():
            assert t.text == ""
