"""How many processes a decoding command uses (nmt.translator.resolve_workers), and what they search (Workers)."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
from omegaconf import OmegaConf

from helpers import tokenizer_cfg
from nmt.config import TrainConfig
from nmt.data import build_tokenizer
from nmt.data.batching import eval_groups
from nmt.data.corpus import CorpusSpec, read_tsv
from nmt.errors import NmtError
from nmt.models.build import build_model
from nmt.search import Hypothesis, SearchOptions
from nmt.translator import AUTO_MAX, Translation, Translator, Workers, resolve_workers

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="several decoding processes need Linux (fork)")


def test_auto_is_one_process_per_cpu_thread_for_files_on_linux(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    n, why = resolve_workers(0, torch.device("cpu"))
    if sys.platform.startswith("linux"):
        assert n == 6 and "one per CPU thread" in why
    else:
        assert n == 1 and "Linux" in why
    assert resolve_workers(1, torch.device("cpu"))[0] == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: AUTO_MAX + 1)  # a big machine: one process, as before
    assert resolve_workers(0, torch.device("cpu"))[0] == 1
    if sys.platform.startswith("linux"):
        assert resolve_workers(AUTO_MAX + 1, torch.device("cpu"))[0] == AUTO_MAX + 1  # asked for: given


def test_stdin_and_gpus_decode_in_one_process():
    assert resolve_workers(4, torch.device("cpu"), interactive=True) == (
        1,
        "stdin is answered line by line in this process",
    )
    n, why = resolve_workers(4, torch.device("cuda"))
    assert n == 1 and "CPU decoding" in why


class Upper:
    """A stand-in translator: upper-cases each line and says which process did it; "die" kills that process."""

    device = torch.device("cpu")

    def plan(self, texts):
        return [[i] for i, t in enumerate(texts) if t.strip()]  # one line per batch

    def translate(self, texts, return_attention=False):
        if "die" in texts:
            os._exit(3)
        time.sleep(0.3)  # long enough for the other processes to take the other shares
        att = torch.ones(1, 2) if return_attention else None
        return [Translation(f"{t.upper()}@{os.getpid()}", Hypothesis([], 0.0, 0.0, att), [], [], []) for t in texts]


@LINUX
def test_shares_go_to_separate_processes_and_come_back_in_order():
    texts = [f"line {i}" for i in range(7)]
    with Workers(Upper(), 3) as w:
        out = w.translate(texts, return_attention=True)
    assert [t.text.split("@")[0] for t in out] == [x.upper() for x in texts]
    pids = {t.text.split("@")[1] for t in out}
    assert len(pids) >= 2 and str(os.getpid()) not in pids  # a pool's process may take two shares
    assert all(isinstance(t.hypothesis.attention, torch.Tensor) for t in out)  # back as tensors


@LINUX
def test_a_process_that_dies_ends_the_command_with_one_line_not_a_hang():
    with pytest.raises(NmtError, match="a decoding process died"), Workers(Upper(), 2) as w:
        w.translate(["fine", "also fine", "die", "never"])


@pytest.fixture(scope="module")
def tiny(sample_dir, tmp_path_factory):
    """A small untrained model's translator whose budget cuts a few dozen lines into several search batches."""
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
    model.eval()
    texts = [pair["src"] for pair in read_tsv(str(sample_dir / "valid.tsv"))][:40]
    texts[3] = texts[17] = "  "  # blank lines form no batch and come back empty
    return Translator(model, tok, torch.device("cpu"), SearchOptions(beam_size=3, max_len_ratio=0.5), 150), texts


def test_the_plan_is_the_batches_of_translate_most_work_first(tiny):
    tr, texts = tiny
    plan = tr.plan(texts)
    assert len(plan) >= 4
    assert sorted(i for g in plan for i in g) == [i for i, t in enumerate(texts) if t.strip()]
    ids = tr.tok.encode_src(texts)
    work = [len(g) * max(len(ids[i]) for i in g) for g in plan]
    assert work == sorted(work, reverse=True)
    for g in plan:  # each batch, translated on its own, is one batch again
        assert len(eval_groups([ids[i] for i in g], None, tr._budget())) == 1


@LINUX
def test_processes_search_the_batches_one_process_would(tiny):
    tr, texts = tiny
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each decoding process runs
    try:
        one = tr.translate(texts)
    finally:
        torch.set_num_threads(threads)
    with Workers(tr, 2) as w:
        two = w.translate(texts)
    assert [t.text for t in two] == [t.text for t in one]
    assert [t.n_best for t in two] == [t.n_best for t in one]  # the same scores, bit for bit
    assert [t.hypothesis.tokens for t in two] == [t.hypothesis.tokens for t in one]
    assert two[3].text == two[17].text == "" and two[3].src_pieces == []
