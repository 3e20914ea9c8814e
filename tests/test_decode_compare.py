"""The decoding comparison of ``scripts/benchmark.py --compare`` (scripts/decode_compare.py), without the peers.

The peer toolkits live in /tmp/peers (scripts/install_peers.sh) and are never needed here: what is
tested is everything around their CLIs. Word counting and the comparison table; the checkpoint the
benchmark's ``NmtRun`` saves after training (a normal nmt checkpoint) decoded end to end by the nmt
job (``python -m nmt.translate``, float and int8); and a peer job's sentencepiece encode/decode
around a stand-in translate command that copies its input, so the pieces must come back as text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import sentencepiece as spm
import yaml

from helpers import REPO, TINY

sys.path.insert(0, str(REPO / "scripts"))
import decode_compare  # noqa: E402

from nmt import checkpoint  # noqa: E402


def test_count_words_counts_whitespace_words_of_every_line():
    assert decode_compare.count_words(["a b", "", "  c\td  e ", "¿Qué tal?"]) == 7
    assert decode_compare.count_words([]) == 0


def _row(system: str, bleu: float, words: int, wall: float) -> dict:
    return {"system": system, "beam": 5, "bleu": bleu, "words": words, "wall_s": wall, "words_s": words / wall}


def test_relate_gives_nmt_over_peer_and_the_int8_and_float32_changes():
    rows = decode_compare.relate(
        [
            _row("nmt", 20.0, 1000, 10.0),
            _row("nmt int8", 19.8, 1000, 8.0),
            _row("nmt float32", 20.1, 1000, 20.0),
            _row("onmt", 18.0, 900, 18.0),
        ]
    )
    nmt, int8, f32, onmt = rows
    assert onmt["nmt_over_peer"] == pytest.approx(100.0 / 50.0)
    assert onmt["int8_over_peer"] == pytest.approx(125.0 / 50.0)
    assert int8["bleu_change"] == pytest.approx(-0.2)
    assert int8["speedup"] == pytest.approx(125.0 / 100.0)
    assert "nmt_over_peer" not in nmt and "bleu_change" not in nmt
    lines = decode_compare.table(rows)
    assert lines[0] == "| system | beam | BLEU | output words | wall s | words/s | nmt / peer |"
    assert len(lines) == 2 + len(rows)
    assert "| onmt | 5 | 18.00 | 900 | 18.0 | 50 | 2.00x (int8 2.50x) |" in lines
    assert "| nmt int8 | 5 | 19.80 (-0.20) | 1,000 | 8.0 | 125 | 1.25x nmt |" in lines
    # float32 products (amp=none) beside the default: its BLEU change and speed against the nmt row
    assert f32["bleu_change"] == pytest.approx(0.1) and f32["speedup"] == pytest.approx(0.5)
    assert "nmt_over_peer" not in f32 and "| nmt float32 | 5 | 20.10 (+0.10) | 1,000 | 20.0 | 50 | 0.50x nmt |" in lines
    described = [
        {**r, "sentences": 3, "trained": {"trained_s": 1, "updates": 2}, "timed": "t", "translate_s": 1.0} for r in rows
    ]
    trained = decode_compare.summary(described, 1).split("(trained: ")[1].split(")")[0]
    assert "nmt float32" not in trained and "nmt int8" not in trained and trained.startswith("nmt 1 s")


def test_the_summary_cautions_when_a_compared_model_is_under_trained():
    def described(nmt_bleu, peer_bleu, int8_bleu):
        rows = [
            _row("nmt", nmt_bleu, 1000, 10.0),
            _row("nmt int8", int8_bleu, 1000, 8.0),
            _row("onmt", peer_bleu, 400, 9.0),
        ]
        extra = {"sentences": 3, "trained": {"trained_s": 34, "updates": 38}, "timed": "t", "translate_s": 1.0}
        return [{**r, **extra} for r in decode_compare.relate(rows)]

    assert "CAUTION" not in decode_compare.summary(described(20.0, 18.0, 19.8), 1)
    said = decode_compare.summary(described(20.0, 0.09, 19.8), 1)
    assert "CAUTION" in said.splitlines()[-1] and "(onmt BLEU 0.09;" in said and "(nmt BLEU" not in said
    # the nmt variants follow the nmt row; only the systems compared are judged
    said = decode_compare.summary(described(0.74, 0.09, 0.5), 1)
    assert "(nmt BLEU 0.74, onmt BLEU 0.09;" in said and "nmt int8 BLEU" not in said


def test_relate_without_int8_or_without_nmt_leaves_those_comparisons_out():
    (peer,) = decode_compare.relate([_row("joey", 1.0, 10, 1.0)])
    assert "nmt_over_peer" not in peer
    nmt, peer = decode_compare.relate([_row("nmt", 2.0, 30, 1.0), _row("joey", 1.0, 10, 1.0)])
    assert peer["nmt_over_peer"] == pytest.approx(3.0) and "int8_over_peer" not in peer


def test_joey_translate_config_sets_only_the_testing_section(tmp_path):
    train = tmp_path / "joey.yaml"
    train.write_text("name: r\ndata: {src: {lang: en}}\ntesting: {beam_size: 1, eval_metrics: [bleu]}\n")
    out = decode_compare.joey_translate_config(train, tmp_path / "7.ckpt", 5, tmp_path / "d" / "t.yaml")
    cfg = yaml.safe_load(out.read_text())
    assert cfg["name"] == "r" and cfg["data"] == {"src": {"lang": "en"}}
    t = cfg["testing"]
    assert t["load_model"] == str(tmp_path / "7.ckpt") and t["beam_size"] == 5 and t["n_best"] == 1
    assert t["eval_metrics"] == ["bleu"]


@pytest.fixture(scope="module")
def bench_checkpoint(sample_dir, tmp_path_factory):
    """A tiny model trained a few steps by the benchmark's NmtRun, saved by it: (NmtRun, best.pt)."""
    import benchmark

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NMT_CACHE", str(tmp_path_factory.mktemp("cache")))
        args = SimpleNamespace(device="cpu", data=str(sample_dir), warmup=2)
        run = benchmark.NmtRun("tiny", [*TINY, "trainer.amp=none"], args)
        run.window(steps=3)
        yield run, run.save()


