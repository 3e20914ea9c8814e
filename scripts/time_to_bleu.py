"""Valid BLEU against wall-clock time from launch, for nmt and its peers on the same device.

    python scripts/time_to_bleu.py --minutes 12 --systems nmt,joey,onmt --json ttb.json --plot ttb.png

The systems run one after the other, never side by side. Each curve's clock starts when its
process is launched and includes everything that user would wait for: for nmt, reading the
corpus and training sentencepiece (a fresh cache), model building, training and its validations;
for Joey, reading the pre-segmented corpus, training and validations (nmt's pieces, made before
its clock starts). Both validate greedily on all of valid.tsv and are scored the same way:
sacrebleu's default BLEU on detokenised text against the raw references (nmt: its own
validation; Joey: its ``<step>.hyps`` pieces decoded with nmt's sentencepiece model). A point's
time is when its result appears on disk (metrics.jsonl record, .hyps file), polled every 0.5 s.
OpenNMT-py cannot validate with BLEU, so it saves checkpoints instead, translated greedily after
its run: its clock holds no validation time (nmt's and Joey's do).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import compare_peers
import sacrebleu
from benchmark import MODELS, REPO, corpus_and_tokenizer, line_plot

from nmt.data.corpus import load_pairs

PEERS = {"joey": "Joey NMT 2.3.0", "onmt": "OpenNMT-py 3.5.1"}


def poll(proc: subprocess.Popen, seconds: float, found) -> list[tuple[float, object]]:
    """Until ``seconds`` after launch (or exit): call ``found()`` for new results, stamp them."""
    t0, seen, points = time.monotonic(), set(), []
    while time.monotonic() - t0 < seconds and proc.poll() is None:
        for key, value in found():
            if key not in seen:
                seen.add(key)
                points.append((time.monotonic() - t0, value))
        time.sleep(0.5)
    return points


def run_nmt(args, run: Path) -> list[dict]:
    shutil.rmtree(run, ignore_errors=True)  # a fresh run each time (nmt.train refuses one over old checkpoints)
    run.mkdir(parents=True)
    metrics = run / "metrics.jsonl"
    cmd = [
        sys.executable, "-m", "nmt.train", *MODELS["r"], *args.nmt_overrides,
        f"trainer.max_minutes={args.minutes}", f"trainer.valid_every={args.nmt_valid_every}",
        "trainer.patience=0", "trainer.plot_attention=0", "data.valid_max_sentences=0",
        "wandb.mode=disabled", f"data.dir={args.data}", f"hydra.run.dir={run}",
    ]  # fmt: skip
    env = dict(os.environ, NMT_CACHE=tempfile.mkdtemp(prefix="nmt-ttb-cache-"))  # sentencepiece counts
    with (run / "stdout.txt").open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)

        def found():
            if metrics.is_file():
                for line in metrics.read_text().splitlines():
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError:  # a line being written
                        continue
                    if "bleu" in r:
                        yield r["step"], r

        points = poll(proc, 60 * args.minutes, found)
        proc.send_signal(signal.SIGTERM)  # saves last.pt and exits
        proc.wait()
    return [{"minutes": t / 60, "step": r["step"], "bleu": r["bleu"]} for t, r in points]


def nmt_pieces(args):
    """nmt's tokenizer, splits and pieces (the same as scripts/benchmark.py --compare gives the peers)."""
    _, specs, tok = corpus_and_tokenizer(MODELS["r"], args)
    data = compare_peers.prepare_data(tok, specs, load_pairs, compare_peers.PEERS_HOME / "data" / "nmt-r")
    return tok, data, [t for _, t in load_pairs(specs["valid"])]


