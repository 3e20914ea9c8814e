"""The end of a run: trainer.average_last writes averaged.pt (the mean of the newest step_N.pt), and
trainer.tune_decoding stores the beam size / length penalty chosen on valid in the checkpoints, which
nmt.translate / evaluate / serve then decode with unless told otherwise."""

from __future__ import annotations

import json
import logging
import re
import shutil
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from helpers import TINY, run_module
from nmt import checkpoint
from nmt.config import DecodeConfig, TrainConfig, validate
from nmt.data.tokenizer import Tokenizer
from nmt.distributed import Dist
from nmt.errors import ConfigError, NmtError
from nmt.finishing import DecodingGrid, Finished, choose_decoding, choose_stop
from nmt.rundir import FINISHING_KEYS, RunDir, step_name
from nmt.runner import finish
from nmt.runtime import load_translator, search_options
from nmt.search import SearchOptions
from nmt.shortlist import Shortlist
from nmt.trainer import FitResult, Progress
from nmt.training import config_changes

GRID = ["trainer.tune_beam_sizes=[1,2]", "trainer.tune_length_penalties=[0.5,1.5]"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, sample_dir):
    """A tiny run that keeps and averages its 3 step checkpoints and chooses decoding on a 3-point grid."""
    root = tmp_path_factory.mktemp("finish")
    run = root / "run"
    args = [
        f"data.dir={sample_dir}",
        *TINY,
        "trainer.max_steps=60",
        "trainer.valid_every=20",
        "trainer.keep_last=3",
        "trainer.average_last=3",
        "trainer.tune_decoding=true",
        "trainer.tune_min_bleu=0",  # the tiny model scores ~0 BLEU: tuned all the same, to test the tuning
        *GRID,
        f"hydra.run.dir={run}",
    ]
    proc = run_module("nmt.train", args, root / "cache")
    return RunDir(run), root / "cache", proc


def test_averaged_pt_is_the_mean_of_the_newest_step_checkpoints(finished_run):
    rundir, _, proc = finished_run
    steps = rundir.step_checkpoints()
    assert [s for s, _ in steps] == [20, 40, 60]
    states = [checkpoint.load(p)["model"] for _, p in steps]
    averaged = checkpoint.load(rundir.averaged)
    assert "optimizer" not in averaged and "rng" not in averaged  # weights only, like best.pt
    assert averaged["model"].keys() == states[0].keys()
    for k, v in averaged["model"].items():
        if v.is_floating_point():
            mean = sum(s[k].double() for s in states) / len(states)
            torch.testing.assert_close(v, mean.to(v.dtype), msg=k)
    assert any(not torch.equal(v, states[-1][k]) for k, v in averaged["model"].items())  # not the last one again
    # Validated once, its BLEU beside best.pt's; the run's last lines name it.
    tail = "\n".join(proc.stderr.splitlines()[-5:])
    assert re.search(r"averaged step_20\.pt, step_40\.pt, step_60\.pt: valid BLEU [\d.]+ \(best\.pt [\d.]+\)", tail)
    assert str(rundir.averaged) in tail
    lines = proc.stderr.splitlines()  # why it stopped, then the finishing
    stop = next(i for i, x in enumerate(lines) if "stopping: reached trainer.max_steps=60" in x)
    assert stop < min(i for i, x in enumerate(lines) if "[nmt.finishing]" in x)


def test_decoding_defaults_are_chosen_on_the_grid_and_stored(finished_run):
    rundir, _, proc = finished_run
    for path in (rundir.best, rundir.averaged):
        d = checkpoint.load(path)["decoding"]
        assert set(d) == {"beam_size", "length_penalty", "stop", "bleu", "sentences"}
        assert (d["beam_size"], d["length_penalty"]) in {(1, 1.0), (2, 0.5), (2, 1.5)}
        assert d["stop"] in ("exact", "early") and (d["beam_size"] > 1 or d["stop"] == "exact")
        assert d["sentences"] == 40 and 0 <= d["bleu"] <= 100
        assert f"{path.name}: decoding defaults beam {d['beam_size']}" in proc.stderr
    assert "choosing decoding defaults for best.pt on 40 valid sentences (3 settings)" in proc.stderr


