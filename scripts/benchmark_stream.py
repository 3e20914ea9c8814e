"""The training batch pipeline alone, as the DataLoader worker runs it: milliseconds of one process per batch.

    python scripts/benchmark_stream.py [--batches 600] [--rounds 3] [--data data/spa-eng]
    python scripts/benchmark_stream.py --sample-alpha 0.5 --word-dropout 0.1   # cpu_best's regularisers
    for i in 1 2 3; do for c in /tmp/old /work/main; do PYTHONPATH=$c python $c/scripts/benchmark_stream.py; done; done

The worker reads the corpus (datasets' shuffle buffer), tokenises buckets with sentencepiece, cuts them into
token-budget batches and pads them into tensors (nmt.data.batching.BatchStream), on one of the same cores the
training step uses: on 2 cores every millisecond it spends per batch is taken from the step's threads. This times
``BatchStream.epoch_batches`` in this process, with model R's data settings (joint unigram 8k pieces, max_len 50,
max_tokens 2,000, the default bucket and shuffle buffer), after one untimed batch (which reads the first
bucket); ``--rounds`` passes over the same first ``--batches`` batches, and the median. ``--sample-alpha`` and
``--word-dropout`` add the regularisers the worker draws per pair (tokenizer.sample_alpha over the whole lattice,
data.src_word_dropout and tgt_word_dropout alike), as the ``cpu_best`` preset trains. Then the same stream
through a DataLoader with one worker, as nmt.train builds it: the worker process's CPU time per batch
(/proc/PID/stat), which adds handing each batch's tensors to the training process. To compare code changes, run
it from checkouts of both commits in turn, alternating (the second command above; an older checkout without
this script runs this one with its own ``nmt`` first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

import torch
from omegaconf import OmegaConf

from nmt.calibrate import cpu_name
from nmt.config import DataConfig, TokenizerConfig
from nmt.data import build_tokenizer
from nmt.data.batching import BatchStream, worker_context, worker_init
from nmt.data.corpus import CorpusSpec
from nmt.data.subwords import Sampling


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_ms_per_batch(stream: BatchStream, batches: int) -> float:
    """CPU milliseconds per batch of the one DataLoader worker that builds ``stream`` (as nmt.runner does)."""
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=None,
        num_workers=1,
        prefetch_factor=8,
        worker_init_fn=worker_init,
        multiprocessing_context=worker_context(),
    )
    it = iter(loader)
    for _ in range(20):  # the worker has started, read the first bucket and filled its prefetch queue
        next(it)
    pid = it._workers[0].pid
    start = cpu_seconds(pid)
    for _ in range(batches):
        next(it)
    used = cpu_seconds(pid) - start
    del it
    return 1000 * used / batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", default="data/spa-eng")
    ap.add_argument("--sample-alpha", type=float, default=0.0, help="subword sampling's alpha (0: off)")
    ap.add_argument("--word-dropout", type=float, default=0.0, help="source and target word dropout")
    args = ap.parse_args()
    spec = CorpusSpec(f"{args.data}/train.tsv")
    # model R's tokenizer and batches are the schema's defaults (configs/experiment/model_r.yaml), cache included
    tok = build_tokenizer(OmegaConf.structured(TokenizerConfig), spec)
    d = DataConfig()
    regularisers = {"sampling": Sampling(args.sample_alpha, -1), "word_dropout": (args.word_dropout,) * 2}
    stream = BatchStream(
        spec, tok.state_dict(), d.max_len, d.max_tokens, d.bucket_size, d.shuffle_buffer, seed=1, **regularisers
    )
    per_batch = []
    for _ in range(args.rounds):
        batches = stream.epoch_batches(tok, 0)
        next(batches)
        start = time.perf_counter()
        pairs = sum(b.src.size(0) for b in itertools.islice(batches, args.batches))
        per_batch.append((time.perf_counter() - start) / args.batches)
    ms = statistics.median(per_batch) * 1000
    rounds = " / ".join(f"{1000 * s:.2f}" for s in per_batch)
    print(f"{cpu_name()}: {ms:.2f} ms per batch (rounds {rounds}), {pairs / args.batches:.0f} pairs per batch")
    print(f"DataLoader worker: {worker_ms_per_batch(stream, args.batches):.2f} CPU ms per batch")


if __name__ == "__main__":
    main()
