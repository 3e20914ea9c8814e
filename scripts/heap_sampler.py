"""Run a Python module (``python -m MODULE ARGS``) in this process with a thread that writes, every ``--every``
seconds, one JSON line to ``--out``: seconds since start, the resident set, minor/major page faults, user/system
CPU seconds (for the process and per thread) and glibc's heap (``nmt.allocator.heap_stats``). For finding where a
long training run's time goes (docs/benchmarks.md, "Where a long run's time goes: a fragmented heap"), e.g.

    python scripts/heap_sampler.py --out heap.jsonl --every 30 nmt.train experiment=cpu_best

Linux only (it reads /proc/self). The data worker is a separate process and is not sampled.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import threading
import time

import torch

from nmt import allocator


def sample(out: str, every: float) -> None:
    tick, t0 = os.sysconf("SC_CLK_TCK"), time.time()
    with open(out, "a", buffering=1) as f:
        while True:
            time.sleep(every)
            stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
            threads = {}
            for tid in os.listdir("/proc/self/task"):
                try:
                    s = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                except OSError:  # the thread ended
                    continue
                threads[tid] = {"utime": int(s[11]) / tick, "stime": int(s[12]) / tick}
            rec = {
                "t": round(time.time() - t0, 1),
                "rss_mib": int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20,
                "minflt": int(stat[7]),
                "majflt": int(stat[9]),
                "utime": int(stat[11]) / tick,
                "stime": int(stat[12]) / tick,
                **allocator.heap_stats(torch.device("cpu")),
                "threads": threads,
            }
            f.write(json.dumps(rec) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON lines file to append to")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples (default 30)")
    ap.add_argument("module", help="the module to run as __main__, e.g. nmt.train")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its command line")
    a = ap.parse_args()
    threading.Thread(target=sample, args=(a.out, a.every), daemon=True).start()
    sys.argv = [a.module, *a.args]
    runpy.run_module(a.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
