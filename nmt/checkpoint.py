"""One self-contained checkpoint file: enough to translate, and enough to resume training.

Contents: model weights, optimiser, scheduler, step/epoch/stream position, RNG states,
early-stopping state, the sentencepiece model(s) and the resolved config (``best.pt`` keeps
only what translating needs: ``weights_only``). Files are written atomically
(``nmt.rundir.atomic_write``), so a kill at any moment leaves the previous checkpoint loadable.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from nmt.errors import CheckpointError, ConfigError
from nmt.rundir import atomic_write, no_checkpoint

FORMAT = "nmt-checkpoint"
VERSION = 1
TRANSLATE_KEYS = ("model", "tokenizer", "config")  # enough to rebuild the model and translate
REQUIRED = ("format", "version", *TRANSLATE_KEYS)


def save(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` (with the format marker and version) to ``path`` atomically (``nmt.rundir.atomic_write``)."""
    payload = {"format": FORMAT, "version": VERSION, **payload}
    atomic_write(path, lambda f: torch.save(payload, f))


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and check a checkpoint, turning every failure into a one-line ``CheckpointError``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(no_checkpoint(path))
    unreadable = f"{path}: not a readable checkpoint (truncated or corrupt?)"
    if not zipfile.is_zipfile(path):
        # torch.save writes a zip archive; anything else (a truncated file, random bytes) would go to
        # torch.load's legacy pickle reader, which can fail on garbage in any way, MemoryError included.
        raise CheckpointError(f"{unreadable}: not a zip archive")
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
        MemoryError,  # unpickling garbage inside the archive: a length field read as gigabytes
        OverflowError,
    ) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{unreadable}: {reason}") from e
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


def weights_only(state: dict[str, Any]) -> dict[str, Any]:
    """The part of a training ``state`` that translating needs: model weights, tokenizer and config
    (``REQUIRED``), plus ``progress`` (step, epoch, best BLEU) when present, so a report can say where the
    weights come from. No optimiser, scheduler, scaler or RNG states: ``best.pt`` is written with it
    at about a third of a full checkpoint's size (Adam keeps two moments per weight), and
    ``nmt.translate``/``nmt.evaluate``/``nmt.average`` load it as they load a full one. It cannot be
    resumed from (``Trainer`` needs the optimiser), which is why ``RunDir.resumable`` never offers it."""
    missing = [k for k in TRANSLATE_KEYS if k not in state]
    if missing:
        raise KeyError(f"weights_only: the state lacks {', '.join(missing)}")
    return {k: state[k] for k in (*TRANSLATE_KEYS, "progress") if k in state}


def average(paths: list[str]) -> dict:
    """The mean of the checkpoints' floating-point weights; all must share model config and vocabulary.

    Checkpoint averaging (Junczys-Dowmunt et al. 2016; Vaswani et al. 2017): the result keeps the first
    checkpoint's tokenizer and config and no optimiser state (for translating, not resuming). The one
    implementation, used by ``python -m nmt.average`` and by ``trainer.average_last`` at a run's end.
    """
    if not paths:
        raise ConfigError("nothing to average: give checkpoints=[A,B,...] or run_dir=DIR")
    first = load(paths[0])
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    for p in paths[1:]:
        ck = load(p)
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