def test_a_vocabulary_shortlist_is_stored_in_best_pt_and_averaged_pt(finished_run):
    rundir, _, proc = finished_run
    tables = []
    for path in (rundir.best, rundir.averaged):
        ckpt = checkpoint.load(path)
        short = Shortlist.from_state_dict(ckpt["shortlist"])
        vocab = Tokenizer.from_state_dict(ckpt["tokenizer"]).src_vocab_size
        assert short.sizes == (500, 20) and short.table.shape == (vocab, 20)
        assert "decoding" in ckpt  # the decoding choice was stored beside it, not instead of it
        tables.append(short.table)
    assert torch.equal(*tables)
    assert "vocabulary shortlist: the 500 most frequent target pieces + 20 per source piece" in proc.stderr


def test_translate_and_evaluate_load_averaged_pt_and_say_which_decoding_they_use(finished_run, tmp_path, sample_dir):
    rundir, cache, _ = finished_run
    d = checkpoint.load(rundir.averaged)["decoding"]
    text = "I like cats.\nWhere is Tom?\n"
    chosen = run_module("nmt.translate", [f"checkpoint={rundir.averaged}"], cache, stdin=text)
    assert len(chosen.stdout.splitlines()) == 2
    stop = ", stop=early" if d["stop"] == "early" else ""
    line = f"decoding with beam {d['beam_size']}, length penalty {d['length_penalty']:g}{stop} (the checkpoint's choice"
    assert line in chosen.stderr
    same = [f"beam_size={d['beam_size']}", f"length_penalty={d['length_penalty']}", f"stop={d['stop']}"]
    given = run_module("nmt.translate", [f"checkpoint={rundir.averaged}", *same], cache, stdin=text)
    assert given.stdout == chosen.stdout and "(as given)" in given.stderr
    js = tmp_path / "scores.json"
    run_module("nmt.evaluate", [f"checkpoint={rundir.averaged}", f"input={sample_dir}/test.tsv", f"json={js}"], cache)
    s = json.loads(js.read_text())
    assert (s["beam_size"], s["length_penalty"], s["stop"]) == (d["beam_size"], d["length_penalty"], d["stop"])


def with_decoding(src, dst, decoding: dict | None) -> str:
    ckpt = checkpoint.load(src)
    ckpt.pop("decoding", None)
    if decoding is not None:
        ckpt["decoding"] = decoding
    checkpoint.save(dst, ckpt)
    return str(dst)


def decode_cfg(path: str, **keys) -> SimpleNamespace:
    return OmegaConf.merge(OmegaConf.structured(DecodeConfig), {"checkpoint": path, "device": "cpu", **keys})


def test_stored_defaults_change_what_translate_uses_and_an_explicit_key_wins(finished_run, tmp_path, caplog):
    rundir, _, _ = finished_run
    stored = {"beam_size": 1, "length_penalty": 0.7, "bleu": 1.0, "sentences": 40}
    tuned = with_decoding(rundir.best, tmp_path / "tuned.pt", stored)
    old = with_decoding(rundir.best, tmp_path / "old.pt", None)  # as written before decoding was stored
    with caplog.at_level(logging.INFO, logger="nmt.runtime"):
        s = load_translator(decode_cfg(tuned)).search
    assert (s.beam_size, s.alpha) == (1, 0.7)
    assert "decoding with beam 1, length penalty 0.7 (the checkpoint's choice on valid" in caplog.text
    s = load_translator(decode_cfg(old)).search
    assert (s.beam_size, s.alpha) == (5, 1.0)  # old checkpoints keep 5 / 1.0
    s = load_translator(decode_cfg(tuned, beam_size=4)).search
    assert (s.beam_size, s.alpha) == (4, 0.7)  # the key given wins, the other stays the checkpoint's
    s = load_translator(decode_cfg(tuned, beam_size=3, length_penalty=0.0)).search
    assert (s.beam_size, s.alpha) == (3, 0.0)
    # What translate produces follows: the stored beam 1 is greedy search, the default beam 5 is not.
    src = ["I like cats.", "Where is Tom?", "It is raining today in the town."]
    greedy = [t.text for t in load_translator(decode_cfg(old, beam_size=1)).translate(src)]
    assert [t.text for t in load_translator(decode_cfg(tuned)).translate(src)] == greedy


