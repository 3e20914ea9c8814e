"""Decoding of the models trained by ``scripts/benchmark.py --compare``, each by its own toolkit's CLI.

Every system decodes the same raw source lines (valid.tsv) with the same beam into detokenised
text, as a user runs it: one subprocess per command, timed wall-clock from launch to exit, so
start-up (imports, loading the checkpoint) counts as it does for a user.

- nmt: ``python -m nmt.translate checkpoint=best.pt input=RAW output=OUT beam_size=5 stop=RULE``;
  raw text in, detokenised text out, with the default ``amp=auto`` (bf16 products where they are
  measured faster on this CPU). Once more with ``shortlist=true`` (row ``nmt shortlist``: the
  checkpoint's vocabulary shortlist, nmt.shortlist), and on CPU three times more: ``amp=none`` (float32
  products, row ``nmt float32``), ``quantize=int8`` (row ``nmt int8``) and ``workers=1`` (row
  ``nmt 1 process``: by default a file is decoded in one one-thread process per CPU thread,
  nmt.translator). RULE is the beam search's stopping rule (``exact`` or ``early``, nmt.search),
  given to all.
- OpenNMT-py and Joey NMT translate sentencepiece pieces, so their timed part is the three commands
  a user of theirs runs for the same job, one after another: ``peers/spm_pieces.py encode`` (nmt's
  own sentencepiece model, in the peer's venv), the translate command (OpenNMT-py
  ``python -m onmt.bin.translate``; Joey ``python -m joeynmt translate`` on stdin), and
  ``spm_pieces.py decode``. Each translate command's own time is kept too (``translate_s``).

Speed is output WORDS per second (whitespace words of the detokenised hypotheses over the wall
seconds): a less-trained model stops earlier or later than a better one, so sentences/s would
reward the wrong thing. BLEU is sacrebleu's default corpus BLEU against the references. Systems run
in alternation for ``rounds`` rounds and the median wall time counts, so slow drift of the machine
hits all alike; the hypotheses (deterministic) come from the last round.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import sacrebleu
import yaml

from nmt.config import override
from nmt.machine import usable_cpus

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SPM_PIECES = HERE / "peers" / "spm_pieces.py"
NMT, INT8, F32 = "nmt", "nmt int8", "nmt float32"  # the nmt rows (NMT: as a user runs it); the rest are peers
SHORT = "nmt shortlist"  # shortlist=true: each batch over the checkpoint's vocabulary shortlist (nmt.shortlist)
ONE = "nmt 1 process"  # workers=1: the default search in one process (the default on CPU: one per CPU thread)
VARIANTS = (INT8, F32, SHORT, ONE)  # nmt rows compared with the NMT row (BLEU change, speed-up)
# Below this valid BLEU a model of the comparison is too little trained for its words/s to mean anything (session 34:
# 34 s of training gave nmt 0.74 and OpenNMT-py 0.09, with 12,272 against 4,402 output words); summary() says so.
UNDERTRAINED_BLEU = 10.0


@dataclass
class Step:
    """One command of a decode job; ``stdin``/``stdout`` are files (None: stdin empty, stdout to the log)."""

    cmd: list[str]
    stdin: Path | None = None
    stdout: Path | None = None


@dataclass
class DecodeJob:
    """The commands that take raw source lines to detokenised hypotheses for one system, all timed."""

    system: str  # nmt | nmt int8 | nmt float32 | onmt | joey
    beam: int
    steps: list[Step]
    hypotheses: Path  # the detokenised output, one line per source line
    timed: str  # what the wall time holds, in words
    translate_step: int = 0  # which step is the translate command itself
    env: dict[str, str] = field(default_factory=dict)  # on top of the benchmark's own environment
    cwd: Path = REPO
    trained: dict = field(default_factory=dict)  # training behind the model: seconds, updates


def count_words(lines: list[str]) -> int:
    """Whitespace-separated words in all ``lines`` (the hypotheses, detokenised)."""
    return sum(len(line.split()) for line in lines)


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file without their newlines (only \\n ends a line)."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(f"{line}\n" for line in lines).encode("utf-8"))
    return path


def decode_env() -> dict[str, str]:
    """The environment every system decodes in: all usable cores for intra-op threads, unbuffered output."""
    return dict(os.environ, OMP_NUM_THREADS=str(usable_cpus()), PYTHONUNBUFFERED="1")


# ---- the jobs ----


def nmt_job(
    checkpoint: Path,
    src: Path,
    out: Path,
    beam: int,
    device: str = "cpu",
    quantize: str = "none",
    stop: str = "exact",
    amp: str = "auto",
    shortlist: bool = False,
    workers: int = 0,
) -> DecodeJob:
    """``python -m nmt.translate`` on raw text (this checkout's nmt, from the repository root); ``amp=none``
    is the float32 row, ``quantize=int8`` the int8 one, ``shortlist=True`` the one searching over the
    checkpoint's vocabulary shortlist, ``workers=1`` the one decoding in a single process."""
    system = f"nmt {quantize}" if quantize != "none" else (F32 if amp == "none" else NMT)
    system = SHORT if shortlist else ONE if workers == 1 else system
    hyp = out / f"{system.replace(' ', '_')}.b{beam}.txt"
    files = [override("checkpoint", checkpoint), override("input", src), override("output", hyp)]  # a sweep job's = ,
    cmd = [sys.executable, "-m", "nmt.translate", *files]
    cmd += [f"beam_size={beam}", f"stop={stop}", f"device={device}"]
    cmd += [f"quantize={quantize}"] if quantize != "none" else []
    cmd += [f"amp={amp}"] if amp != "auto" else []
    cmd += ["shortlist=true"] if shortlist else []
    cmd += [f"workers={workers}"] if workers else []
    timed = f"python -m nmt.translate stop={stop} (raw text in, detokenised text out)"
    # The repository first, then whatever the caller's path holds (a machine without network keeps nmt's
    # dependencies in a --target folder on PYTHONPATH: replacing it lost omegaconf on the GPU machine).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return DecodeJob(system, beam, [Step(cmd)], hyp, timed, env={"PYTHONPATH": path})


def _peer_job(
    system: str, venv: Path, translate: Step, spm_src: Path, spm_tgt: Path, src: Path, out: Path, beam: int
) -> DecodeJob:
    """spm encode -> the peer's translate command (pieces in ``out``/src.sp, out to hyp.sp) -> spm decode."""
    py = str(venv / "bin" / "python")
    hyp = out / f"{system}.b{beam}.txt"
    steps = [
        Step([py, str(SPM_PIECES), "encode", str(spm_src)], stdin=src, stdout=out / f"{system}.src.sp"),
        translate,
        Step([py, str(SPM_PIECES), "decode", str(spm_tgt)], stdin=out / f"{system}.b{beam}.sp", stdout=hyp),
    ]
    timed = f"spm encode + {' '.join(Path(c).name for c in translate.cmd[:4])} ... + spm decode"
    return DecodeJob(system, beam, steps, hyp, timed, translate_step=1)


def onmt_job(
    venv: Path, checkpoint: Path, spm_src: Path, spm_tgt: Path, src: Path, out: Path, beam: int, cuda: bool = False
) -> DecodeJob:
    """OpenNMT-py's translate as ../shared/peers/run_onmt.sh runs it (64 sentences a batch, at most 100 pieces)."""
    cmd = [str(venv / "bin" / "python"), "-m", "onmt.bin.translate", "-model", str(checkpoint)]
    cmd += ["-src", str(out / "onmt.src.sp"), "-output", str(out / f"onmt.b{beam}.sp"), "-beam_size", str(beam)]
    cmd += ["-n_best", "1", "-batch_size", "64", "-batch_type", "sents", "-max_length", "100", "-seed", "1234"]
    cmd += ["-gpu", "0" if cuda else "-1"]
    if beam == 1:  # OpenNMT-py samples at beam 1 (random_sampling_temp 1 over the whole vocabulary) unless topk is 1
        cmd += ["-random_sampling_topk", "1"]
    job = _peer_job("onmt", venv, Step(cmd), spm_src, spm_tgt, src, out, beam)
    # torch >= 2.6 loads weights_only by default, which cannot read OpenNMT-py 3.5.1's checkpoints (they
    # pickle its options and vocabulary); this restores the old default for that load.
    job.env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    return job


def joey_translate_config(train_config: Path, checkpoint: Path, beam: int, out: Path) -> Path:
    """Joey's training config with its ``testing`` section set to decode ``checkpoint`` with ``beam``
    (as ../shared/peers/run_joey.sh: no length penalty, 64 sentences a batch, at most 100 pieces)."""
    cfg = yaml.safe_load(train_config.read_text(encoding="utf-8"))
    cfg["testing"].update(
        load_model=str(checkpoint),
        beam_size=beam,
        beam_alpha=-1,
        batch_size=64,
        batch_type="sentence",
        max_output_length=100,
        n_best=1,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return out


def joey_job(
    venv: Path, train_config: Path, checkpoint: Path, spm_src: Path, spm_tgt: Path, src: Path, out: Path, beam: int
) -> DecodeJob:
    """``python -m joeynmt translate CONFIG < pieces > out`` (Joey's stream mode: stdin not a terminal).

    Its ``-o OUT`` cannot be used: Joey 2.3.0 fails after decoding when given one (``translate`` reads
    ``args.n_best``, which its config object lacks), so the hypotheses come from stdout (logs go to stderr)."""
    cfg = joey_translate_config(train_config, checkpoint, beam, out / f"joey.translate.b{beam}.yaml")
    cmd = [str(venv / "bin" / "python"), "-m", "joeynmt", "translate", str(cfg)]
    step = Step(cmd, stdin=out / "joey.src.sp", stdout=out / f"joey.b{beam}.sp")
    return _peer_job("joey", venv, step, spm_src, spm_tgt, src, out, beam)


# ---- running and scoring ----


def run_job(job: DecodeJob, log: Path) -> dict:
    """Run the job's commands one after another; wall seconds of all of them and of the translate step."""
    secs = []
    with log.open("ab") as errors:
        for step in job.steps:
            stdin = step.stdin.open("rb") if step.stdin else subprocess.DEVNULL
            stdout = step.stdout.open("wb") if step.stdout else errors
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(
                    step.cmd, stdin=stdin, stdout=stdout, stderr=errors, env={**decode_env(), **job.env}, cwd=job.cwd
                )
            finally:
                for f in (stdin, stdout):
                    if f not in (subprocess.DEVNULL, errors):
                        f.close()
            secs.append(time.perf_counter() - t0)
            if proc.returncode != 0:
                tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
                raise SystemExit(f"{job.system}: {' '.join(step.cmd[:4])} ... exited {proc.returncode}; {log}:\n{tail}")
    return {"wall_s": sum(secs), "translate_s": secs[job.translate_step]}


def score(hypotheses: list[str], references: list[str]) -> dict:
    """sacrebleu corpus BLEU (default settings) and the output word count."""
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    return {"bleu": bleu.score, "words": count_words(hypotheses)}


def measure(jobs: list[DecodeJob], src: Path, references: list[str], rounds: int, logs: Path) -> list[dict]:
    """Every job once per round, in turn; one row per job: BLEU, words, median wall seconds, words/s."""
    n = len(read_lines(src))
    if n != len(references):
        raise ValueError(f"{src}: {n} source lines for {len(references)} references")
    times: dict[str, list[dict]] = {job.system: [] for job in jobs}
    for k in range(rounds):
        for job in jobs:
            t = run_job(job, logs / f"{job.system.replace(' ', '_')}.b{job.beam}.log")
            times[job.system].append(t)
            print(f"decode round {k + 1}/{rounds}: {job.system} beam {job.beam} {t['wall_s']:.1f} s", flush=True)
    rows = []
    for job in jobs:
        hyps = read_lines(job.hypotheses)
        if len(hyps) != n:
            raise SystemExit(f"{job.system}: {len(hyps)} output lines for {n} input lines ({job.hypotheses})")
        wall = statistics.median(t["wall_s"] for t in times[job.system])
        row = {"system": job.system, "beam": job.beam, "sentences": n, **score(hyps, references), "wall_s": wall}
        row["words_s"] = row["words"] / wall
        row["translate_s"] = statistics.median(t["translate_s"] for t in times[job.system])
        row.update(rounds=times[job.system], timed=job.timed, trained=job.trained)
        rows.append(row)
    return relate(rows)


def relate(rows: list[dict]) -> list[dict]:
    """Add the comparisons to the rows: a peer row gets ``nmt_over_peer`` (nmt's words/s over its own)
    and ``int8_over_peer``; the int8 and float32 rows get ``bleu_change`` and ``speedup`` against the
    nmt row (nmt as a user runs it)."""
    by = {r["system"]: r for r in rows}
    base, int8 = by.get(NMT), by.get(INT8)
    for r in rows:
        if r["system"] in (NMT, *VARIANTS):
            continue
        if base:
            r["nmt_over_peer"] = base["words_s"] / r["words_s"]
        if int8:
            r["int8_over_peer"] = int8["words_s"] / r["words_s"]
    for variant in (by.get(v) for v in VARIANTS):
        if base and variant:
            variant["bleu_change"] = variant["bleu"] - base["bleu"]
            variant["speedup"] = variant["words_s"] / base["words_s"]
    return rows


def summary(rows: list[dict], rounds: int, models: str = "the models trained above") -> str:
    """What the table below it measured: sentences, training behind each model (``models``: whose), what
    was timed."""
    trained = ", ".join(
        f"{r['system']} "
        + (f"{r['trained']['trained_s']:.0f} s / " if r["trained"].get("trained_s") is not None else "")
        + f"{r['trained']['updates']:,} updates"
        for r in rows
        if r["system"] not in VARIANTS
    )
    peers = [r for r in rows if r["system"] not in (NMT, *VARIANTS)]
    line = (
        f"decoding valid.tsv ({rows[0]['sentences']:,} sentences) with {models} (trained: "
        f"{trained}); whole commands, start-up included, median of {rounds} alternating rounds"
    )
    line += "".join(f"; nmt: {r['timed']}" for r in rows if r["system"] == NMT)
    if peers:
        alone = ", ".join(f"{r['system']} {r['translate_s']:.1f} s" for r in peers)
        line += f"; peers: spm encode + translate + spm decode, all timed (translate alone: {alone})"
    weak = [r for r in rows if r["system"] not in VARIANTS and r["bleu"] < UNDERTRAINED_BLEU]
    if weak:
        named = ", ".join(f"{r['system']} BLEU {r['bleu']:.2f}" for r in weak)
        line += (
            f"\nCAUTION: under-trained model(s) ({named}; below {UNDERTRAINED_BLEU:g}): a model that does not yet "
            "translate stops at other lengths and in other ways than a trained one, so these words/s do not compare "
            "decoders; train each for minutes (--rounds x --window-seconds; issue 15's command trains 4 minutes)"
        )
    return line


def table(rows: list[dict]) -> list[str]:
    """The markdown table of ``relate``d rows (the int8 and float32 rows' BLEU change and speed-up against nmt)."""
    out = ["| system | beam | BLEU | output words | wall s | words/s | nmt / peer |"]
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        bleu, ratio = f"{r['bleu']:.2f}", "–"
        if "bleu_change" in r:
            bleu += f" ({r['bleu_change']:+.2f})"
            ratio = f"{r['speedup']:.2f}x nmt"
        elif "nmt_over_peer" in r:
            ratio = f"{r['nmt_over_peer']:.2f}x"
            if "int8_over_peer" in r:
                ratio += f" (int8 {r['int8_over_peer']:.2f}x)"
        cells = [r["system"], r["beam"], bleu, f"{r['words']:,}", f"{r['wall_s']:.1f}", f"{r['words_s']:,.0f}", ratio]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return out