def test_nmtrun_saves_a_normal_nmt_checkpoint(bench_checkpoint):
    run, best = bench_checkpoint
    assert best == run.rundir.best and run.rundir.last.is_file()
    ck = checkpoint.load(best)
    assert ck["progress"]["step"] == 2 + 3  # warm-up + the window
    assert ck["progress"]["elapsed_s"] == pytest.approx(run.trained_s) and run.trained_s > 0
    assert "optimizer" not in ck and "optimizer" in checkpoint.load(run.rundir.last)
    assert ck["shortlist"]["sizes"] == [500, 20]  # as the end of a real run stores it (trainer.shortlist)


def test_nmt_jobs_and_a_peer_pipeline_decode_end_to_end(bench_checkpoint, sample_dir, tmp_path):
    run, best = bench_checkpoint
    from nmt.data.corpus import load_pairs

    pairs = load_pairs(run.specs["valid"], limit=12)
    src = decode_compare.write_lines(tmp_path / "src.txt", [s for s, _ in pairs])
    refs = [t for _, t in pairs]
    model = tmp_path / "spm.model"
    model.write_bytes(run.tok.src_proto)
    # A peer whose "translate" command copies the pieces it is given: what comes out is the source again.
    copy = [sys.executable, "-c", "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])"]
    copy += [str(tmp_path / "echo.src.sp"), str(tmp_path / "echo.b2.sp")]
    echo = decode_compare._peer_job(
        "echo", Path(sys.executable).parent.parent, decode_compare.Step(copy), model, model, src, tmp_path, 2
    )
    jobs = [
        decode_compare.nmt_job(best, src, tmp_path, 2),
        decode_compare.nmt_job(best, src, tmp_path, 2, quantize="int8", stop="early"),
        decode_compare.nmt_job(best, src, tmp_path, 2, shortlist=True),
        echo,
    ]
    for job in jobs:
        job.trained = {"trained_s": 1.0, "updates": 5}  # as benchmark.compare_decoding sets it
    rows = decode_compare.measure(jobs, src, refs, rounds=1, logs=tmp_path)
    assert [r["system"] for r in rows] == ["nmt", "nmt int8", "nmt shortlist", "echo"]
    for r, job in zip(rows, jobs, strict=True):
        hyps = decode_compare.read_lines(job.hypotheses)
        assert len(hyps) == len(pairs) == r["sentences"]
        assert r["words"] == decode_compare.count_words(hyps)
        assert r["words_s"] == pytest.approx(r["words"] / r["wall_s"])
        assert 0.0 <= r["bleu"] <= 100.0 and r["wall_s"] >= r["translate_s"] > 0
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert decode_compare.read_lines(echo.hypotheses) == [sp.decode(sp.encode(s)) for s, _ in pairs]
    assert rows[1]["bleu_change"] == pytest.approx(rows[1]["bleu"] - rows[0]["bleu"])
    assert rows[2]["bleu_change"] == pytest.approx(rows[2]["bleu"] - rows[0]["bleu"])
    assert "shortlist=true" in jobs[2].steps[0].cmd and "shortlist=true" not in jobs[0].steps[0].cmd
    assert rows[3]["nmt_over_peer"] == pytest.approx(rows[0]["words_s"] / rows[3]["words_s"])
    said = decode_compare.summary(rows, 1)
    assert f"({len(pairs)} sentences)" in said and "echo 1 s / 5 updates" in said and "nmt int8" not in said
    assert f"translate alone: echo {rows[3]['translate_s']:.1f} s" in said
    assert "nmt: python -m nmt.translate stop=exact" in said
    assert "stop=early" in jobs[1].steps[0].cmd and "stop=exact" in jobs[0].steps[0].cmd