def test_search_options_resolution():
    stored = {"beam_size": 3, "length_penalty": 0.6, "bleu": 20.0, "sentences": 500}
    opts, line = search_options(decode_cfg("x.pt"), stored)
    assert (opts.beam_size, opts.alpha) == (3, 0.6) and "checkpoint's choice on valid, BLEU 20.00 on 500" in line
    opts, line = search_options(decode_cfg("x.pt", length_penalty=1.0), stored)
    assert (opts.beam_size, opts.alpha) == (3, 1.0) and "length_penalty as given, the rest the checkpoint's" in line
    opts, line = search_options(decode_cfg("x.pt"), None)
    assert (opts.beam_size, opts.alpha) == (5, 1.0) and "defaults: the checkpoint stores no choice" in line
    assert opts.stop == "exact"  # a choice stored before the stopping rule was tuned
    early = {**stored, "stop": "early"}
    opts, line = search_options(decode_cfg("x.pt"), early)
    assert opts.stop == "early" and "length penalty 0.6, stop=early (the checkpoint's choice" in line
    opts, line = search_options(decode_cfg("x.pt", stop="exact"), early)
    assert (opts.beam_size, opts.stop) == (3, "exact") and "stop as given, the rest the checkpoint's" in line
    opts, line = search_options(decode_cfg("x.pt", beam_size=2, length_penalty=1.0, stop="exact"), early)
    assert line.endswith("(as given)")
    opts, _ = search_options(decode_cfg("x.pt", n_best=4), stored)
    assert opts.beam_size == 4  # n-best needs that many beams; no beam_size was given
    with pytest.raises(ConfigError, match="n_best=4 needs beam_size >= 4"):
        search_options(decode_cfg("x.pt", n_best=4, beam_size=2), stored)


def test_choose_decoding_tries_greedy_once_and_breaks_ties_towards_the_cheaper_setting():
    grid = DecodingGrid((8, 1, 5), (1.2, 0.6, 1.0))
    points = [(o.beam_size, o.alpha) for o in grid.points()]
    assert points == [(1, 1.0), (5, 0.6), (5, 1.0), (5, 1.2), (8, 0.6), (8, 1.0), (8, 1.2)]
    flat = {(5, 0.6): 30.0, (5, 1.2): 30.0, (8, 0.6): 30.0}
    best, bleu = choose_decoding(lambda o: flat.get((o.beam_size, o.alpha), 10.0), grid)
    assert (best.beam_size, best.alpha, bleu) == (5, 1.2, 30.0)  # smaller beam first, then the penalty nearest 1.0
    best, _ = choose_decoding(lambda o: 12.0 if o.beam_size == 8 and o.alpha == 0.6 else 10.0, grid)
    assert (best.beam_size, best.alpha) == (8, 0.6)


def test_the_tuning_log_names_each_beams_length_penalties_beside_their_scores(caplog):
    caplog.set_level(logging.INFO, logger="nmt.finishing")
    choose_decoding(lambda o: o.beam_size * 10 + o.alpha, DecodingGrid((1, 2), (1.0,)))
    assert [r.getMessage() for r in caplog.records] == ["  beam 1: BLEU 11.00", "  beam 2, lp 1: BLEU 21.00"]
    caplog.clear()
    choose_decoding(lambda o: o.beam_size * 10 + o.alpha, DecodingGrid((5,), (1.2, 0.6)))
    assert [r.getMessage() for r in caplog.records] == ["  beam 5, lp 0.6 / 1.2: BLEU 50.60 / 51.20"]


def test_choose_stop_keeps_early_only_where_it_loses_no_bleu():
    exact = SearchOptions(beam_size=5, alpha=0.8)
    best, bleu = choose_stop(lambda o: 30.0, exact, 30.0)
    assert (best.stop, best.beam_size, best.alpha, bleu) == ("early", 5, 0.8, 30.0)  # a tie goes to the faster rule
    best, bleu = choose_stop(lambda o: 29.9, exact, 30.0)
    assert (best, bleu) == (exact, 30.0)
    best, bleu = choose_stop(lambda o: 30.5, exact, 30.0)
    assert (best.stop, bleu) == ("early", 30.5)
    greedy = SearchOptions(beam_size=1)
    assert choose_stop(lambda o: pytest.fail("greedy has no stopping rule to score"), greedy, 9.0) == (greedy, 9.0)


