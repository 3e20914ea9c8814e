"""Data-parallel plumbing: the process group torchrun describes, and the few collectives the loop needs.

Why a small object instead of calls sprinkled through the trainer: in a single process every
method is the identity, so the training loop has one code path whether it runs on one CPU or
on many GPUs, and everything that talks across ranks is in this file.

torchrun sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; without them the run is a plain
single process. NCCL is used when the run's device is CUDA, gloo otherwise.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# How long a rank waits in a collective before giving up. Rank 0 validates while the others
# wait in a broadcast, so this must exceed the longest validation.
TIMEOUT = datetime.timedelta(hours=1)


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


@dataclass(frozen=True)
class Dist:
    """This process's place in the job. ``Dist()`` is a single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    active: bool = False  # a process group exists (torchrun, even with world size 1)
    device: torch.device = torch.device("cpu")  # where collective tensors live (CUDA for NCCL)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks (stop flags, elapsed time, epoch)."""
        return self._all_reduce(values, dist.ReduceOp.MAX)

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (token counts, loss sums)."""
        return self._all_reduce(values, dist.ReduceOp.SUM)

    def _all_reduce(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def init_distributed(device: torch.device) -> tuple[Dist, torch.device]:
    """Join torchrun's process group (if launched by it); returns this rank's view and device.

    On CUDA each local rank takes the GPU of its own number, so ``device=cuda`` means
    "my GPU" under torchrun.
    """
    if not launched_by_torchrun():
        return Dist(), device
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        # device_id binds NCCL to this rank's GPU (collectives such as barrier() then need no guess:
        # without it torch 2.11 warned "barrier(): using the device under current context" on an H200)
        dist.init_process_group(backend, timeout=TIMEOUT, device_id=device if backend == "nccl" else None)
    return Dist(rank, world, local_rank, True, device if backend == "nccl" else torch.device("cpu")), device


def shutdown(d: Dist) -> None:
    if d.active and dist.is_initialized():
        dist.destroy_process_group()
