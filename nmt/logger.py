"""Where metrics go: ``metrics.jsonl`` in the run directory (always) and wandb (when enabled).

wandb is imported only when a run uses it, so machines without it (or without a
network) train the same; with no API key the run is logged offline and can be
uploaded later with ``wandb sync``.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import uuid
from pathlib import Path
from typing import Any

from nmt.errors import ConfigError

log = logging.getLogger(__name__)


def wandb_mode(mode: str) -> str:
    """Resolve ``auto``: online when an API key is configured, else offline."""
    if mode != "auto":
        if mode not in ("online", "offline", "disabled"):
            raise ConfigError(f"wandb.mode={mode!r} is unknown; choose auto, online, offline or disabled")
        return mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError):
        pass
    return "offline"


class RunLogger:
    def __init__(self, run_dir: Path, config: dict, wandb_cfg: Any, resume: bool, tensorboard: bool = False):
        """``tensorboard``: also write every record's numbers as TensorBoard scalars in ``run_dir/tensorboard``
        (a resumed run adds an event file there; TensorBoard reads them as one run)."""
        self.path = run_dir / "metrics.jsonl"
        self.run = None
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # lazy: the package is optional

            self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            log.info("tensorboard: logging to %s (tensorboard --logdir %s)", run_dir / "tensorboard", run_dir)
        mode = wandb_mode(wandb_cfg.mode)
        if mode != "disabled":
            import wandb  # lazy: optional at run time

            run_id = self._run_id(run_dir, resume)
            try:
                self.run = wandb.init(
                    project=wandb_cfg.project,
                    entity=wandb_cfg.entity,
                    name=wandb_cfg.name or run_dir.name,
                    dir=str(run_dir),
                    config=config,
                    mode=mode,
                    resume="allow" if resume else None,
                    id=run_id,
                    settings=wandb.Settings(silent=bool(getattr(wandb_cfg, "quiet", True))),
                )
            except (wandb.errors.UsageError, wandb.errors.CommError, wandb.errors.AuthenticationError) as e:
                # no API key for mode=online, or wandb's servers unreachable: one line, not wandb's traceback
                raise ConfigError(
                    f"wandb.mode={mode}: {e} (wandb.mode=offline logs into the run directory, `wandb sync` "
                    "uploads it later; wandb.mode=disabled turns wandb off)"
                ) from None
            (run_dir / ".wandb_id").write_text(run_id)  # once wandb has the run: a failed start leaves no id file
            log.info(
                "wandb: logging %s (mode=%s)", "online" if mode == "online" else "to " + str(run_dir / "wandb"), mode
            )

    @staticmethod
    def _run_id(run_dir: Path, resume: bool) -> str:
        """Keep one wandb run per run directory, so a resumed run continues its curves: the id saved in the
        run directory (written once wandb.init succeeded), else a new one."""
        id_file = run_dir / ".wandb_id"
        if resume and id_file.is_file():
            return id_file.read_text().strip()
        return uuid.uuid4().hex[:12]

    def log(self, record: dict, step: int, to_file: bool = True) -> None:
        """A record to every sink; ``to_file=False``: not to metrics.jsonl, which holds one line per validation."""
        if to_file:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.run is not None:
            self.run.log(record, step=step)
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, step)

    def log_images(self, images: dict[str, Path], step: int) -> None:
        """PNG files (already saved in the run directory) → wandb and TensorBoard, when they are on."""
        if self.run is not None and images:
            import wandb

            self.run.log({k: wandb.Image(str(v)) for k, v in images.items()}, step=step)
        if self.tb is not None and images:
            import numpy as np
            from PIL import Image  # a dependency of tensorboard (and of matplotlib, which drew them)

            for k, v in images.items():
                with Image.open(v) as im:
                    self.tb.add_image(k, np.asarray(im.convert("RGB")), step, dataformats="HWC")

    def finish(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.run is not None:
            self.run.finish()
