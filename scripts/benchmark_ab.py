"""Interleaved A/B of runtime settings of model R's training step, in one process.

    python scripts/benchmark_ab.py --settings fp32,bf16,bf16+fused --batches 40
    python scripts/benchmark_ab.py --model cpu_small --settings fp32,enc_eager,eager   # RNN implementations

Every batch is trained once under every setting, the settings taking turns step by step (their
order reversed on every other batch), so drift of the machine and the batch mix hit all alike;
prints target tokens/s per setting. Settings join flags with "+": ``bf16`` (both RNNs' loop
products and the vocabulary projection in bf16, through Seq2Seq.set_matmul_dtype, as trainer.amp=bf16
on an AMX CPU; otherwise float32), ``fused`` (fused Adam; otherwise PyTorch's default, a loop over
tensors on CPU), ``eager`` (both RNNs computed as model.rnn_impl=eager: the encoder by nn.GRU over
packed sequences; otherwise the CPU default, loop) or ``enc_eager`` (the encoder only; same weights
and maths, so they can take turns), ``plain_tanh`` (torch.tanh everywhere; otherwise the model's own,
nmt.models.rnn.tanh_kernel: 2σ(2x) − 1 where it measured faster). ``--model`` is a model of
scripts/benchmark.py or a preset, ``cpu_small`` or ``cpu_best`` (fused Adam as always). To compare code changes, run
it with one setting from checkouts of both commits in turn (``git worktree add``), several times, alternating; the same
for a setting that holds for a whole process, given as a config override with ``--set``:

    for i in 1 2 3; do for a in auto system; do
        python scripts/benchmark_ab.py --model cpu_small --settings bf16+fused --set trainer.allocator=$a
    done; done
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from benchmark import MODELS, NmtRun

from nmt.models.rnn import RNN

PRESETS = {**MODELS, "cpu_small": ["experiment=cpu_small"], "cpu_best": ["experiment=cpu_best"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="r", choices=sorted(PRESETS))
    ap.add_argument("--settings", default="fp32,bf16,bf16+fused")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--data", default="data/spa-eng")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (repeatable)")
    args = ap.parse_args()
    overrides = [*PRESETS[args.model], *args.set]
    run = NmtRun(args.model, overrides, SimpleNamespace(device="cpu", data=args.data, warmup=4))
    trainer = run.trainer
    settings = args.settings.split(",")
    model_tanh = trainer.model.decoder.tanh

    def apply(setting: str) -> None:
        flags = set(setting.split("+"))
        trainer.model.set_matmul_dtype(torch.bfloat16 if "bf16" in flags else None)
        for group in trainer.opt.param_groups:
            group["fused"] = "fused" in flags or None
        for m in trainer.model.modules():
            if hasattr(m, "tanh"):  # the RNNs, the decoder, the attention
                m.tanh = torch.tanh if "plain_tanh" in flags else model_tanh
            if isinstance(m, RNN):
                is_encoder = m is trainer.model.encoder.rnn
                m.impl = "eager" if "eager" in flags or ("enc_eager" in flags and is_encoder) else "loop"

    batches = [next(run.loader) for _ in range(args.batches)]
    seconds = dict.fromkeys(settings, 0.0)
    for k, b in enumerate(batches):
        for s in settings if k % 2 == 0 else settings[::-1]:
            apply(s)
            t0 = time.perf_counter()
            trainer.train_step([b])
            seconds[s] += time.perf_counter() - t0
    tokens = sum(b.n_tgt_tokens for b in batches)
    for s in settings:
        print(f"{s}: {tokens / seconds[s]:,.0f} target tok/s")


if __name__ == "__main__":
    main()