def test_average_last_needs_keep_last_and_the_grid_must_not_be_empty():
    cfg = OmegaConf.structured(TrainConfig)
    cfg.attention.name = "bahdanau"
    cfg.trainer.average_last, cfg.trainer.keep_last = 5, 2
    cfg.trainer.tune_beam_sizes = []
    cfg.trainer.shortlist_per_source = 0
    with pytest.raises(ConfigError) as e:
        validate(cfg, "train")
    lines = str(e.value).splitlines()
    assert lines == [
        "trainer.average_last=5 averages the newest step_N.pt checkpoints: needs trainer.keep_last >= 5 (got 2)",
        "trainer.tune_beam_sizes=[]: expected a list of integers >= 1",
        "trainer.shortlist_per_source=0: expected an integer >= 1 (trainer.shortlist=false stores no shortlist)",
    ]
    cfg.trainer.keep_last, cfg.trainer.tune_beam_sizes = 5, [1, 5]
    cfg.trainer.shortlist = False  # the sizes only matter when a shortlist is built
    validate(cfg, "train")


def test_average_last_without_keep_last_fails_before_any_work(tmp_path, sample_dir):
    args = [f"data.dir={sample_dir}", *TINY, "trainer.average_last=3", f"hydra.run.dir={tmp_path}/run"]
    proc = run_module("nmt.train", args, tmp_path / "cache", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("needs trainer.keep_last >= 3 (got 0)")
    assert not (tmp_path / "run").exists()


def test_runs_from_before_these_keys_resume_and_may_turn_them_on():
    saved = OmegaConf.to_container(OmegaConf.structured(TrainConfig))
    assert set(FINISHING_KEYS) <= set(saved["trainer"])  # every key the end of a run reads is a trainer.* key
    for key in FINISHING_KEYS:
        del saved["trainer"][key]
    current = OmegaConf.to_container(OmegaConf.structured(TrainConfig))
    current["trainer"]["average_last"] = 2
    assert config_changes(saved, current, []) == []


@pytest.mark.parametrize("how", ["interrupted", "fault"])
def test_an_interrupted_or_faulted_run_is_not_finished(tmp_path, how):
    calls = []
    saver = SimpleNamespace(failed=False)
    trainer = SimpleNamespace(progress=Progress(step=7, best_bleu=1.0), saver=saver, dist=Dist())
    result = FitResult("x", {}, signum=15) if how == "interrupted" else FitResult("x", {}, fault=True)
    with pytest.raises(SystemExit if how == "interrupted" else NmtError):
        finish(result, trainer, RunDir(tmp_path), [], lambda *a: calls.append(a) or Finished())
    assert calls == [] and not RunDir(tmp_path).averaged.exists()


@pytest.mark.parametrize(
    "reason,limit",
    [
        ("reached trainer.max_steps=40", "trainer.max_steps"),
        ("no BLEU gain in 5 validations (trainer.patience)", "trainer.patience"),
        ("no chrF gain in 5 validations (trainer.patience)", "trainer.patience"),
    ],
)
def test_the_last_line_says_which_key_to_raise_to_train_further(reason, limit, tmp_path, caplog):
    """A run stopped by a limit named it in its resume hint; one stopped by early stopping printed no hint, though
    trainer.patience may change on resume as max_steps may."""
    from nmt.trainer import EarlyStopping

    p = Progress(step=40, best_bleu=3.0, best_step=20, bad_validations=5)
    trainer = SimpleNamespace(
        progress=p, saver=SimpleNamespace(failed=False), dist=Dist(), stopping=EarlyStopping(), sched=None
    )
    with caplog.at_level(logging.INFO, logger="nmt.train"):
        finish(FitResult(reason, {}), trainer, RunDir(tmp_path), ["trainer.max_steps=40"])
    hint = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("to train further"))
    assert hint.startswith(f"to train further, raise {limit} and resume: python -m nmt.train ")
    assert hint.endswith(f"trainer.resume=true {limit}=...") and "scheduler=budget" not in hint


