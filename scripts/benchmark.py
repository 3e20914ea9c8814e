"""Training and decoding speed of named model configs, measured the way nmt.train runs them.

    python scripts/benchmark.py [--models r,r_luong_feed,r_luong_nofeed] [--device cpu] [--json out.json]

Model R is the reference model shared with the peer recipes (../shared/peers): joint 8k
sentencepiece, embeddings 256, bi-GRU encoder 2x256, GRU decoder 512, additive attention,
Bahdanau order, dropout 0.2, ~2,000-token batches, max 50 pieces. The other two are R in
Luong order with input feeding on and off (the one-call path).

For each model: build the real data pipeline (DataLoader worker, token-budget buckets) and the
real Trainer, run --warmup steps, then --windows windows of --window-steps steps of
``Trainer.train_step`` each, and report the median over windows of target tokens/s and
source+target tokens/s, the share of step time spent waiting for the next batch, and peak
memory (CUDA allocator peak, else the process's max RSS). Then greedy and beam-5 decoding of
test.tsv in sentences/s. Prints a markdown table; --json writes everything.
Peers (--compare joey,onmt, issue 5) are not implemented yet.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

import nmt.train  # noqa: F401  (registers the config schema)
from nmt.config import to_plain
from nmt.data import build_specs, build_tokenizer, prepare_corpus
from nmt.data.batching import BatchStream, worker_init
from nmt.data.corpus import load_pairs
from nmt.logger import RunLogger
from nmt.models.build import build_model
from nmt.search import SearchOptions
from nmt.train import resolve_device
from nmt.trainer import Trainer
from nmt.translator import Translator

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "r": ["experiment=model_r"],
    "r_luong_feed": ["experiment=model_r", "decoder=luong", "decoder.input_feeding=true"],
    "r_luong_nofeed": ["experiment=model_r", "decoder=luong", "decoder.input_feeding=false"],
}


def measure(name: str, overrides: list[str], args) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(
            "config", overrides=[*overrides, f"device={args.device}", "wandb.mode=disabled", f"data.dir={args.data}"]
        )
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    prepare_corpus(cfg.data)
    specs = build_specs(cfg.data)
    tok = build_tokenizer(cfg.tokenizer, specs["train"])
    model = build_model(cfg.encoder, cfg.attention, cfg.decoder, tok.src_vocab_size, tok.tgt_vocab_size).to(device)
    run_dir = Path(tempfile.mkdtemp(prefix="nmt-bench-"))
    trainer = Trainer(
        model,
        tok,
        cfg,
        to_plain(cfg),
        run_dir,
        device,
        load_pairs(specs["valid"], limit=10),
        RunLogger(run_dir, {}, cfg.wandb, False),
    )
    stream = BatchStream(
        specs["train"],
        tok.state_dict(),
        cfg.data.max_len,
        cfg.data.max_tokens,
        cfg.data.bucket_size,
        cfg.data.shuffle_buffer,
        cfg.seed,
    )
    loader = iter(
        torch.utils.data.DataLoader(
            stream,
            batch_size=None,
            num_workers=cfg.data.num_workers,
            pin_memory=device.type == "cuda",
            prefetch_factor=8 if cfg.data.num_workers else None,
            worker_init_fn=worker_init,
        )
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.train()
    for _ in range(args.warmup):
        trainer.train_step(next(loader).to(device))
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    windows = []
    for _ in range(args.windows):
        tgt = src = 0
        wait = 0.0
        t0 = time.perf_counter()
        for _ in range(args.window_steps):
            w0 = time.perf_counter()
            b = next(loader)
            wait += time.perf_counter() - w0
            trainer.train_step(b.to(device))
            tgt += b.n_tgt_tokens
            src += int(b.src_len.sum())
        sync()
        secs = time.perf_counter() - t0
        windows.append({"tgt_tok_s": tgt / secs, "src_tgt_tok_s": (tgt + src) / secs, "data_wait": wait / secs})
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    test = [s for s, _ in load_pairs(specs["test"])][: args.decode_sentences]
    decode = {}
    model.eval()
    for beam in (1, 5):
        tr = Translator(model, tok, device, SearchOptions(beam_size=beam), max_tokens=8000)
        tr.translate(test[:64])  # warm-up
        sync()
        t0 = time.perf_counter()
        tr.translate(test)
        sync()
        decode[f"beam{beam}_sent_s"] = len(test) / (time.perf_counter() - t0)
    med = {k: statistics.median(w[k] for w in windows) for k in windows[0]}
    return {
        "model": name,
        "overrides": overrides,
        **med,
        "windows": windows,
        "peak_mib": peak,
        **decode,
        "decode_sentences": len(test),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data", default="data/spa-eng")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window-steps", type=int, default=30)
    ap.add_argument("--decode-sentences", type=int, default=2000)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [measure(m, MODELS[m], args) for m in args.models.split(",")]
    meta = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "warmup": args.warmup,
        "windows": args.windows,
        "window_steps": args.window_steps,
    }
    print(f"\n{meta}\n")
    print("| model | target tok/s | src+tgt tok/s | data wait | peak MiB | greedy sent/s | beam-5 sent/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['tgt_tok_s']:,.0f} | {r['src_tgt_tok_s']:,.0f} | {100 * r['data_wait']:.1f}% | "
            f"{r['peak_mib']:,.0f} | {r['beam1_sent_s']:,.0f} | {r['beam5_sent_s']:,.0f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
