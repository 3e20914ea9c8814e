"""Peer toolkits for ``scripts/benchmark.py --compare joey,onmt``: data, configs, windows, log parsing.

How a peer is measured: it trains model R as a background process (own venv, made by
``scripts/install_peers.sh``) on nmt's own sentencepiece pieces. After its start-up it is
frozen with SIGSTOP and only runs (SIGCONT) during its own windows, which alternate with nmt's,
so slow drift of the machine hits every system alike and no two systems ever share the cores.
Its throughput in a window is read from its own training log: the target tokens of the log
intervals that begin and end inside the window, over the time between their first and last
line, so start-up, the pause and partial intervals never count.

At the end each peer is told to stop and write its own checkpoint (``stop_and_save``), so the
models trained in the windows can be decoded by each toolkit's own CLI (scripts/decode_compare.py):
OpenNMT-py through ``peers/onmt_train_until_signal.py`` (SIGUSR1: it leaves its training loop and
saves ``model_step_N.pt``), Joey NMT by SIGINT (it catches the KeyboardInterrupt and saves
``N.ckpt``, linked as ``latest.ckpt``).
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import re
import signal
import string
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmark_memory import tree_rss_mib

from nmt.machine import usable_cpus

HERE = Path(__file__).resolve().parent
PEERS_HOME = Path(os.environ.get("NMT_PEERS", "/tmp/peers"))
# Real target tokens per update that the shared recipes' budgets give on spa-eng (../shared/peers):
# OpenNMT-py 2,300 counted tokens and Joey NMT 5,600 padded slots each make ~2,000.
BUDGET_PER_REAL_TOKEN = {"onmt": 2300 / 2000, "joey": 5600 / 2000}
REPORT_EVERY = 3


def write_lines(path: Path, lines) -> None:
    with path.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def prepare_data(tok, specs: dict, load_pairs: Callable, out: Path) -> Path:
    """nmt's pieces as space-separated files + each peer's vocabulary file, in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / "done").is_file():
        return out
    sp = tok.src
    counts: collections.Counter[str] = collections.Counter()
    for split in ("train", "valid"):
        pairs = load_pairs(specs[split])
        for side, lang in ((0, "en"), (1, "es")):
            pieces = [" ".join(sp.encode(p[side], out_type=str)) for p in pairs]
            write_lines(out / f"{split}.sp.{lang}", pieces)
            if split == "train":
                for line in pieces:
                    counts.update(line.split())
    vocab = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    write_lines(out / "vocab.joey.txt", vocab)  # Joey: every piece in id order (its specials dedupe)
    specials = {sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)}
    write_lines(out / "vocab.onmt.txt", [f"{p}\t{counts.get(p, 0)}" for p in vocab if p not in specials])
    (out / "done").write_text("ok\n")
    return out


@dataclass
class Peer:
    name: str  # joey | onmt
    proc: subprocess.Popen
    log: Path
    run: Path  # its run folder (config, checkpoints)
    windows: list[dict] = field(default_factory=list)
    trained_s: float = 0.0  # seconds it has been let run since its warm-up (every window, measured or not)

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rows(self) -> list[tuple[float, int, float]]:
        """(unix time, update, target tokens since the previous line) for every progress line so far."""
        parse = parse_onmt if self.name == "onmt" else parse_joey
        return parse(self.log.read_text(encoding="utf-8", errors="replace")) if self.log.is_file() else []

    def tree_rss_mib(self) -> float:
        """Resident memory of the peer (main process and data workers)."""
        return tree_rss_mib(self.proc.pid)


def _ts(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def parse_onmt(text: str) -> list[tuple[float, int, float]]:
    # [2026-11-21 10:00:00,123 INFO] Step 30/100000000; acc: ...; sents: 512; bsz: 40/45/17; 1800/2000 tok/s; 30 sec
    rows = []
    for m in re.finditer(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) INFO\] Step (\d+)/.*?bsz:\s*\d+/\s*(\d+)/", text):
        rows.append((_ts(m.group(1)), int(m.group(2)), float(m.group(3)) * REPORT_EVERY))
    return rows


def parse_joey(text: str) -> list[tuple[float, int, float]]:
    # 2026-11-21 10:00:00,123 - INFO - joeynmt.training - Epoch 1, Step: 30, Batch Loss: ..., Tokens per Sec: 800, ...
    rows, prev = [], None
    pattern = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) .*?Step:\s+(\d+), Batch Loss:.*?Tokens per Sec:\s+([\d.]+)"
    for m in re.finditer(pattern, text):
        t = _ts(m.group(1))
        # Joey restarts its timer at every progress line, so tokens = its rate x the interval.
        tokens = float(m.group(3)) * (t - prev) if prev is not None else 0.0
        rows.append((t, int(m.group(2)), tokens))
        prev = t
    return rows


def window_rate(rows: list[tuple[float, int, float]], start: float, end: float) -> dict | None:
    """Target tokens/s over the log intervals lying wholly inside [start, end]."""
    inside = [r for r in rows if start <= r[0] <= end]
    if len(inside) < 2:
        return None
    secs = inside[-1][0] - inside[0][0]
    tokens = sum(r[2] for r in inside[1:])
    updates = inside[-1][1] - inside[0][1]
    return {"tgt_tok_s": tokens / secs, "tgt_tokens_per_update": tokens / max(1, updates), "updates": updates}


