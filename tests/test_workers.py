"""How many processes a decoding command uses (nmt.translator.resolve_workers)."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from nmt.errors import NmtError
from nmt.search import Hypothesis
from nmt.translator import AUTO_MAX, Translation, Workers, resolve_workers


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

    def translate(self, texts, return_attention=False):
        if "die" in texts:
            os._exit(3)
        time.sleep(0.3)  # long enough for the other processes to take the other shares
        att = torch.ones(1, 2) if return_attention else None
        return [Translation(f"{t.upper()}@{os.getpid()}", Hypothesis([], 0.0, 0.0, att), [], [], []) for t in texts]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="several decoding processes need Linux (fork)")
def test_shares_go_to_separate_processes_and_come_back_in_order():
    texts = [f"line {i}" for i in range(7)]
    with Workers(Upper(), 3) as w:
        out = w.translate(texts, return_attention=True)
    assert [t.text.split("@")[0] for t in out] == [x.upper() for x in texts]
    pids = {t.text.split("@")[1] for t in out}
    assert len(pids) >= 2 and str(os.getpid()) not in pids  # a pool's process may take two shares
    assert all(isinstance(t.hypothesis.attention, torch.Tensor) for t in out)  # back as tensors


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="several decoding processes need Linux (fork)")
def test_a_process_that_dies_ends_the_command_with_one_line_not_a_hang():
    with pytest.raises(NmtError, match="a decoding process died"), Workers(Upper(), 2) as w:
        w.translate(["fine", "also fine", "die", "never"])
