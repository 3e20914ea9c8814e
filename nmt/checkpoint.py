"""One self-contained checkpoint file: enough to translate, and enough to resume training.

Contents: model weights, optimiser, scheduler, step/epoch/stream position, RNG states,
early-stopping state, the sentencepiece model(s) and the resolved config. Files are
written atomically (temp file, fsync, rename), so a kill at any moment leaves the
previous checkpoint loadable.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from nmt.errors import CheckpointError

FORMAT = "nmt-checkpoint"
VERSION = 1
REQUIRED = ("format", "version", "model", "tokenizer", "config")


def save(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "version": VERSION, **payload}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and check a checkpoint, turning every failure into a one-line ``CheckpointError``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        # weights_only=False: the payload holds plain Python containers, RNG byte tensors and the
        # config dict; only load checkpoints you trust, as with any pickle-based format.
        ckpt = torch.load(path, map_location=map_location, weights_only=False)
    except (
        RuntimeError,
        EOFError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
        ValueError,
        UnicodeDecodeError,
        OSError,
    ) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt?): {reason}") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an nmt checkpoint (no '{FORMAT}' format marker)")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {ckpt.get('version')}, this nmt reads version {VERSION}"
        )
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return ckpt


def weights_only(state: dict) -> dict:
    """TEMPORARY"""
    return {k: state[k] for k in ("model", "tokenizer", "config", "progress") if k in state}