def run_peer(name: str, args, run: Path) -> list[dict]:
    """Joey validates greedily on valid and keeps its hypotheses (<step>.hyps); OpenNMT-py has no
    BLEU validation, so it saves checkpoints (model_step_<n>.pt) that are translated after its run,
    outside its clock. Either way a point's time is when the file appeared."""
    tok, data, refs = nmt_pieces(args)
    every = args.joey_valid_every if name == "joey" else args.onmt_save_every
    peer = compare_peers.start_peer(name, data, run, args.tgt_per_update, args.device == "cuda", every)
    where, pattern = (run / "model", "*.hyps") if name == "joey" else (run, "model_step_*.pt")

    def found():
        for f in where.glob(pattern) if where.is_dir() else []:
            yield f.name, f

    points = poll(peer.proc, 60 * args.minutes, found)
    compare_peers.stop(peer)
    curve = []
    for t, f in points:
        if name == "joey":
            step, lines = int(f.stem), f.read_text(encoding="utf-8").splitlines()
        else:
            step, lines = int(f.stem.rsplit("_", 1)[1]), onmt_translate(f, data / "valid.sp.en", args)
        hyps = [tok.tgt.decode_pieces(line.split()) for line in lines]
        if len(hyps) != len(refs):
            print(f"{f}: {len(hyps)} hypotheses for {len(refs)} references, skipped", file=sys.stderr)
            continue
        curve.append({"minutes": t / 60, "step": step, "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score})
    return curve


def onmt_translate(ckpt: Path, src: Path, args) -> list[str]:
    """Greedy pieces for ``src`` (-random_sampling_topk 1: at beam 1 OpenNMT-py otherwise samples)."""
    out = ckpt.with_suffix(".hyp")
    venv = compare_peers.PEERS_HOME / "venv-onmt" / "bin" / "python"
    cmd = [
        str(venv), "-m", "onmt.bin.translate", "-model", str(ckpt), "-src", str(src), "-output", str(out),
        "-beam_size", "1", "-random_sampling_topk", "1", "-batch_size", "64", "-batch_type", "sents",
        "-max_length", "100", "-gpu", "0" if args.device == "cuda" else "-1",
    ]  # fmt: skip
    # OpenNMT-py 3.5.1 checkpoints pickle their options, which torch >= 2.6 refuses by default.
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out.read_text(encoding="utf-8").splitlines()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="nmt,joey")
    ap.add_argument("--minutes", type=float, default=12.0, help="wall clock per system, from launch")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data", default="data/spa-eng")
    ap.add_argument("--nmt-valid-every", type=int, default=250, help="nmt updates between validations")
    ap.add_argument("--nmt-overrides", nargs="*", default=[], help="extra nmt.train overrides, e.g. trainer.amp=none")
    ap.add_argument("--joey-valid-every", type=int, default=60, help="Joey updates between validations")
    ap.add_argument("--onmt-save-every", type=int, default=200, help="OpenNMT-py updates between checkpoints")
    ap.add_argument("--tgt-per-update", type=float, default=1800.0, help="real target tokens per update to match")
    ap.add_argument("--runs", default="/tmp/nmt-ttb")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--merge", nargs="*", default=[], help="--json files of earlier runs to add to the table/plot")
    args = ap.parse_args()
    runs = Path(args.runs)
    curves: dict[str, list[dict]] = {}
    for earlier in args.merge:
        curves.update({k.strip(): v for k, v in json.loads(Path(earlier).read_text())["curves"].items()})
    for system in filter(None, args.systems.split(",")):
        if system == "nmt":
            curves[" ".join(["nmt", *args.nmt_overrides])] = run_nmt(args, runs / "nmt")
        elif system in PEERS:
            curves[PEERS[system]] = run_peer(system, args, runs / system)
        else:
            raise SystemExit(f"--systems: unknown system {system!r} (nmt, {', '.join(PEERS)})")
    for name, pts in curves.items():
        print(f"\n{name}\n| minutes | step | valid BLEU |\n|---:|---:|---:|")
        for p in pts:
            print(f"| {p['minutes']:.1f} | {p['step']:,} | {p['bleu']:.2f} |")
    meta = {"device": args.device, "minutes": args.minutes, "argv": sys.argv[1:]}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "curves": curves}, indent=1))
    if args.plot:
        series = {name: [(p["minutes"], p["bleu"]) for p in pts] for name, pts in curves.items()}
        x, y = "wall-clock minutes from launch", "valid BLEU (greedy, all of valid.tsv)"
        line_plot(series, args.plot, x, y, f"model R, {args.device}, {args.minutes:g} min per system")


if __name__ == "__main__":
    main()
