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

Efficiency (unless --no-efficiency; CPU only): this machine's GEMM peak in float32 and bf16 is
measured first and again after the timings, keeping the higher of each (scripts/gemm_peak.py: a
virtual machine can run slower for a while); then each model's training FLOPs per target token
are counted on a few more real batches (scripts/model_flops.py: forward + backward
products of Trainer.train_step), and a second table gives the GFLOP/s its median target tok/s
achieve, their share of each peak, and the FLOPs per output token of greedy and beam-5 decoding.

--compare joey,onmt also trains Joey NMT and OpenNMT-py on model R (installed by
scripts/install_peers.sh, configs in scripts/peers/) on nmt's own pieces and batch size, in
windows alternating with nmt's (see scripts/compare_peers.py), and prints nmt/peer ratios:

    python scripts/benchmark.py --models r --compare joey,onmt [--rounds 3 --window-seconds 60]

Then it compares decoding (scripts/decode_compare.py; --decode-rounds 0 skips it) on the models
trained there, for the same seconds each: every peer first gets as long as nmt trained before the
rounds (its --windows), unmeasured, then the same rounds of windows. nmt saves its model as
nmt.train does (checkpoints/best.pt and last.pt of a run folder, through the Trainer's saver); each
peer is told to stop and writes its own checkpoint. Each system then decodes the first
--decode-sentences lines of valid.tsv with --decode-beam (5) by its own CLI as a user runs it (nmt
with --decode-stop, exact or early: the beam search's stopping rule, nmt/search.py), as
a subprocess timed from launch to exit (start-up included): nmt.translate on raw text (amp=auto:
bf16 products where measured faster), again with float32 products (amp=none) and quantize=int8;
the peers' translate commands with sentencepiece encoding and decoding
around them (timed too, so every command takes raw text and gives detokenised text). Systems
alternate for --decode-rounds rounds (median). A second table gives BLEU (sacrebleu default),
output words, wall seconds, output words/s and nmt/peer; the int8 and float32 rows show their BLEU
change and speed-up against the nmt row. The decoding uses the first model of --models.

The decoded models stay in PEERS_HOME/runs/decode (nmt's checkpoint in nmt/best.pt, the peers' where
they saved them), named in its models.json; --decode-only decodes them again with this checkout's
nmt.translate, without training, so a decoding change is measured against the peers on the same models:

    python scripts/benchmark.py --decode-only [MODELS_JSON] [--decode-rounds 3 --json out.json]

--batch-sweep 1000,2000,4000 measures training tokens/s of every model at each token budget
(data.max_tokens) instead, without decoding, and --plot draws tokens/s against batch size:

    python scripts/benchmark.py --models r,r_luong_nofeed --batch-sweep 1000,2000,4000 --plot sweep.png
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import compare_peers
import decode_compare
import gemm_peak
import model_flops
import torch
from hydra import compose, initialize_config_dir

from nmt import checkpoint
from nmt.config import register_configs, to_plain
from nmt.data import build_specs, build_tokenizer, prepare_corpus
from nmt.data.corpus import load_pairs
from nmt.distributed import Dist
from nmt.models.build import model_from_config
from nmt.rundir import RunDir
from nmt.runner import build_loader
from nmt.runtime import resolve_device
from nmt.search import SearchOptions
from nmt.training import build_shortlist, build_trainer
from nmt.translator import Translator

REPO = Path(__file__).resolve().parents[1]
register_configs()  # the typed schema behind configs/config.yaml, as nmt.train registers it
MODELS = {
    "r": ["experiment=model_r"],
    "r_fp32": ["experiment=model_r", "trainer.amp=none"],
    "r_bf16": ["experiment=model_r", "trainer.amp=bf16"],  # forced (CPU: bf16 products; CUDA: bf16 autocast)
    "r_luong_feed": ["experiment=model_r", "decoder=luong", "decoder.input_feeding=true"],
    "r_luong_nofeed": ["experiment=model_r", "decoder=luong", "decoder.input_feeding=false"],
}
FLOP_BATCHES = 8  # real training batches whose train_step FLOPs are counted (extra updates, after the timings)
FLOP_SENTENCES = 100  # test sentences whose decoding FLOPs are counted (the counter slows decoding down)


def corpus_and_tokenizer(overrides: list[str], args):
    """The composed training config, corpus splits and (cached) sentencepiece model, as nmt.train makes them."""
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(
            "config", overrides=[*overrides, f"device={args.device}", "wandb.mode=disabled", f"data.dir={args.data}"]
        )
    prepare_corpus(cfg.data)
    specs = build_specs(cfg.data)
    return cfg, specs, build_tokenizer(cfg.tokenizer, specs["train"])


class NmtRun:
    """One model through the real pipeline and Trainer.train_step, measured in windows."""

    def __init__(self, name: str, overrides: list[str], args):
        cfg, self.specs, self.tok = corpus_and_tokenizer(overrides, args)
        tok = self.tok
        self.name, self.overrides, self.cfg = name, overrides, cfg
        self.device = device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        self.model = model_from_config(cfg, tok.src_vocab_size, tok.tgt_vocab_size, device)
        self.model.to(device)
        self.rundir = RunDir(tempfile.mkdtemp(prefix="nmt-bench-"))
        valid = load_pairs(self.specs["valid"], limit=10)
        self.trainer = build_trainer(cfg, to_plain(cfg), self.model, tok, valid, self.rundir, device, Dist(), None)
        t = self.trainer  # the stream starts where the trainer's progress says (fresh), as in nmt.train
        self.loader = build_loader(cfg, self.specs["train"], tok, device, t.shards, t.num_shards, t.data_starts())
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.windows: list[dict] = []
        self.steps, self.trained_s = args.warmup, 0.0  # updates in all; seconds in windows (not the warm-up)
        self.model.train()
        for _ in range(args.warmup):
            self.trainer.train_step([next(self.loader).to(device)])
        self.sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def window(self, steps: int = 0, seconds: float = 0.0) -> dict:
        """Train ``steps`` steps, or for ``seconds`` (whole steps), and record the rates."""
        tgt = src = n = 0
        wait = 0.0
        t0 = time.perf_counter()
        while (steps and n < steps) or (seconds and time.perf_counter() - t0 < seconds):
            w0 = time.perf_counter()
            b = next(self.loader)
            wait += time.perf_counter() - w0
            self.trainer.train_step([b.to(self.device)])
            self.trainer.progress.positions[b.shard] = [b.epoch, b.index]  # for the checkpoint (see save)
            tgt += b.n_tgt_tokens
            src += int(b.src_len.sum())
            n += 1
        self.sync()
        secs = time.perf_counter() - t0
        self.steps, self.trained_s = self.steps + n, self.trained_s + secs
        w = {
            "tgt_tok_s": tgt / secs,
            "src_tgt_tok_s": (tgt + src) / secs,
            "data_wait": wait / secs,
            "tgt_tokens_per_update": tgt / n,
            "updates": n,
        }
        self.windows.append(w)
        return w

    def save(self) -> Path:
        """The weights trained so far, saved as nmt.train saves them (the Trainer's saver: ``last.pt`` and
        the weights-only ``best.pt`` in the run folder, with tokenizer and config); returns best.pt."""
        p = self.trainer.progress
        p.step, p.elapsed_s = self.steps, self.trained_s
        self.trainer.save(best=True)
        if not self.rundir.best.is_file():
            raise SystemExit(f"{self.name}: could not write {self.rundir.best} (see the error above)")
        t = self.cfg.trainer
        if t.shortlist:  # as the end of a run stores it (nmt.finishing), for the shortlist=true decode row
            ckpt = checkpoint.load(self.rundir.best)
            made = build_shortlist(t, self.specs["train"], self.tok)
            self.rundir.write_checkpoint(self.rundir.best.name, {**ckpt, "shortlist": made.state_dict()})
        return self.rundir.best

    def result(self, args) -> dict:
        peak = (
            torch.cuda.max_memory_allocated() / 2**20
            if self.device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )
        test = [s for s, _ in load_pairs(self.specs["test"])][: args.decode_sentences]
        decode = {}
        self.model.eval()
        for beam in (1, 5):
            tr = Translator(self.model, self.tok, self.device, SearchOptions(beam_size=beam), max_tokens=8000)
            tr.translate(test[:64])  # warm-up
            self.sync()
            t0 = time.perf_counter()
            tr.translate(test)
            self.sync()
            decode[f"beam{beam}_sent_s"] = len(test) / (time.perf_counter() - t0)
        self.model.train()
        med = {k: statistics.median(w[k] for w in self.windows) for k in self.windows[0]}
        return {
            "model": self.name,
            "overrides": self.overrides,
            **med,
            "windows": self.windows,
            "peak_mib": peak,
            **decode,
            "decode_sentences": len(test),
        }


def measure_peak(args) -> gemm_peak.Peak | None:
    """This machine's GEMM peak (float32, bf16): measured before any model is built, and again after the
    timings (``main`` keeps the higher of the two, gemm_peak.best_of)."""
    if args.no_efficiency or args.device != "cpu":
        return None
    peak = gemm_peak.measure()
    print(peak.describe(), flush=True)
    return peak


def efficiency(run: NmtRun, row: dict, peak: gemm_peak.Peak) -> dict:
    """Training FLOPs per target token (FLOP_BATCHES more real batches through train_step), the
    GFLOP/s the row's median target tok/s achieve with them and their share of each GEMM peak;
    decoding FLOPs per output token (greedy, beam 5) on the first FLOP_SENTENCES of test.tsv."""
    train = model_flops.train_flops(run.trainer, [next(run.loader).to(run.device) for _ in range(FLOP_BATCHES)])
    achieved = row["tgt_tok_s"] * train.per_token / 1e9
    eff = {
        "precision": run.trainer.precision.description.split(" (")[0],
        "train_flop_per_tgt_token": train.per_token,
        "achieved_gflops": achieved,
        "peak_share": {name: achieved / g for name, g in peak.gflops.items()},
    }
    test = [s for s, _ in load_pairs(run.specs["test"])][:FLOP_SENTENCES]
    for beam in (1, 5):
        tr = Translator(run.model, run.tok, run.device, SearchOptions(beam_size=beam), max_tokens=8000)
        eff[f"beam{beam}_flop_per_out_token"] = model_flops.decode_flops(tr, test).per_token
    return eff


def print_efficiency(rows: list[dict], peak: gemm_peak.Peak) -> None:
    print(f"\n{peak.describe()}")
    print(
        "| model | precision | train MFLOP / tgt token | achieved GFLOP/s | share of float32 peak | "
        "share of bf16 peak | greedy MFLOP / output token | beam-5 MFLOP / output token |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        e = r["efficiency"]
        print(
            f"| {r['model']} | {e['precision']} | {e['train_flop_per_tgt_token'] / 1e6:.1f} | "
            f"{e['achieved_gflops']:.1f} | {100 * e['peak_share']['float32']:.0f}% | "
            f"{100 * e['peak_share']['bf16']:.0f}% | {e['beam1_flop_per_out_token'] / 1e6:.1f} | "
            f"{e['beam5_flop_per_out_token'] / 1e6:.1f} |"
        )


def compare(runs: list[NmtRun], peers: list[str], args) -> tuple[list[dict], list[dict]]:
    """Alternate windows of every nmt model and every peer, round after round; one row per (model, peer),
    and for every peer the checkpoint it saved at the end (``checkpoint``, ``updates``, ``trained_s``)."""
    first = runs[0]
    data = compare_peers.prepare_data(
        first.tok, first.specs, load_pairs, compare_peers.PEERS_HOME / "data" / f"nmt-{first.name}"
    )
    mean_tgt = statistics.mean(w["tgt_tokens_per_update"] for w in first.windows)
    started, saved = [], []
    try:
        for name in peers:  # one at a time: a start-up never overlaps anything measured
            peer = compare_peers.start_peer(
                name, data, compare_peers.PEERS_HOME / "runs" / f"bench-{name}", mean_tgt, args.device == "cuda"
            )
            started.append(peer)
            compare_peers.wait_until_training(peer, args.warmup)
        for peer in started:  # as long as nmt's --windows trained, so the decoded models had the same time
            compare_peers.run_window(peer, first.trained_s, record=False)
        for k in range(args.rounds):
            line = f"round {k + 1}/{args.rounds}:"
            for run in runs:
                line += f" {run.name} {run.window(seconds=args.window_seconds)['tgt_tok_s']:,.0f} |"
            for peer in started:
                pw = compare_peers.run_window(peer, args.window_seconds)
                line += f" {peer.name} {pw['tgt_tok_s']:,.0f} |" if pw else f" {peer.name} (no complete interval) |"
            print(line + " target tok/s", flush=True)
        for peer in started:
            try:
                path, updates = compare_peers.stop_and_save(peer)
            except SystemExit as e:  # its training rows stand; only its decode row is lost
                print(f"{e}; {peer.name} is left out of the decode comparison", flush=True)
                continue
            saved.append(
                {
                    "peer": peer.name,
                    "checkpoint": path,
                    "config": peer.run / f"{peer.name}.yaml",  # as start_peer wrote it
                    "updates": updates,
                    "trained_s": peer.trained_s,
                }
            )
    finally:
        for peer in started:
            if peer.alive():
                compare_peers.stop(peer)
    rows = []
    for run in runs:
        nmt_rounds = run.windows[-args.rounds :]
        nmt_med = statistics.median(w["tgt_tok_s"] for w in nmt_rounds)
        for peer in started:
            if not peer.windows:
                raise SystemExit(f"{peer.name}: no complete log interval in any window; use longer --window-seconds")
            med = statistics.median(w["tgt_tok_s"] for w in peer.windows)
            rows.append(
                {
                    "model": run.name,
                    "peer": peer.name,
                    "peer_tgt_tok_s": med,
                    "peer_windows": peer.windows,
                    "peer_tgt_tokens_per_update": statistics.median(w["tgt_tokens_per_update"] for w in peer.windows),
                    "peer_rss_mib": max(w["rss_mib"] for w in peer.windows),
                    "nmt_tgt_tok_s": nmt_med,
                    "nmt_tgt_tokens_per_update": statistics.median(w["tgt_tokens_per_update"] for w in nmt_rounds),
                    "ratio": nmt_med / med,
                }
            )
    return rows, saved


DECODE_DIR = compare_peers.PEERS_HOME / "runs" / "decode"
MANIFEST = "models.json"  # what --decode-only reads: the decoded models, the source and reference files


def compare_decoding(run: NmtRun, saved: list[dict], args) -> list[dict]:
    """Decode valid.tsv with the model ``run`` trained and each peer's saved one (scripts/decode_compare.py)."""
    return decode_models(save_for_decoding(run, saved, args, DECODE_DIR), DECODE_DIR, args)


def save_for_decoding(run: NmtRun, saved: list[dict], args, out: Path) -> dict:
    """Put what the decode comparison needs in ``out``: the first --decode-sentences lines of valid.tsv
    (source, references), nmt's sentencepiece models for the peers, nmt's checkpoint (out of the run's
    temporary folder), and models.json naming them and the peers' saved models, which --decode-only reads."""
    pairs = load_pairs(run.specs["valid"], limit=args.decode_sentences)
    src = decode_compare.write_lines(out / "valid.raw.src", [s for s, _ in pairs])
    ref = decode_compare.write_lines(out / "valid.raw.ref", [t for _, t in pairs])
    (out / "src.model").write_bytes(run.tok.src_proto)  # nmt's own sentencepiece model(s), for the peers
    (out / "tgt.model").write_bytes(run.tok.tgt_proto)
    ckpt = out / "nmt" / "best.pt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run.save(), ckpt)
    manifest = {
        "model": run.name,
        "device": args.device,
        "source": str(src),
        "references": str(ref),
        "nmt": {
            "checkpoint": str(ckpt),
            "shortlist": bool(run.cfg.trainer.shortlist),
            "updates": run.steps,
            "trained_s": run.trained_s,
        },
        "peers": [{k: str(v) if isinstance(v, Path) else v for k, v in s.items()} for s in saved],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest


def decode_models(manifest: dict, out: Path, args) -> list[dict]:
    """Every decode job of a models.json (nmt as a user runs it and its variants, then each peer) for
    --decode-rounds alternating rounds, with --decode-beam and --decode-stop; one row per job. ``out``: the
    folder of the manifest (the peers' sentencepiece models; hypotheses and logs go there)."""
    beam, stop, device = args.decode_beam, args.decode_stop, manifest["device"]
    src, ckpt = Path(manifest["source"]), Path(manifest["nmt"]["checkpoint"])
    jobs = [decode_compare.nmt_job(ckpt, src, out, beam, device, stop=stop)]
    if manifest["nmt"]["shortlist"]:
        jobs.append(decode_compare.nmt_job(ckpt, src, out, beam, device, stop=stop, shortlist=True))
    if device == "cpu":
        jobs.append(decode_compare.nmt_job(ckpt, src, out, beam, device, quantize="int8", stop=stop))
        jobs.append(decode_compare.nmt_job(ckpt, src, out, beam, device, stop=stop, amp="none"))
        jobs.append(decode_compare.nmt_job(ckpt, src, out, beam, device, stop=stop, workers=1))
    for job in jobs:
        job.trained = {"updates": manifest["nmt"]["updates"], "trained_s": manifest["nmt"]["trained_s"]}
    spm = (out / "src.model", out / "tgt.model")
    for s in manifest["peers"]:
        venv = compare_peers.PEERS_HOME / f"venv-{s['peer']}"
        if s["peer"] == "onmt":
            job = decode_compare.onmt_job(venv, Path(s["checkpoint"]), *spm, src, out, beam, device == "cuda")
        else:
            job = decode_compare.joey_job(venv, Path(s["config"]), Path(s["checkpoint"]), *spm, src, out, beam)
        job.trained = {"updates": s["updates"], "trained_s": s["trained_s"], "checkpoint": s["checkpoint"]}
        jobs.append(job)
    references = decode_compare.read_lines(Path(manifest["references"]))
    return decode_compare.measure(jobs, src, references, args.decode_rounds, out)


def decode_only(args) -> None:
    """--decode-only: decode the models an earlier --compare run left (its models.json) again, with this
    checkout's nmt.translate: a decoding change measured against the peers on the same saved models."""
    path = Path(args.decode_only)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(
            f"--decode-only {path}: cannot read it ({e}); a `--compare` run writes it after its decoding"
        ) from None
    missing = [
        p
        for p in [manifest["nmt"]["checkpoint"], *(s["checkpoint"] for s in manifest["peers"])]
        if not Path(p).exists()
    ]
    if missing:
        raise SystemExit(f"--decode-only {path}: saved model(s) not found: {', '.join(missing)}")
    decoded = decode_models(manifest, path.parent, args)
    print("\n" + decode_compare.summary(decoded, args.decode_rounds, f"the models saved in {path}"))
    print("\n".join(decode_compare.table(decoded)))
    if args.json:
        meta = {"decode_only": str(path), "model": manifest["model"], "torch": torch.__version__}
        Path(args.json).write_text(json.dumps({"meta": meta, "decode": decoded}, indent=1, default=str))


def batch_sweep(args) -> list[dict]:
    """Median training rates of every model at every token budget, one fresh pipeline each."""
    rows = []
    for m in args.models.split(","):
        for budget in (int(x) for x in args.batch_sweep.split(",")):
            run = NmtRun(m, [*MODELS[m], f"data.max_tokens={budget}"], args)
            for _ in range(args.windows):
                run.window(steps=args.window_steps)
            med = {k: statistics.median(w[k] for w in run.windows) for k in ("tgt_tok_s", "tgt_tokens_per_update")}
            rows.append({"model": m, "max_tokens": budget, **med, "windows": run.windows})
            print(f"{m} max_tokens={budget}: {med['tgt_tok_s']:,.0f} target tok/s", flush=True)
            del run  # its DataLoader worker goes with it
            gc.collect()
    return rows


def line_plot(series: dict[str, list[tuple[float, float]]], path: str, x: str, y: str, title: str, logx=False) -> None:
    """One line with markers per named series of (x, y) points, as a PNG (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data", default="data/spa-eng")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window-steps", type=int, default=30)
    ap.add_argument("--decode-sentences", type=int, default=2000)
    ap.add_argument("--compare", default="", help="peers to train side by side with the models: joey,onmt")
    ap.add_argument("--rounds", type=int, default=3, help="--compare: nmt/peer window rounds")
    ap.add_argument("--window-seconds", type=float, default=60.0, help="--compare: length of every window")
    ap.add_argument("--decode-rounds", type=int, default=2, help="--compare: decoding rounds (median); 0 = no decoding")
    ap.add_argument("--decode-beam", type=int, default=5, help="--compare: beam size of the decoding comparison")
    ap.add_argument(
        "--decode-stop", choices=("exact", "early"), default="exact", help="--compare: nmt's beam stopping rule"
    )
    ap.add_argument("--batch-sweep", default="", help="token budgets to sweep, e.g. 1000,2000,4000 (no decoding)")
    ap.add_argument("--plot", help="--batch-sweep: PNG of tokens/s against batch size")
    ap.add_argument("--no-efficiency", action="store_true", help="skip the GEMM peak and the FLOP counts")
    ap.add_argument(
        "--decode-only",
        nargs="?",
        const=str(DECODE_DIR / MANIFEST),
        metavar="MODELS_JSON",
        help="no training: decode the models an earlier --compare run saved (its models.json, by default "
        f"{DECODE_DIR / MANIFEST}) again, --decode-rounds rounds",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.decode_only:
        decode_only(args)
        return
    if args.batch_sweep:
        rows, names = batch_sweep(args), args.models.split(",")
        print("| model | max_tokens | real target tokens per batch | target tok/s |\n|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r['model']} | {r['max_tokens']:,} | {r['tgt_tokens_per_update']:,.0f} | {r['tgt_tok_s']:,.0f} |")
        if args.json:
            meta = {"device": args.device, "torch": torch.__version__, "threads": torch.get_num_threads()}
            Path(args.json).write_text(json.dumps({"meta": meta, "sweep": rows}, indent=1))
        if args.plot:
            series = {m: [(r["tgt_tokens_per_update"], r["tgt_tok_s"]) for r in rows if r["model"] == m] for m in names}
            title = f"{args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads"
            line_plot(series, args.plot, "real target tokens per batch", "training target tokens/s", title, logx=True)
        return
    peak = measure_peak(args)
    runs = []
    for m in args.models.split(","):
        run = NmtRun(m, MODELS[m], args)
        for _ in range(args.windows):
            run.window(steps=args.window_steps)
        runs.append(run)
    compared, saved = compare(runs, args.compare.split(","), args) if args.compare else ([], [])
    decoded = compare_decoding(runs[0], saved, args) if args.compare and args.decode_rounds > 0 else []
    rows = [run.result(args) for run in runs]
    if peak:  # again after the timings: the ceiling is the better of the two (gemm_peak.best_of)
        again = measure_peak(args)
        peak, peaks = gemm_peak.best_of(peak, again), [peak, again]
    for run, row in zip(runs, rows):
        row["efficiency"] = efficiency(run, row, peak) if peak else None
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
    meta["gemm_peak"] = dataclasses.asdict(peak) if peak else None  # per shape: for --json, too long to print
    meta["gemm_peak_measurements"] = [p.gflops for p in peaks] if peak else None  # before and after the timings
    print("| model | target tok/s | src+tgt tok/s | data wait | peak MiB | greedy sent/s | beam-5 sent/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['tgt_tok_s']:,.0f} | {r['src_tgt_tok_s']:,.0f} | {100 * r['data_wait']:.1f}% | "
            f"{r['peak_mib']:,.0f} | {r['beam1_sent_s']:,.0f} | {r['beam5_sent_s']:,.0f} |"
        )
    if peak:
        print_efficiency(rows, peak)
    if compared:
        print(f"\nagainst the peers: {args.rounds} rounds of {args.window_seconds:.0f} s windows, alternating")
        print("| model | peer | peer tgt tok/s | nmt tgt tok/s | nmt / peer | tgt tok/update (peer / nmt) | peer MiB |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for c in compared:
            print(
                f"| {c['model']} | {c['peer']} | {c['peer_tgt_tok_s']:,.0f} | {c['nmt_tgt_tok_s']:,.0f} | "
                f"{c['ratio']:.2f}x | "
                f"{c['peer_tgt_tokens_per_update']:,.0f} / {c['nmt_tgt_tokens_per_update']:,.0f} | "
                f"{c['peer_rss_mib']:,.0f} |"
            )
    if decoded:
        print("\n" + decode_compare.summary(decoded, args.decode_rounds))
        print("\n".join(decode_compare.table(decoded)))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"meta": meta, "rows": rows, "compare": compared, "decode": decoded}, indent=1, default=str)
        )


if __name__ == "__main__":
    main()
