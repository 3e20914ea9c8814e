"""The whole path a user takes, through the real CLIs: train → checkpoint → translate / evaluate → resume."""

from __future__ import annotations

import json
import logging
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, TINY, compose_cfg, env, run_module, source_file
from nmt import allocator, checkpoint


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_training_writes_checkpoints_metrics_and_the_loss_falls(trained):
    run, _, proc = trained
    assert (run / "checkpoints" / "best.pt").is_file() and (run / "checkpoints" / "last.pt").is_file()
    recs = records(run)
    assert [r["step"] for r in recs] == [40, 80, 120]  # every valid_every steps; the last is the end-of-run one
    for r in recs:
        assert {"step", "bleu", "chrf", "loss", "tgt_tokens_per_s"} <= set(r)
        assert r["tgt_tokens_per_s"] > 0
    peaks = [r["peak_memory_mib"] for r in recs]  # the process's maximum resident set so far: torch alone is more
    assert 100 < peaks[0] <= peaks[1] <= peaks[2] < 8192, peaks
    if allocator.GLIBC:  # the C library's heap at each validation (nmt.allocator.heap_stats)
        assert all(0 <= r["heap_free_mib"] <= r["heap_mib"] and r["heap_free_chunks"] >= 0 for r in recs), recs
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.3, [r["loss"] for r in recs]
    assert recs[-1]["train_loss"] < recs[0]["train_loss"]
    ckpt = checkpoint.load(run / "checkpoints" / "last.pt")
    assert ckpt["progress"]["step"] == 120 and ckpt["config"]["trainer"]["max_steps"] == 120
    assert "stopping: reached trainer.max_steps=120" in proc.stderr
    plots = sorted((run / "attention").glob("*.png"))  # 3 sentences at each of the 3 validations
    assert len(plots) == 9 and all(p.stat().st_size > 2000 for p in plots)


