"""``python -m nmt.average output=avg.pt checkpoints=[a.pt,b.pt]`` or ``run_dir=DIR last=N``.

Averages the weights of several checkpoints of one run (Junczys-Dowmunt et al. 2016;
Vaswani et al. 2017): a cheap, often +0.5-1 BLEU ensemble that costs one model at
decoding time. The result keeps the first checkpoint's tokenizer and config and no
optimiser state: it is for translating, not for resuming.
"""

from __future__ import annotations

import logging

import torch
from omegaconf import DictConfig

from nmt import checkpoint
from nmt.cli import command
from nmt.config import register_configs
from nmt.errors import ConfigError
from nmt.rundir import RunDir

log = logging.getLogger("nmt.average")
register_configs()


def average(paths: list[str]) -> dict:
    """The mean of the checkpoints' floating-point weights; all must share model config and vocabulary."""
    if not paths:
        raise ConfigError("nothing to average: give checkpoints=[A,B,...] or run_dir=DIR")
    first = checkpoint.load(paths[0])
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    for p in paths[1:]:
        ck = checkpoint.load(p)
        for part in ("encoder", "attention", "decoder"):
            if ck["config"][part] != first["config"][part]:
                raise ConfigError(f"{p}: its {part} config differs from {paths[0]} (one model's checkpoints only)")
        if ck["tokenizer"] != first["tokenizer"]:
            raise ConfigError(f"{p}: another vocabulary than {paths[0]}")
        for k, v in ck["model"].items():
            if v.is_floating_point():
                total[k] += v.double()
    model = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v for k, v in total.items()}
    return {"model": model, "tokenizer": first["tokenizer"], "config": first["config"], "averaged_from": paths}


def newest(run_dir: str, n: int) -> list[str]:
    """The paths of the run's newest ``n`` step_N.pt checkpoints, oldest first."""
    found = RunDir(run_dir).step_checkpoints()
    if not found:
        raise ConfigError(f"{run_dir}/checkpoints has no step_N.pt files (trainer.keep_last keeps them)")
    return [str(p) for _, p in found[-n:]]


@command("average")
def main(cfg: DictConfig) -> None:
    paths = list(cfg.checkpoints) or (newest(cfg.run_dir, cfg.last) if cfg.run_dir else [])
    checkpoint.save(cfg.output, average(paths))  # atomic, as every checkpoint
    log.info("averaged %d checkpoints into %s: %s", len(paths), cfg.output, ", ".join(paths))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