def test_recommended_checkpoint_is_the_better_one_on_valid(tmp_path):
    best, avg = tmp_path / "best.pt", tmp_path / "averaged.pt"
    done = Finished(averaged=avg, averaged_bleu=20.0)
    assert done.recommended(best, 21.0) == best and done.recommended(best, 19.0) == avg
    done.decoding = {best: {"bleu": 22.0}, avg: {"bleu": 22.5}}
    assert done.recommended(best, 21.0) == avg  # with tuned decoding, its BLEU decides
    assert Finished().recommended(best, 1.0) == best


def test_a_run_with_one_step_checkpoint_writes_no_averaged_pt(tmp_path, caplog):
    """An average of one checkpoint is a copy of it: not written, validated or tuned (a short run's finishing
    spent a minute tuning such a copy)."""
    from nmt.finishing import Finisher

    rundir = RunDir(tmp_path)
    model = torch.nn.Linear(2, 2)
    cfg = {"encoder": {}, "attention": {}, "decoder": {}}  # the parts checkpoint.average compares
    rundir.write_checkpoint("step_10.pt", {"model": model.state_dict(), "step": 10, "tokenizer": {}, "config": cfg})
    validator = SimpleNamespace(bleu=lambda *a, **k: pytest.fail("nothing should be validated"), sentences=4)
    with caplog.at_level(logging.WARNING, logger="nmt.finishing"):
        done = Finisher(rundir, average_last=3)(model, validator, Progress(step=10, best_bleu=1.0))
    assert done.averaged is None and not rundir.averaged.exists() and done.decoding == {}
    assert "the run saved only one step_N.pt, so there is nothing to average; no averaged.pt" in caplog.text
    rundir.write_checkpoint("step_20.pt", {"model": model.state_dict(), "step": 20, "tokenizer": {}, "config": cfg})
    validator.bleu = lambda *a, **k: 3.0
    done = Finisher(rundir, average_last=3)(model, validator, Progress(step=20, best_bleu=1.0))
    assert done.averaged == rundir.averaged and done.averaged_bleu == 3.0  # two are averaged
    assert "trainer.average_last=3: the run has only 2 step_N.pt" in caplog.text


def test_a_checkpoint_below_tune_min_bleu_gets_no_decoding_defaults_but_keeps_its_shortlist(tmp_path, caplog):
    """A 30-step run (valid BLEU 0.44) spent 25 s decoding the 13 settings, and the tie-break stored greedy
    search. Below trainer.tune_min_bleu nothing is chosen; the shortlist is still stored."""
    from nmt.finishing import Finisher

    rundir = RunDir(tmp_path)
    model = torch.nn.Linear(2, 2)
    rundir.write_checkpoint("best.pt", {"model": model.state_dict(), "step": 10, "tokenizer": {}, "config": {}})
    short = Shortlist(torch.arange(6), torch.full((3, 2), 3), (6, 2))
    validator = SimpleNamespace(bleu=lambda *a, **k: pytest.fail("nothing should be decoded"), sentences=4)
    finisher = Finisher(rundir, grid=DecodingGrid(beam_sizes=(1, 2)), shortlist=lambda: short, min_bleu=1.0)
    with caplog.at_level(logging.INFO, logger="nmt.finishing"):
        done = finisher(model, validator, Progress(step=10, best_bleu=0.44))
    assert done.decoding == {} and "decoding" not in checkpoint.load(rundir.best)
    assert checkpoint.load(rundir.best)["shortlist"]["frequent"].tolist() == list(range(6))
    assert "best.pt: valid BLEU 0.44 is below trainer.tune_min_bleu=1, so no decoding defaults were chosen" in (
        caplog.text
    )
    validator.bleu = lambda *a, **k: 1.5  # at the threshold: tuned as before
    done = finisher(model, validator, Progress(step=10, best_bleu=1.0))
    assert done.decoding[rundir.best]["bleu"] == 1.5 and checkpoint.load(rundir.best)["decoding"]["beam_size"] == 1


