"""How many processes a decoding command uses (nmt.translator.resolve_workers)."""

from __future__ import annotations

import sys

import torch

from nmt.translator import resolve_workers


def test_auto_is_one_process_per_cpu_thread_for_files_on_linux(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    n, why = resolve_workers(0, torch.device("cpu"))
    if sys.platform.startswith("linux"):
        assert n == 6 and "one per CPU thread" in why
    else:
        assert n == 1 and "Linux" in why
    assert resolve_workers(1, torch.device("cpu"))[0] == 1


def test_stdin_and_gpus_decode_in_one_process():
    assert resolve_workers(4, torch.device("cpu"), interactive=True) == (
        1,
        "stdin is answered line by line in this process",
    )
    n, why = resolve_workers(4, torch.device("cuda"))
    assert n == 1 and "CPU decoding" in why
