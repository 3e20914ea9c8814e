"""Everything about a run directory: where its files live, which run (``run_to_resume``) and which
checkpoint to resume from, what a resume may change (``RESUME_MAY_CHANGE``), and how a file is written so
that a kill at any moment leaves the previous version whole. No torch here: ``nmt.train`` finds the run
to resume before it imports the training code.

One module for this, as fairseq keeps everything about checkpoint files in ``checkpoint_utils``: the
trainer, resume discovery, ``nmt.average`` and the reports ask a ``RunDir`` instead of globbing
``step_N.pt`` themselves, and every file the toolkit must never leave half-written (checkpoints, the
sentencepiece cache, the fetched corpus) goes through :func:`atomic_write`.

A run directory (Hydra's ``outputs/DATE/TIME/``, or ``hydra.run.dir``)::

    .hydra/overrides.yaml   the command line's overrides (written by Hydra)
    train.log               the log
    metrics.jsonl           one JSON object per logged step and validation
    attention/              attention heatmaps
    checkpoints/last.pt     everything, to resume
    checkpoints/best.pt     weights only, to translate
    checkpoints/averaged.pt weights only: the mean of the newest ``trainer.average_last`` step_N.pt
    checkpoints/step_N.pt   the newest ``trainer.keep_last``, to resume from or to average
    finished.json           what the end of the run wrote (``nmt.finishing``), so a resume that trains no
                            further step does not redo it
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from nmt.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

_STEP_FILE = re.compile(r"step_(\d+)\.pt")


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Create or replace ``path`` with what ``write(file)`` writes, all or nothing; returns ``path``.

    The bytes go to a temporary file with a unique name in the same folder (so parallel jobs writing
    the same file never share one), are fsynced, and the temporary file is renamed over ``path``
    (atomic on POSIX), then the folder is fsynced so the rename survives a power loss. A reader, or a
    kill at any moment, sees the old file or the new one, never a half one; on any failure the
    temporary file is removed and the error raised. The file gets the usual permissions from the
    umask (``open``, not ``mkstemp``, whose files are private)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # folders cannot be opened on some platforms (Windows): the rename is all we get
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_name(step: int) -> str:
    """The file name of the checkpoint of step ``step`` (``step_N.pt``)."""
    return f"step_{step}.pt"


def no_checkpoint(path: str | Path, key: str = "checkpoint") -> str:
    """Why ``path`` is not a checkpoint file, in one line: not found, or a folder (a run directory or its
    ``checkpoints/``), with the checkpoints in it to choose from, best.pt first, ready to paste as ``key``."""
    from nmt.config import override, shell_quote

    given = Path(path)
    if not given.is_dir():
        return f"{path}: checkpoint not found"
    folder = given / "checkpoints" if (given / "checkpoints").is_dir() else given
    first = {"best.pt": 0, "averaged.pt": 1, "last.pt": 2}

    def rank(f: Path) -> tuple[int, int]:
        m = re.fullmatch(r"step_(\d+)\.pt", f.name)
        return first.get(f.name, 3), -int(m.group(1)) if m else 0

    found = sorted(folder.glob("*.pt"), key=rank)
    if not found:
        return f"{path}: a folder with no checkpoint (*.pt) in it; give a checkpoint file"
    names = ", ".join(f.name for f in found[:5]) + (", ..." if len(found) > 5 else "")
    example = shell_quote(override(key, found[0]))
    return f"{path}: a folder, not a checkpoint file; give one of its checkpoints ({names}), e.g. {example}"


def training_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` names an existing checkpoint a training run wrote for itself (``checkpoints/`` best.pt,
    last.pt or step_N.pt): resumed from, or its chosen model. By name, without loading it (no torch)."""
    p = Path(path)
    run = RunDir(p.parent.parent)
    own = (run.best, run.last, *(q for _, q in run.step_checkpoints()))
    return p.is_file() and p.parent == run.checkpoints and p in own