def start_peer(
    name: str, data: Path, run: Path, mean_tgt_per_batch: float, cuda: bool, valid_every: int = 99_999_999
) -> Peer:
    """Launch a peer's training in its own process group (so it can be frozen with its workers);
    ``valid_every`` updates between validations (Joey: greedy on all of valid, hypotheses kept)
    or, for OpenNMT-py, between checkpoints (it has no BLEU validation of its own)."""
    venv = PEERS_HOME / f"venv-{name}"
    if not (venv / "bin" / "python").is_file():
        raise SystemExit(f"{venv}: peer '{name}' is not installed; run: bash scripts/install_peers.sh {name}")
    run.mkdir(parents=True, exist_ok=True)
    values = {
        "DATA": str(data),
        "RUN": str(run),
        "VOCAB": str(sum(1 for _ in (data / "vocab.onmt.txt").open()) + 4),
        "REPORT_EVERY": str(REPORT_EVERY),
        "ONMT_BATCH": str(round(BUDGET_PER_REAL_TOKEN["onmt"] * mean_tgt_per_batch)),
        "JOEY_BATCH": str(round(BUDGET_PER_REAL_TOKEN["joey"] * mean_tgt_per_batch)),
        "GPU_RANKS": "[0]" if cuda else "[]",
        "USE_CUDA": str(cuda),
        "VALID_EVERY": str(valid_every),
    }
    cfg = run / f"{name}.yaml"
    cfg.write_text(string.Template((HERE / "peers" / f"{name}_model_r.yaml").read_text()).substitute(values))
    env = dict(os.environ, OMP_NUM_THREADS=str(usable_cpus()), PYTHONUNBUFFERED="1")  # the pinned cores, if pinned
    if name == "onmt":  # onmt_train, stoppable with a checkpoint (see stop_and_save)
        cmd = [str(venv / "bin" / "python"), str(HERE / "peers" / "onmt_train_until_signal.py"), "-config", str(cfg)]
        log = run / "train.log"
    else:
        cmd = [str(venv / "bin" / "python"), "-m", "joeynmt", "train", str(cfg), "--skip-test"]
        log = run / "model" / "train.log"
    out = (run / "stdout.txt").open("w")
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=_default_sigint
    )
    return Peer(name, proc, log, run)


def _default_sigint() -> None:
    """In the peer's process before it starts: SIGINT back to its default. A shell starts background jobs
    (``cmd &``, ``nohup``) with SIGINT ignored, exec keeps that, and Python then leaves it ignored instead of
    raising KeyboardInterrupt, so Joey NMT, which saves when interrupted, would never hear SAVE_SIGNAL."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until_training(peer: Peer, updates: int, timeout: float = 900) -> None:
    """Let the peer start up and train ``updates`` updates (its warm-up), then freeze it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not peer.alive():
            tail = (peer.log.parent / "stdout.txt").read_text()[-2000:]
            raise SystemExit(f"{peer.name} exited during start-up:\n{tail}")
        rows = peer.rows()
        if rows and rows[-1][1] >= updates:
            break
        time.sleep(1.0)
    else:
        raise SystemExit(f"{peer.name}: no {updates} updates within {timeout:.0f} s")
    peer.signal(signal.SIGSTOP)


def run_window(peer: Peer, seconds: float, record: bool = True) -> dict | None:
    """Let the peer train ``seconds``; its rate in them, kept in ``peer.windows`` when ``record``."""
    start = time.time()
    peer.signal(signal.SIGCONT)
    time.sleep(seconds)
    peer.signal(signal.SIGSTOP)
    end = time.time()
    peer.trained_s += end - start
    time.sleep(0.5)  # let a line written just before the stop reach the log file
    w = window_rate(peer.rows(), start, end)
    if w is not None:
        w["rss_mib"] = peer.tree_rss_mib()
        if record:
            peer.windows.append(w)
    return w


def stop(peer: Peer) -> None:
    peer.signal(signal.SIGCONT)
    peer.signal(signal.SIGKILL)
    peer.proc.wait()


# How each peer is asked to stop and save (sent to its main process only; its data workers, if any,
# go when it exits), and where the checkpoint lands: (checkpoint path, its update number).
SAVE_SIGNAL = {"onmt": signal.SIGUSR1, "joey": signal.SIGINT}


def _onmt_checkpoint(run: Path) -> tuple[Path, int]:
    names = ((re.fullmatch(r"model_step_(\d+)\.pt", p.name), p) for p in run.glob("model_step_*.pt"))
    found = [(int(m.group(1)), p) for m, p in names if m]
    if not found:
        raise SystemExit(f"onmt: no model_step_N.pt in {run} after stopping it")
    step, path = max(found)
    return path, step


def _joey_checkpoint(run: Path) -> tuple[Path, int]:
    latest = run / "model" / "latest.ckpt"
    if not latest.exists():
        raise SystemExit(f"joey: no {latest} after stopping it")
    path = latest.resolve()
    return path, int(path.stem)


def stop_and_save(peer: Peer, timeout: float = 300) -> tuple[Path, int]:
    """Stop a (frozen) peer so that it writes its own checkpoint of the weights it trained; returns
    (checkpoint, update). The update it is in when told finishes first (one more update at most)."""
    os.kill(peer.proc.pid, SAVE_SIGNAL[peer.name])  # pending until it runs again
    peer.signal(signal.SIGCONT)
    try:
        peer.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(peer)
        tail = (peer.run / "stdout.txt").read_text(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(
            f"{peer.name}: did not save and exit within {timeout:.0f} s of being told to"
            f" (last output: {' | '.join(tail) or 'none'})"
        ) from None
    return (_onmt_checkpoint if peer.name == "onmt" else _joey_checkpoint)(peer.run)