def test_the_one_process_row_runs_the_default_search_with_workers_1(tmp_path):
    job = decode_compare.nmt_job(tmp_path / "best.pt", tmp_path / "src.txt", tmp_path, 5, workers=1)
    assert job.system == decode_compare.ONE and "workers=1" in job.steps[0].cmd
    default = decode_compare.nmt_job(tmp_path / "best.pt", tmp_path / "src.txt", tmp_path, 5)
    assert default.system == decode_compare.NMT and not any(a.startswith("workers=") for a in default.steps[0].cmd)


def test_peers_hear_sigint_when_the_benchmark_runs_in_the_background():
    """A shell starts background jobs with SIGINT ignored; the peers must still get Python's default
    (KeyboardInterrupt, on which Joey NMT saves), or stop_and_save waits for a checkpoint in vain."""
    import signal
    import subprocess

    import compare_peers

    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    probe = [sys.executable, "-c", code]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under `nohup ... &`
    try:
        inherited = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
        restored = subprocess.run(
            probe, capture_output=True, text=True, check=True, preexec_fn=compare_peers._default_sigint
        ).stdout.strip()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert inherited == "False"  # the trap itself, so the test can fail
    assert restored == "True"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_peers_and_decoders_get_the_pinned_cores_not_the_whole_machine():
    """Under ``taskset -c 0,1`` on a 16-core machine (the GPU machine's Xeon, session 18) the peers would have
    been given OMP_NUM_THREADS=16 (os.cpu_count()) for 2 cores; the thread count follows the affinity mask."""
    code = (
        "import os, sys; sys.path.insert(0, 'scripts'); os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "import decode_compare; print(decode_compare.usable_cpus(), decode_compare.decode_env()['OMP_NUM_THREADS'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.split()
    assert out == ["1", "1"]


def test_the_nmt_job_keeps_the_callers_pythonpath_behind_the_repository(monkeypatch, tmp_path):
    """On the GPU machine nmt's dependencies sit in a --target folder on PYTHONPATH; the decode job used to
    replace PYTHONPATH with the repository alone, and nmt.translate died on 'No module named omegaconf'."""
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    job = decode_compare.nmt_job(tmp_path / "best.pt", tmp_path / "src.txt", tmp_path, 5)
    assert job.env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/tmp/site"]
    monkeypatch.delenv("PYTHONPATH")
    assert decode_compare.nmt_job(tmp_path / "best.pt", tmp_path / "src.txt", tmp_path, 5).env["PYTHONPATH"] == str(
        REPO
    )


def test_decode_only_decodes_the_saved_models_of_a_compare_run_again(bench_checkpoint, tmp_path):
    """--compare leaves its decoded models named in models.json; --decode-only decodes them again with this
    checkout's nmt.translate, without training: every nmt row, from the saved checkpoint."""
    import benchmark

    run, _ = bench_checkpoint
    out = tmp_path / "decode"
    args = SimpleNamespace(device="cpu", decode_sentences=12, decode_beam=2, decode_stop="exact", decode_rounds=1)
    manifest = benchmark.save_for_decoding(run, [], args, out)
    assert json.loads((out / benchmark.MANIFEST).read_text()) == manifest
    assert Path(manifest["nmt"]["checkpoint"]).parent == out / "nmt"  # outlives the run's temporary folder
    assert manifest["nmt"]["updates"] == run.steps and len(decode_compare.read_lines(out / "valid.raw.ref")) == 12
    cmd = [sys.executable, str(REPO / "scripts" / "benchmark.py"), "--decode-only", str(out / benchmark.MANIFEST)]
    cmd += ["--decode-rounds", "1", "--decode-beam", "2", "--json", str(tmp_path / "again.json")]
    env = {**os.environ, "NMT_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "again.json").read_text())["decode"]
    assert [r["system"] for r in rows] == ["nmt", "nmt shortlist", "nmt int8", "nmt float32", "nmt 1 process"]
    assert all(r["sentences"] == 12 and r["trained"]["updates"] == run.steps for r in rows)
    assert "| nmt int8 | 2 |" in proc.stdout and f"(12 sentences) with the models saved in {out}" in proc.stdout
    ones = {r["system"]: decode_compare.read_lines(out / f"{r['system'].replace(' ', '_')}.b2.txt") for r in rows}
    assert ones["nmt"] == ones["nmt 1 process"]  # one process or several: the same search
    # A missing manifest or model is a one-line error.
    (out / "nmt" / "best.pt").unlink()
    bad = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert bad.returncode != 0 and "saved model(s) not found" in bad.stderr and "Traceback" not in bad.stderr
