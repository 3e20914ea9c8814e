"""trainer.allocator (nmt.allocator): whether a big tensor is served from the heap, so its memory is reused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO
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


# In a child process again: the heap's free memory as heap_stats reports it before and after a 64 MiB tensor,
# served from the heap under trainer.allocator=auto, is freed.
HEAP_CHILD = """
import json, torch
from nmt import allocator
allocator.configure("auto", torch.device("cpu"))
t = torch.ones(16 << 20)
held = allocator.heap_stats(torch.device("cpu"))
del t
print(json.dumps([held, allocator.heap_stats(torch.device("cpu"))]))
"""


@glibc
def test_heap_stats_see_a_freed_tensor_kept_in_the_heap():
    out = subprocess.run([sys.executable, "-c", HEAP_CHILD], capture_output=True, text=True, check=True).stdout
    held, freed = json.loads(out)
    assert set(held) == {"heap_mib", "heap_free_mib", "heap_free_chunks"}
    assert held["heap_mib"] >= 64 and freed["heap_mib"] == held["heap_mib"]  # auto keeps the memory in the heap
    assert freed["heap_free_mib"] >= held["heap_free_mib"] + 63 and freed["heap_free_chunks"] >= 1


def test_heap_stats_are_empty_off_the_cpu():
    assert allocator.heap_stats(torch.device("meta")) == {}


@pytest.mark.skipif(not allocator.GLIBC, reason="scripts/heap_sampler.py reads /proc and glibc's heap")
def test_heap_sampler_samples_a_module_run_in_its_process(tmp_path):
    out = tmp_path / "heap.jsonl"
    code = "import time; t = time.time()\nwhile time.time() - t < 0.6: pass"  # a busy 0.6 s, as __main__
    (tmp_path / "busy.py").write_text(code)
    cmd = [sys.executable, str(REPO / "scripts" / "heap_sampler.py"), "--out", str(out), "--every", "0.1", "busy"]
    subprocess.run(cmd, check=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) >= 3 and recs[-1]["t"] > recs[0]["t"]
    assert recs[-1]["utime"] >= recs[0]["utime"] and recs[-1]["rss_mib"] > 50
    assert {"heap_mib", "heap_free_mib", "heap_free_chunks", "minflt", "threads"} <= set(recs[-1])
