"""``python -m nmt.average output=avg.pt checkpoints=[a.pt,b.pt]`` or ``run_dir=DIR last=N``.

Averages the weights of several checkpoints of one run (Junczys-Dowmunt et al. 2016;
Vaswani et al. 2017): a cheap, often +0.5-1 BLEU ensemble that costs one model at
decoding time. The result keeps the first checkpoint's tokenizer and config and no
optimiser state: it is for translating, not for resuming.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from nmt.cli import check_paths, command
from nmt.config import register_configs
from nmt.errors import ConfigError
from nmt.rundir import RunDir, training_checkpoint

# Startup: only the launcher is imported up front (a mistake answers in about a second); torch and
# the checkpoint code come in when there is something to average.

log = logging.getLogger("nmt.average")
register_configs()


def newest(run_dir: str, n: int) -> list[str]:
    """The paths of the run's newest ``n`` step_N.pt checkpoints, oldest first."""
    found = RunDir(run_dir).step_checkpoints()
    if not found:
        raise ConfigError(f"{run_dir}/checkpoints has no step_N.pt files (trainer.keep_last keeps them)")
    if len(found) < n:
        log.warning("last=%d: %s/checkpoints has only %d step_N.pt; averaging those", n, run_dir, len(found))
    return [str(p) for _, p in found[-n:]]


@command("average")
def main(cfg: DictConfig) -> None:
    paths = list(cfg.checkpoints) or (newest(cfg.run_dir, cfg.last) if cfg.run_dir else [])
    check_paths(paths, (), [cfg.output])  # before torch: missing files, and output= one of the averaged
    if training_checkpoint(cfg.output):  # replaced by weights only: resume (last.pt) or the run's choice (best.pt) lost
        beside = Path(cfg.output).parent / f"averaged_{len(paths)}.pt"
        raise ConfigError(
            f"output={cfg.output} is a checkpoint of its training run, which the average (weights only, for "
            f"translating) would replace; write it beside them, e.g. output={beside}"
        )
    import torch

    from nmt import checkpoint

    torch.set_grad_enabled(False)
    checkpoint.save(cfg.output, checkpoint.average(paths))  # atomic, as every checkpoint
    if len(paths) == 1:
        log.warning("one checkpoint: %s holds its weights unchanged (an average needs two or more)", cfg.output)
    log.info("averaged %d checkpoint(s) into %s: %s", len(paths), cfg.output, ", ".join(paths))


if __name__ == "__main__":
    main()