def test_translate_cli_gives_one_line_per_input_line(trained, tmp_path):
    run, cache, _ = trained
    lines = ["Tom is here.", "", "   ", "I like cats.", "word " * 2000, "Where is the station?"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    for beam in (1, 4):
        proc = run_module(
            "nmt.translate",
            [f"checkpoint={run}/checkpoints/best.pt", f"input={src}", f"output={out}", f"beam_size={beam}"],
            cache,
        )
        got = out.read_text(encoding="utf-8").split("\n")
        assert got[-1] == "" and len(got[:-1]) == len(lines)
        assert got[1] == "" and got[2] == ""  # empty and blank inputs give empty outputs
        assert all(got[i].strip() for i in (0, 3, 4, 5))
        assert "truncated" in proc.stderr  # the 10,000-character line
    piped = run_module("nmt.translate", [f"checkpoint={run}/checkpoints/best.pt"], cache, stdin="I like cats.\n\nOk.\n")
    assert len(piped.stdout.split("\n")) == 4 and piped.stdout.split("\n")[1] == ""


def test_translate_runs_alike_with_and_without_hydras_run_machinery(trained):
    """A single nmt.translate runs its task on the checked config directly (nmt.cli.runs_in_place); a hydra.*
    override sends it through Hydra's main as before: the same translations and the same log lines."""
    run, cache, _ = trained
    args, text = [f"checkpoint={run}/checkpoints/best.pt", "beam_size=2"], "Tom is here.\nI like cats.\n"
    run_module("nmt.translate", args, cache, stdin=text)  # caches amp=auto's choice, so both runs below read it
    direct = run_module("nmt.translate", args, cache, stdin=text)
    via_hydra = run_module("nmt.translate", [*args, "hydra.job.name=translate"], cache, stdin=text)
    assert direct.stdout == via_hydra.stdout and len(direct.stdout.splitlines()) == 2

    def messages(proc):  # "[time][logger][LEVEL] - message" without the time, nor a per-process timing
        lines = [line.split("]", 1)[1] for line in proc.stderr.splitlines() if line.startswith("[")]
        return [re.sub(r"measured \d+\.\d+x as fast", "measured ?x as fast", line) for line in lines]

    assert messages(direct) == messages(via_hydra) and "[nmt.translate][INFO] - translated 2 lines" in messages(direct)


def test_how_a_file_is_cut_into_batches_never_changes_the_translations(trained, tmp_path, sample_dir):
    """translate reads a file in batch_size lines (default 1000) and sorts each batch by length into
    searches; the same lines come out, in order, whatever the cut (and in the same order as given)."""
    run, cache, _ = trained
    lines, src = source_file(sample_dir, tmp_path, 45)
    outs = []
    for bs in ("7", "1000"):
        out = tmp_path / f"out{bs}.txt"
        args = [
            f"checkpoint={run}/checkpoints/best.pt",
            f"input={src}",
            f"output={out}",
            "amp=none",
            f"batch_size={bs}",
        ]
        run_module("nmt.translate", args, cache)
        outs.append(out.read_text(encoding="utf-8").splitlines())
    assert outs[0] == outs[1] and len(outs[0]) == len(lines)


def test_tensorboard_gets_every_validation_and_the_progress_lines(trained):
    """trainer.tensorboard=true: the validation records as scalars under their metrics.jsonl names, the
    progress lines' train loss / lr / tokens per second (every trainer.log_every=10 steps) as progress/*, and
    the attention heatmaps as images."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _, proc = trained
    assert f"tensorboard: logging to {run}/tensorboard" in proc.stderr
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    recs = records(run)
    for key in ("bleu", "chrf", "loss", "train_loss"):
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert got == [(r["step"], pytest.approx(r[key], rel=1e-6, abs=1e-6)) for r in recs], key
    assert [e.step for e in events.Scalars("progress/train_loss")] == list(range(10, 121, 10))
    assert {"progress/lr", "progress/tgt_tokens_per_s"} <= set(events.Tags()["scalars"])
    # the attention heatmaps the fixture draws (trainer.plot_attention's default, 3 per validation)
    heatmaps = events.Images("attention/sent0")
    assert [e.step for e in heatmaps] == [r["step"] for r in recs] and heatmaps[0].width > 100


def test_several_decoding_processes_give_the_same_translations(trained, tmp_path, sample_dir):
    """workers=N splits a file's lines over N forked one-thread processes: the same n-best lists, scores and
    attention matrices come back, in input order, as from one process; nmt.evaluate likewise, there sampling
    (sample=true): each line draws from its own generator, so its sample does not depend on the process."""
    run, cache, _ = trained
    lines, src = source_file(sample_dir, tmp_path, 45)
    got = {}
    for workers in (1, 3):
        out, att = tmp_path / f"out{workers}.txt", tmp_path / f"att{workers}.jsonl"
        args = [f"checkpoint={run}/checkpoints/best.pt", f"input={src}", f"output={out}", f"attention_out={att}"]
        args += ["amp=none", "beam_size=3", "n_best=2", "batch_size=10", f"workers={workers}"]
        proc = run_module("nmt.translate", args, cache)
        assert ("decoding in 3 processes of one thread each" in proc.stderr) == (workers == 3), proc.stderr[-2000:]
        got[workers] = (out.read_text(encoding="utf-8"), [json.loads(x) for x in att.read_text().splitlines()])
    (text1, att1), (text3, att3) = got[1], got[3]
    assert text1 == text3 and text1.count("\n\n") == len(lines)
    assert [(r["line"], r["src"], r["tgt"]) for r in att1] == [(r["line"], r["src"], r["tgt"]) for r in att3]
    assert [r["line"] for r in att1] == list(range(len(lines)))
    for a, b in zip(att1, att3):  # one thread per process here, maybe more in one: the last bits may differ
        assert torch.allclose(torch.tensor(a["attention"]), torch.tensor(b["attention"]), atol=1e-5)
    scores, hyps = [], []
    for workers in (1, 2):
        js, hy = tmp_path / f"scores{workers}.json", tmp_path / f"hyps{workers}.txt"
        args = [f"checkpoint={run}/checkpoints/best.pt", f"input={sample_dir}/test.tsv", "amp=none"]
        args += [
            "sample=true",
            "sample_topk=20",
            "sample_seed=7",
            f"workers={workers}",
            f"json={js}",
            f"hypotheses={hy}",
        ]
        proc = run_module("nmt.evaluate", args, cache)
        assert "sampling at temperature 1 from top-k 20, sample_seed=7" in proc.stderr, proc.stderr[-2000:]
        assert "lines, sampled, seed 7)" in proc.stdout
        scores.append(json.loads(js.read_text()))
        hyps.append(hy.read_text(encoding="utf-8"))
    assert hyps[0] == hyps[1] and scores[0]["bleu"] == scores[1]["bleu"] and scores[0]["chrf"] == scores[1]["chrf"]
    assert scores[0]["sample"] is True and scores[0]["sample_topk"] == 20 and scores[0]["sample_seed"] == 7


def test_evaluate_cli_reports_scores_with_signatures(trained, tmp_path, sample_dir):
    run, cache, _ = trained
    js = tmp_path / "scores.json"
    proc = run_module(
        "nmt.evaluate",
        [f"checkpoint={run}/checkpoints/best.pt", f"input={sample_dir}/test.tsv", "beam_size=2", f"json={js}"],
        cache,
    )
    assert "BLEU" in proc.stdout and "nrefs:1" in proc.stdout and "TER" in proc.stdout
    s = json.loads(js.read_text())
    assert s["lines"] == 200 and 0 <= s["bleu"] <= 100 and s["chrf"] > 0


def test_an_evaluate_sweep_ends_with_one_table_and_one_json_and_leaves_no_folders(trained, tmp_path, sample_dir):
    """nmt.evaluate -m (the way translate's -m refusal points to for comparing search settings) printed one table per
    job and nothing comparing them, each job wrote json= over the last, and it left multirun/DATE/TIME/0..N empty
    in the folder it ran from: now the last lines table every job, best BLEU first, json= lists them all, and the
    empty folders are gone."""
    run, cache, _ = trained
    proc = run_module(
        "nmt.evaluate",
        [
            "-m",
            f"checkpoint={run}/checkpoints/best.pt",
            f"input={sample_dir}/valid.tsv",
            "beam_size=1,3",
            "json=all.json",
        ],
        cache,
        cwd=tmp_path,
    )
    each = [float(b) for b in re.findall(r"^\| BLEU \| ([\d.]+) \|", proc.stdout, re.M)]
    assert len(each) == 2
    table = proc.stdout[proc.stdout.index(f"2 evaluations on {sample_dir}/valid.tsv, best BLEU first:") :].splitlines()
    assert table[1] == "| beam_size | BLEU | chrF | TER | lines |"  # the swept key only: checkpoint= was one value
    rows = [r.split(" | ") for r in table[3:5]]
    assert sorted(r[0].strip("| ") for r in rows) == ["1", "3"] and [float(r[1]) for r in rows] == sorted(each)[::-1]
    listed = json.loads((tmp_path / "all.json").read_text())
    assert [r["overrides"]["beam_size"] for r in listed] == ["1", "3"] and [r["bleu"] for r in listed] == each
    assert [r["beam_size"] for r in listed] == [1, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.json"]  # no multirun/ left behind


def test_resume_continues_from_the_saved_step(trained, tmp_path):
    run, cache, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    proc = run_module(
        "nmt.train",
        [
            f"data.dir={checkpoint_data_dir(copy)}",
            *TINY,
            "trainer.max_steps=140",
            "trainer.valid_every=40",
            "trainer.resume=true",
            # with wandb on (offline): a resume imports the corpus code first in the forked DataLoader worker
            # unless the main process has (its tokenizer comes from the checkpoint), and wandb's import hooks
            # then raised ForkedError there (found 2026-11-27)
            "wandb.mode=offline",
            f"hydra.run.dir={copy}",
        ],
        cache,
    )
    assert "resuming from" in proc.stderr and "step 120" in proc.stderr
    assert [r["step"] for r in records(copy)] == [40, 80, 120, 140]


def test_init_from_starts_a_new_run_from_a_checkpoints_weights_and_pieces(trained, tmp_path, sample_dir):
    """Fine-tuning: trainer.init_from takes the weights and sentencepiece pieces of another run's checkpoint, with
    a fresh optimiser and step count; a dropout rate may differ. At a learning rate of 1e-12 the weights barely
    move, so the new run's last.pt must still hold best.pt's weights (a model initialised afresh would not)."""
    run, cache, _ = trained
    best = checkpoint.load(run / "checkpoints" / "best.pt")
    new = tmp_path / "ft"
    tiny = [x for x in TINY if not x.startswith("trainer.lr=")]
    args = [f"data.dir={sample_dir}", *tiny, "trainer.lr=1e-12", "trainer.max_steps=3", "encoder.dropout=0.3"]
    proc = run_module(
        "nmt.train", [*args, f"trainer.init_from={run}/checkpoints/best.pt", f"hydra.run.dir={new}"], cache
    )
    step = best["progress"]["step"]
    assert f"initialised from {run}/checkpoints/best.pt (step {step} of its run)" in proc.stderr, proc.stderr[-3000:]
    # the pieces come with the weights: none trained or looked up
    assert "trained sentencepiece" not in proc.stderr and "reusing sentencepiece" not in proc.stderr
    last = checkpoint.load(new / "checkpoints" / "last.pt")
    assert last["progress"]["step"] == 3 and last["tokenizer"] == best["tokenizer"]
    for k, w in best["model"].items():
        torch.testing.assert_close(last["model"][k], w, rtol=0, atol=1e-8, msg=k)


def test_init_from_a_checkpoint_of_another_shape_names_each_differing_key(trained, sample_dir):
    """nmt.training.load_init, which nmt.train calls before the logger, sentencepiece or the model (a refusal
    then ends the command as every NmtError does: one line, exit 2, no run folder left)."""
    from nmt.config import to_plain
    from nmt.errors import ConfigError
    from nmt.training import load_init

    run, _, _ = trained
    best = str(run / "checkpoints" / "best.pt")
    same = [f"data.dir={sample_dir}", *TINY, "encoder.dropout=0.5", "tokenizer.sample_alpha=0.1"]
    assert load_init(best, to_plain(compose_cfg(same)))["progress"]["step"] > 0  # these may differ
    other = to_plain(compose_cfg([*same, "encoder.hidden_size=48", "tokenizer.vocab_size=400"]))
    with pytest.raises(ConfigError) as e:
        load_init(best, other)
    (line,) = str(e.value).splitlines()
    assert "(encoder.hidden_size=32 there, 48 here; tokenizer.vocab_size=300 there, 400 here)" in line, line


def checkpoint_data_dir(run):
    return checkpoint.load(run / "checkpoints" / "last.pt")["config"]["data"]["dir"]


def test_average_ensemble_and_bootstrap_clis(trained, tmp_path, sample_dir):
    run, cache, _ = trained
    best = f"{run}/checkpoints/best.pt"
    run_module("nmt.average", [f"output={tmp_path}/avg.pt", f"checkpoints=[{best},{best}]"], cache)
    src = tmp_path / "in.txt"
    src.write_text("I like cats.\nWhere is Tom?\n\nIt is raining.\n")
    outs = {}
    for name, extra in [
        ("single", [f"checkpoint={best}"]),
        ("avg", [f"checkpoint={tmp_path}/avg.pt"]),
        ("ensemble", [f"checkpoint={best}", f"ensemble=[{best}]"]),
    ]:
        run_module("nmt.translate", [*extra, f"input={src}", f"output={tmp_path}/{name}.txt", "beam_size=3"], cache)
        outs[name] = (tmp_path / f"{name}.txt").read_text()
    assert outs["single"] == outs["avg"] == outs["ensemble"] and outs["single"].count("\n") == 4
    args = [f"checkpoint={best}", "beam_size=3", "n_best=3"]
    nbest = run_module("nmt.translate", args, cache, stdin="I like cats.\n")
    lines = nbest.stdout.split("\n")
    assert len(lines[:3]) == 3 and all("\t" in x for x in lines[:3]) and lines[3] == ""
    for baseline, significant in [(best, False), ("refs", True)]:
        if baseline == "refs":  # a "system" that outputs the references: BLEU 100, surely better
            baseline = tmp_path / "refs.txt"
            lines = (sample_dir / "test.tsv").read_text().splitlines()
            baseline.write_text("".join(x.split("\t")[1] + "\n" for x in lines))
        js = tmp_path / "cmp.json"
        args = [
            f"checkpoint={best}",
            f"input={sample_dir}/test.tsv",
            "beam_size=2",
            f"baseline={baseline}",
            "bootstrap_samples=200",
            f"json={js}",
        ]
        proc = run_module("nmt.evaluate", args, cache)
        pb = json.loads(js.read_text())["paired_bootstrap"]
        assert pb["significant_at_0.05"] == significant and "paired bootstrap" in proc.stdout
        # the system's BLEU on all lines, as in the table above it, then the resamples' mean
        said = f"baseline BLEU {pb['baseline_bleu']:.2f}, system {pb['system_bleu']:.2f} (over the resamples "
        assert said in proc.stdout and f"| BLEU | {pb['system_bleu']:.2f} |" in proc.stdout, proc.stdout
    assert pb["baseline_bleu"] == 100.0 and pb["p_value"] < 0.05


def test_average_says_when_a_run_has_fewer_checkpoints_than_asked(tmp_path, caplog):
    """``nmt.average run_dir=DIR last=5`` on a run that kept two step_N.pt averages those two and says so."""
    from nmt.average import newest

    (tmp_path / "checkpoints").mkdir()
    for step in (10, 2):
        (tmp_path / "checkpoints" / f"step_{step}.pt").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="nmt.average"):
        paths = newest(str(tmp_path), 5)
    assert [Path(p).name for p in paths] == ["step_2.pt", "step_10.pt"]
    assert f"last=5: {tmp_path}/checkpoints has only 2 step_N.pt; averaging those" in caplog.text
    caplog.clear()
    assert len(newest(str(tmp_path), 1)) == 1 and caplog.text == ""


def test_translate_at_a_prompt_says_that_it_waits_and_answers_each_line(trained):
    """From a terminal (a pseudo-terminal here) the command says it is waiting for input and how to end it,
    then answers each line as it is typed; from a pipe it says nothing of the kind (the other tests)."""
    run, cache, _ = trained
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt.translate", f"checkpoint={run}/checkpoints/best.pt", "beam_size=1"],
        cwd=REPO,
        env={**env(cache), "PYTHONPATH": str(REPO)},
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(follower)
    os.write(leader, b"I like cats.\n")
    line = proc.stdout.readline()  # answered before the input ends
    os.write(leader, b"\x04")  # Ctrl-D
    out, err = proc.communicate(timeout=120)
    os.close(leader)
    assert line.strip() and out == "" and proc.returncode == 0, err[-2000:]
    assert "type a line and press Enter to translate it; Ctrl-D" in err and "translated 1 line" in err
