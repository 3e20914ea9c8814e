"""trainer.allocator (nmt.allocator): whether a big tensor is served from the heap, so its memory is reused."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from nmt import allocator

glibc = pytest.mark.skipif(not allocator.GLIBC, reason="trainer.allocator acts on glibc only")

# In a child process (mallopt holds for the whole process and cannot be undone): configure, then say whether a
# freshly allocated 64 MiB tensor lies inside the [heap] mapping of /proc/self/maps.
CHILD = """
import sys, torch
from nmt import allocator
print(allocator.configure(sys.argv[1], torch.device("cpu")))
ptr = torch.empty(16 << 20).data_ptr()
for line in open("/proc/self/maps"):
    if line.rstrip().endswith("[heap]"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        print("heap" if lo <= ptr < hi else "mmap")
        break
else:
    print("mmap")
"""


def where_a_big_tensor_lives(mode: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True).stdout
    said, where = out.strip().splitlines()
    return said, where


@glibc
def test_auto_serves_big_tensors_from_the_heap_and_system_leaves_malloc_alone():
    said, where = where_a_big_tensor_lives("auto")
    assert where == "heap" and "kept" in said
    said, where = where_a_big_tensor_lives("system")
    assert where == "mmap" and "trainer.allocator=system" in said


def test_auto_changes_nothing_off_the_cpu():
    assert "changes nothing" in allocator.configure("auto", torch.device("meta"))