def test_tune_min_bleu_is_a_bleu_score():
    cfg = OmegaConf.structured(TrainConfig)
    cfg.attention.name = "bahdanau"
    cfg.trainer.tune_min_bleu = -1
    with pytest.raises(ConfigError, match=r"trainer.tune_min_bleu=-1.0: expected a BLEU score in \[0, 100\]"):
        validate(cfg, "train")


def test_a_resume_that_trains_no_further_keeps_the_end_of_the_run(finished_run, tmp_path):
    """Resuming a run that had reached its limit used to redo the averaging, the shortlist and the decoding grid
    (minutes on the real corpus) for the same files. finished.json records them; a resume at the same step with
    the same settings keeps them (a moved run folder too), other settings do the end again."""
    rundir, cache, _ = finished_run
    moved = RunDir(tmp_path / "moved")
    shutil.copytree(rundir.root, moved.root)
    args = finished_args(rundir) + [f"hydra.run.dir={moved.root}", "trainer.resume=true"]
    before = {p: p.read_bytes() for p in (moved.best, moved.averaged)}
    again = run_module("nmt.train", args, cache)
    assert "the end of this run was done when it stopped at step 60 before, with the same settings" in again.stderr
    assert "choosing decoding defaults" not in again.stderr and "vocabulary shortlist:" not in again.stderr
    assert {p: p.read_bytes() for p in before} == before
    d = checkpoint.load(moved.averaged)["decoding"]  # the last lines still name what the files hold
    assert f"{moved.averaged}; decodes with beam {d['beam_size']}" in again.stderr
    other = run_module("nmt.train", [*args, "trainer.tune_beam_sizes=[1,3]"], cache)
    assert (
        "choosing decoding defaults for best.pt" in other.stderr and "the end of this run was done" not in other.stderr
    )
    assert json.loads(moved.finished.read_text())["settings"]["tune_beam_sizes"] == [1, 3]


def finished_args(rundir: RunDir) -> list[str]:
    """finished_run's command line, less its run folder (Hydra's overrides.yaml of the run)."""
    return [o for o in rundir.overrides() if not o.startswith("hydra.run.dir=")]


def test_finished_json_is_kept_only_for_the_same_step_settings_and_files(tmp_path, caplog):
    from nmt.finishing import Finisher

    rundir = RunDir(tmp_path)
    model = torch.nn.Linear(2, 2)
    cfg = {"encoder": {}, "attention": {}, "decoder": {}}
    for step in (10, 20):
        rundir.write_checkpoint(
            step_name(step), {"model": model.state_dict(), "step": step, "tokenizer": {}, "config": cfg}
        )
    rundir.write_checkpoint("best.pt", {"model": model.state_dict(), "step": 20, "tokenizer": {}, "config": cfg})
    scored = []
    validator = SimpleNamespace(bleu=lambda *a, **k: scored.append(1) or 2.0, sentences=4)
    finisher = Finisher(rundir, average_last=2, grid=DecodingGrid(beam_sizes=(1,)))
    first = finisher(model, validator, Progress(step=20, best_bleu=1.0))
    assert first.averaged == rundir.averaged and set(first.decoding) == {rundir.best, rundir.averaged}
    n = len(scored)
    with caplog.at_level(logging.INFO, logger="nmt.finishing"):
        kept = finisher(model, validator, Progress(step=20, best_bleu=1.0))
    assert len(scored) == n and kept == first and "is kept (averaged.pt, decoding defaults of" in caplog.text
    # Anything else and the end is done again: another step, other settings, a file gone, a damaged record.
    assert finisher.done_before(Progress(step=30, best_bleu=1.0)) is None
    assert (
        Finisher(rundir, average_last=3, grid=DecodingGrid(beam_sizes=(1,))).done_before(Progress(20, best_bleu=1.0))
        is None
    )
    rundir.averaged.unlink()
    assert finisher.done_before(Progress(step=20, best_bleu=1.0)) is None
    finisher(model, validator, Progress(step=20, best_bleu=1.0))
    assert len(scored) > n and rundir.averaged.is_file()
    rundir.finished.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="nmt.rundir"):
        assert finisher.done_before(Progress(step=20, best_bleu=1.0)) is None
    assert "finished.json: not readable" in caplog.text