class RunDir:
    """The files of one training run under ``root`` (see the module docstring for the layout).

    Nothing is created or read when constructed: a RunDir of a folder that does not exist yet is fine.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"
        self.last = self.checkpoints / "last.pt"
        self.best = self.checkpoints / "best.pt"
        self.averaged = self.checkpoints / "averaged.pt"
        self.metrics = self.root / "metrics.jsonl"
        self.log = self.root / "train.log"
        self.attention = self.root / "attention"
        self.finished = self.root / "finished.json"

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and self.root == other.root

    def __hash__(self) -> int:
        return hash(self.root)

    def write_checkpoint(self, name: str, state: dict[str, Any]) -> Path:
        """Write ``checkpoints/NAME`` atomically (``checkpoint.save``); returns its path."""
        from nmt import checkpoint  # lazy, as below: torch, which fetch and the tokenizer cache never need

        path = self.checkpoints / name
        checkpoint.save(path, state)
        return path

    def write_finished(self, record: dict[str, Any]) -> Path:
        """Write ``finished.json`` atomically: what the end of the run wrote and at which step (``nmt.finishing``)."""
        return atomic_write(self.finished, lambda f: f.write(json.dumps(record, indent=1).encode()))

    def read_finished(self) -> dict[str, Any] | None:
        """``finished.json``'s record, or None when there is none or it cannot be read (the run is then
        finished again, which loses nothing)."""
        try:
            record = json.loads(self.finished.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("%s: not readable (%s); the end of the run is done again", self.finished, e)
            return None
        return record if isinstance(record, dict) else None

    def step_checkpoints(self) -> list[tuple[int, Path]]:
        """``[(step, path)]`` of the ``step_N.pt`` files, oldest step first (step_2 before step_10)."""
        if not self.checkpoints.is_dir():
            return []
        found = ((_STEP_FILE.fullmatch(p.name), p) for p in self.checkpoints.iterdir())
        return sorted((int(m.group(1)), p) for m, p in found if m and p.is_file())

    def prune(self, keep_last: int) -> list[Path]:
        """Delete all ``step_N.pt`` files but the newest ``keep_last``; returns the deleted paths."""
        steps = self.step_checkpoints()
        old = [p for _, p in steps[: max(0, len(steps) - keep_last)]]
        for p in old:
            p.unlink(missing_ok=True)  # another process may have pruned it already
        return old

    def _candidates(self) -> list[Path]:
        """The checkpoints to resume from, in order of preference: last.pt, then step_N.pt newest first."""
        newest_steps = [p for _, p in reversed(self.step_checkpoints())]
        return [self.last, *newest_steps] if self.last.is_file() else newest_steps

    def held_checkpoints(self) -> list[Path]:
        """Every checkpoint file the run folder holds (``*.pt`` in ``checkpoints/``): what a fresh run started
        in the same folder would overwrite (best.pt, last.pt) or mix with (step_N.pt, averaged.pt)."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(p for p in self.checkpoints.iterdir() if p.suffix == ".pt" and p.is_file())

    def refuse_fresh_run(self, named: str, elsewhere: str = "hydra.run.dir") -> str | None:
        """The one line that refuses a fresh run (no ``trainer.resume``) in this folder when it holds checkpoints,
        which that run would overwrite; ``named``: how the user named the folder (``hydra.run.dir=runs/a``);
        ``elsewhere``: the key that gives another folder."""
        held = self.held_checkpoints()
        if not held:
            return None
        names = ", ".join(p.name for p in held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        return (
            f"{named} already holds a run's checkpoints ({names}), which a fresh run would overwrite: add "
            f"trainer.resume=true to continue that run, or give another {elsewhere} to start a new one"
        )

    def is_resumable(self) -> bool:
        """Whether a checkpoint to resume from exists (cheap: nothing is loaded, so it may be damaged)."""
        return bool(self._candidates())

    def resumable(self, map_location: Any = "cpu") -> tuple[Path, dict] | None:
        """The newest loadable checkpoint of the run and its contents: last.pt, else the step_N.pt
        files, newest first. A damaged file is skipped with a warning; None when none loads."""
        from nmt import checkpoint

        for path in self._candidates():
            try:
                return path, checkpoint.load(path, map_location=map_location)
            except CheckpointError as e:
                log.warning("%s; falling back to an older checkpoint", e)
        return None

    def newest_mtime(self) -> float:
        """Modification time of the newest checkpoint to resume from (0 without one)."""
        times = []
        for p in self._candidates():
            try:
                times.append(p.stat().st_mtime)
            except OSError:  # removed meanwhile (pruned by a running job)
                pass
        return max(times, default=0.0)

    def holds_only_hydra_files(self) -> bool:
        """Whether the folder holds nothing but what Hydra writes for every command (``.hydra/``, the log):
        a command that stopped before any work left nothing of its own here."""
        return self.root.is_dir() and {p.name for p in self.root.iterdir()} <= {".hydra", self.log.name}

    def remove_if_unused(self, empty_parents: int = 0) -> bool:
        """Delete the folder when it holds only Hydra's files (see above), then up to ``empty_parents`` of its
        parents that are left empty (Hydra's ``outputs/DATE/`` and ``outputs/``, for a folder it named);
        returns whether it was deleted. Close a file log into it first."""
        if not self.holds_only_hydra_files():
            return False
        shutil.rmtree(self.root, ignore_errors=True)
        remove_empty_parents(self.root, empty_parents)
        return True

    def overrides(self) -> list[str]:
        """The command-line overrides the run was started with (Hydra's ``.hydra/overrides.yaml``), or []."""
        from omegaconf import OmegaConf

        f = self.root / ".hydra" / "overrides.yaml"
        if not f.is_file():
            return []
        try:
            found = OmegaConf.to_container(OmegaConf.load(f))
        except Exception as e:  # yaml's and OmegaConf's errors share no base class
            raise ConfigError(f"{f}: not readable as Hydra's list of overrides ({str(e).splitlines()[0]})") from e
        if not isinstance(found, list):
            raise ConfigError(f"{f}: expected Hydra's list of overrides, found a {type(found).__name__}")
        return [str(o) for o in found]


def remove_empty_parents(path: Path, levels: int) -> None:
    """Delete up to ``levels`` parents of the removed ``path`` that are left empty, nearest first (Hydra's
    ``outputs/DATE/`` and ``outputs/``, or ``multirun/DATE/`` and ``multirun/``)."""
    for parent in path.parents[:levels]:
        try:
            parent.rmdir()
        except OSError:  # not empty (other runs, other days): kept, and so are the ones above it
            break


def discover_runs(base: str | Path) -> list[RunDir]:
    """Every run directory at any depth under ``base`` (e.g. ``outputs/DATE/TIME/``, or a sweep's
    ``multirun/DATE/TIME/N/``) with a checkpoint to resume from, newest checkpoint first."""
    base = Path(base)
    if not base.is_dir():
        return []
    runs = [RunDir(c.parent) for c in base.rglob("checkpoints") if c.is_dir()]
    stamped = [(r.newest_mtime(), r) for r in runs if r.is_resumable()]
    return [r for _, r in sorted(stamped, key=lambda tr: tr[0], reverse=True)]


def disk_usage(path: str | Path) -> int:
    """Bytes the files under ``path`` (or the file ``path``) occupy on disk, like ``du``: allocated
    blocks, a file with several hard links counted once, symbolic links not followed."""
    path = Path(path)
    files = [path] if path.is_file() else list(path.rglob("*"))
    seen, total = set(), 0
    for p in files:
        st = p.lstat()
        if p.is_symlink() or not p.is_file() or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
    return total


# ---- resuming: what a resume may change, and which run trainer.resume=true without hydra.run.dir means ----

# Keys that may change between an interrupted run and its resumption without being named in
# trainer.allow_changes: limits, where it runs, how it logs, and implementation choices that do not
# change the maths (trainer.amp: the weights and optimiser state are float32 under every precision, and
# auto may choose differently on another CPU). Entries ending in "." are prefixes.
# The trainer.* keys that decide what the end of a run writes (nmt.finishing; finished.json records them).
FINISHING_KEYS = (
    "average_last",
    "tune_decoding",
    "tune_beam_sizes",
    "tune_length_penalties",
    "tune_min_bleu",
    "shortlist",
    "shortlist_frequent",
    "shortlist_per_source",
)
RESUME_MAY_CHANGE = (
    "model.rnn_impl",
    "trainer.amp",
    "trainer.amp_cache",
    "trainer.allocator",
    "trainer.resume",
    "trainer.allow_changes",
    "trainer.max_steps",
    "trainer.max_minutes",
    "trainer.max_epochs",
    "trainer.patience",
    "trainer.log_every",
    "trainer.log_seconds",
    "trainer.plot_attention",
    "trainer.tensorboard",
    "trainer.checkpoint_minutes",
    "trainer.restart_minutes",
    "trainer.threads",
    *(f"trainer.{k}" for k in FINISHING_KEYS),  # these act only once training has ended
    "device",
    "data.dir",
    "data.num_workers",
    "tokenizer.cache_dir",
    "wandb.",
)


def may_change(key: str, allowed: tuple[str, ...]) -> bool:
    return any(key == x or (x.endswith(".") and key.startswith(x)) for x in allowed)


def command_key(overrides: list[str]) -> list[str]:
    """What identifies a run's command: its overrides, less Hydra's own and those a resume may change."""
    keep = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if not key.startswith("hydra.") and not may_change(key, RESUME_MAY_CHANGE):
            keep.append(o)
    return sorted(keep)


def run_to_resume(overrides: list[str], base: Path, fresh: Path) -> RunDir:
    """The newest resumable run under ``base`` (e.g. ``outputs/``) started with the same command
    (overrides, less limits/device/logging), for ``trainer.resume=true`` without ``hydra.run.dir``.
    ``fresh`` is the folder Hydra just made for this invocation. Otherwise a ConfigError listing them."""
    mine = command_key(overrides)
    runs = [r for r in discover_runs(base) if r.root.resolve() != fresh.resolve()]
    for r in runs:
        if command_key(r.overrides()) == mine:
            return r
    if not runs:
        raise ConfigError(
            f"trainer.resume=true: no run under {base}/ has a checkpoint to resume; "
            "give hydra.run.dir=RUN_DIR of the run to continue"
        )
    listed = "; ".join(f"{r.root} ({' '.join(r.overrides()) or 'no overrides'})" for r in runs[:10])
    raise ConfigError(
        f"trainer.resume=true: no run under {base}/ was started with these overrides ({' '.join(mine) or 'none'}); "
        f"resumable runs, newest first: {listed}. Give hydra.run.dir=ONE_OF_THEM (and its overrides)"
    )
