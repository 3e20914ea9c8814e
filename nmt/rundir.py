"""TEMPORARY stand-in (replaced by the rundir branch)."""

from __future__ import annotations

import logging
from pathlib import Path

from nmt import checkpoint
from nmt.errors import CheckpointError

log = logging.getLogger(__name__)


class RunDir:
    def __init__(self, root):
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"
        self.metrics = self.root / "metrics.jsonl"
        self.log = self.root / "train.log"
        self.attention = self.root / "attention"

    def write_checkpoint(self, name, state):
        path = self.checkpoints / name
        checkpoint.save(path, state)
        return path

    def step_checkpoints(self):
        return sorted((int(p.stem.split("_")[1]), p) for p in self.checkpoints.glob("step_*.pt"))

    def prune(self, keep_last):
        for _, p in self.step_checkpoints()[:-keep_last]:
            p.unlink(missing_ok=True)

    def is_resumable(self):
        return (self.checkpoints / "last.pt").is_file() or bool(self.step_checkpoints())

    def resumable(self, map_location="cpu"):
        for path in [self.checkpoints / "last.pt"] + [p for _, p in reversed(self.step_checkpoints())]:
            if not path.is_file():
                continue
            try:
                return path, checkpoint.load(path, map_location=map_location)
            except CheckpointError as e:
                log.warning("%s; falling back to an older checkpoint", e)
        return None

    def overrides(self):
        from omegaconf import OmegaConf

        f = self.root / ".hydra" / "overrides.yaml"
        return list(OmegaConf.load(f)) if f.is_file() else []


def discover_runs(base):
    base = Path(base)
    if not base.is_dir():
        return []
    runs = {RunDir(c.parent) for c in base.rglob("checkpoints") if c.is_dir()}
    runs = [r for r in runs if r.is_resumable()]
    return sorted(runs, key=lambda r: max(p.stat().st_mtime for p in r.checkpoints.iterdir()), reverse=True)


def disk_usage(path):
    seen, total = set(), 0
    for p in Path(path).rglob("*"):
        st = p.stat()
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total
