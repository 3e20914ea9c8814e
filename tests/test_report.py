"""``python -m nmt.report`` on a tiny attention-zoo sweep made the documented way (two commands, the
second adding a seed), and the labelling of variants in any user sweep (nmt.sweep)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers import REPO, TINY, run_module, tiny_sweep
from nmt.config import register_configs, validate
from nmt.models.attention.registry import ATTENTIONS
from nmt.models.build import model_from_config
from nmt.sweep import Job, flatten, group, mean_spread

COLUMNS = "| attention | order | seeds | BLEU | chrF | entropy | max-share | backward | coverage | tok/s | params |"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory, sample_dir) -> tuple[Path, Path, list[Path]]:
    """experiment=attention_zoo for dot × both orders, then a second seed of dot · bahdanau into the
    same folder: (sweep, tokenizer cache, job folders)."""
    root = tmp_path_factory.mktemp("zoo")
    sweep, cache = root / "sweep", root / "cache"
    zoo = ["experiment=attention_zoo", "attention=dot", "trainer.valid_every=10"]
    tiny_sweep(sweep, [*zoo, "decoder=bahdanau,luong"], sample_dir, cache)
    jobs = tiny_sweep(sweep, [*zoo, "decoder=bahdanau", "seed=1"], sample_dir, cache)
    return sweep, cache, jobs


def table(md: str) -> dict[tuple[str, str], list[str]]:
    """report.md's main table: (attention, order) → the cells of its row."""
    lines = md.splitlines()
    start = lines.index(COLUMNS)
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], cells[1])] = cells
    return rows


def test_zoo_jobs_have_unique_folders_across_both_commands(zoo):
    _, _, jobs = zoo
    names = [j.name for j in jobs]
    assert len(names) == 3 == len(set(names)), names
    expected = ["dot_bahdanau_seed1", "dot_bahdanau_seed1234", "dot_luong_seed1234"]  # then the other overrides
    assert sorted(n.split("_data.")[0] for n in names) == expected
    orders = sorted(OmegaConf.load(j / ".hydra" / "config.yaml").decoder.order for j in jobs)
    assert orders == ["bahdanau", "bahdanau", "luong"]


def test_report_tables_variants_with_seed_spread_statistics_and_pictures(zoo):
    sweep, cache, _ = zoo
    run_module("nmt.report", [str(sweep), "--valid-sentences", "30", "--sentence", "I like cats."], cache)
    md = (sweep / "report.md").read_text()
    rows = table(md)
    assert set(rows) == {("dot", "bahdanau"), ("dot", "luong+feed")}, rows
    seeded, single = rows[("dot", "bahdanau")], rows[("dot", "luong+feed")]
    assert seeded[2] == "2" and single[2] == "1"
    assert " ± " in seeded[3] and " ± " in seeded[4] and "±" not in single[3]
    per_job = json.loads((sweep / "report.json").read_text())
    bleus = [j["bleu"] for j in per_job if j["order"] == "bahdanau"]
    mean, spread = mean_spread(bleus)
    assert seeded[3] == f"{mean:.2f} ± {spread:.2f}"
    assert sorted(j["seed"] for j in per_job if j["order"] == "bahdanau") == [1, 1234]
    for cells in rows.values():
        entropy, max_share, backward, coverage = (float(c) for c in cells[5:9])
        assert 0.0 <= entropy <= math.log(256) and 0.0 < max_share <= 1.0
        assert 0.0 <= backward <= 1.0 and 0.0 < coverage <= 1.0
        assert float(cells[9].replace(",", "")) > 0 and int(cells[10].replace(",", "")) > 0
    assert all(j["sentences"] == 30 for j in per_job)  # --valid-sentences decoded, every one measured
    for png in ("report_heatmaps.png", "report_curves.png"):
        assert (sweep / png).stat().st_size > 10_000 and f"]({png})" in md


def test_report_stops_in_one_line_when_the_valid_corpus_is_missing(zoo, tmp_path):
    sweep, cache, _ = zoo
    proc = run_module("nmt.report", [str(sweep), "--data-dir", str(tmp_path)], cache, check=False)
    assert proc.returncode == 2
    assert f"{tmp_path}/valid.tsv: corpus file not found" in proc.stderr
    assert "Traceback" not in proc.stderr and "decoding" not in proc.stderr  # before any model is loaded


def job(name: str, seed: int, **sections) -> Job:
    """A finished job as nmt.sweep reads it, without files."""
    cfg = {"seed": seed, "attention": {"name": "general"}, "decoder": {"order": "luong", "input_feeding": False}}
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return Job(Path(name), name, OmegaConf.create(cfg), [{"bleu": 1.0, "elapsed_s": 60}], flatten(cfg))


def test_a_user_sweep_is_labelled_by_the_keys_that_differ_and_grouped_over_seeds():
    jobs = [
        job("a", 1, decoder={"hidden_size": 256}),
        job("b", 2, decoder={"hidden_size": 256}),
        job("c", 1, decoder={"hidden_size": 512}),
    ]
    variants = group(jobs)
    assert [(v.attention, v.order, v.label, [j.seed for j in v.jobs]) for v in variants] == [
        ("general", "luong", "decoder.hidden_size=256", [1, 2]),
        ("general", "luong", "decoder.hidden_size=512", [1]),
    ]


def test_an_ablation_is_labelled_by_the_one_lever_each_job_changed():
    jobs = [
        job("preset", 1),
        job("preset2", 2),
        job("ln", 1, encoder={"layer_norm": True}),
        job("vocab", 1, tokenizer={"vocab_size": 4000}),
    ]
    for j in jobs:  # every job has every key, as Hydra writes them
        j.keys.setdefault("encoder.layer_norm", "False")
        j.keys.setdefault("tokenizer.vocab_size", "8000")
    labels = [(v.label, [j.name for j in v.jobs]) for v in group(jobs)]
    assert labels == [("baseline", ["preset", "preset2"]), ("encoder.layer_norm=True", ["ln"]),
                      ("tokenizer.vocab_size=4000", ["vocab"])]  # fmt: skip
    grid = [job(f"g{i}", 1, encoder={"layer_norm": a}, tokenizer={"vocab_size": b}) for i, (a, b) in
            enumerate([(True, 4000), (True, 8000), (False, 4000), (False, 8000)])]  # fmt: skip
    assert [v.label.count("=") for v in group(grid)] == [2, 2, 2, 2]  # a grid: every varied key named


def test_attention_parameters_label_variants_only_within_one_attention():
    local = {"name": "local_m", "window": 5}
    jobs = [job("dot", 1, attention={"name": "dot"}), job("local", 1, attention=local)]
    assert [v.label for v in group(jobs)] == ["", ""]  # attention.window exists for local_m only
    jobs.append(job("wide", 1, attention={**local, "window": 9}))
    assert [v.label for v in group(jobs)] == ["", "attention.window=5", "attention.window=9"]


def test_every_zoo_job_composes_validates_and_runs_forward():
    """The 20 jobs of experiment=attention_zoo (every registered attention × both orders, Luong with
    input feeding) are valid configs whose models run (tiny sizes: the structure is what is checked)."""
    register_configs()
    swept = OmegaConf.load(REPO / "configs" / "experiment" / "attention_zoo.yaml").hydra.sweeper.params
    assert sorted(swept.attention.split(",")) == sorted(ATTENTIONS) and swept.decoder == "bahdanau,luong"
    src, src_len, tgt = torch.randint(4, 100, (2, 7)), torch.tensor([7, 5]), torch.randint(4, 100, (2, 6))
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        for attention in swept.attention.split(","):
            for order in ("bahdanau", "luong"):
                over = ["experiment=attention_zoo", f"attention={attention}", f"decoder={order}", *TINY]
                cfg = compose("config", overrides=over)
                validate(cfg, "train")
                assert cfg.decoder.order == order and cfg.decoder.input_feeding and cfg.trainer.patience == 0
                logits = model_from_config(cfg, 300, 300, torch.device("cpu"))(src, src_len, tgt)[0]
                assert logits.shape == (2, 6, 300) and torch.isfinite(logits).all()


def test_a_single_run_given_as_the_folder_is_named_by_that_folder(tmp_path):
    """``nmt.report runs/x`` on one run (not a sweep) named its job '.' ("decoding 200 valid sentences with .")."""
    from nmt.rundir import RunDir
    from nmt.sweep import collect

    run = RunDir(tmp_path / "runs" / "x")
    (run.root / ".hydra").mkdir(parents=True)
    (run.root / ".hydra" / "config.yaml").write_text("seed: 1\n")
    run.metrics.write_text(json.dumps({"step": 10, "bleu": 1.0}) + "\n")
    run.best.parent.mkdir()
    run.best.write_bytes(b"")
    for where in (run.root, tmp_path / "runs"):
        jobs, skipped = collect(where)
        assert [j.name for j in jobs] == ["x"] and skipped == []


def test_the_sweep_summary_quotes_its_report_command_for_the_shell(tmp_path, capsys):
    from nmt.sweep import SweepSummary

    sweep = tmp_path / "my sweep"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "0" / ".hydra" / "config.yaml").write_text("seed: 1\n")  # a job that never validated
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"sweep {sweep}: 0 job(s) with a validation, best valid BLEU first (greedy, as validated):"
    assert lines[1].startswith("  (no result) 0: no validation in metrics.jsonl")
    assert lines[-1] == f"tables, curves and attention statistics: python -m nmt.report '{sweep}'"


def sweep_of(tmp_path: Path, jobs: dict[str, tuple[str, list[dict]]]) -> Path:
    """A sweep folder of finished jobs: name → (trainer.select_by, metrics.jsonl validations)."""
    sweep = tmp_path / "sweep"
    for name, (metric, records) in jobs.items():
        folder = sweep / name
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "config.yaml").write_text(
            f"seed: 1\nattention:\n  name: {name}\ntrainer:\n  select_by: {metric}\n"
        )
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "best.pt").write_bytes(b"")
    return sweep


def v(step: int, bleu: float, loss: float, chrf: float = 0.0) -> dict:
    return {"step": step, "bleu": bleu, "chrf": chrf, "loss": loss, "acc": 50.0}


def test_a_job_s_best_is_the_validation_its_select_by_kept_and_the_summary_ranks_by_it(tmp_path, capsys):
    """With trainer.select_by=loss, best.pt is the lowest-loss validation, not the highest-BLEU one: the
    summary and nmt.report must show that validation's step and BLEU, and rank the jobs by loss."""
    from nmt.sweep import SweepSummary, collect, ranking

    sweep = sweep_of(
        tmp_path,
        {
            "a": ("loss", [v(10, 5.0, 3.0), v(20, 9.0, 2.5), v(30, 8.0, 2.0), v(40, 7.0, 2.0)]),
            "b": ("loss", [v(10, 12.0, 2.2), v(20, 11.0, 2.4)]),
        },
    )
    jobs = {j.name: j for j in collect(sweep)[0]}
    assert jobs["a"].best["step"] == 30 and jobs["b"].best["step"] == 10  # the first lowest loss
    assert ranking(jobs.values()) == "loss"
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    lines = capsys.readouterr().err.splitlines()
    assert "best valid loss first (trainer.select_by=loss" in lines[0]
    assert lines[1].split() == ["loss", "2.0000", "BLEU", "8.00", "step", "30", "a"]
    assert lines[2].split() == ["loss", "2.2000", "BLEU", "12.00", "step", "10", "b"]


def test_jobs_selected_by_different_metrics_are_ranked_by_the_bleu_of_their_best_pt(tmp_path, capsys):
    from nmt.sweep import SweepSummary, collect, ranking

    sweep = sweep_of(
        tmp_path,
        {
            "by_bleu": ("bleu", [v(10, 5.0, 3.0), v(20, 9.0, 2.9)]),
            "by_chrf": ("chrf", [v(10, 12.0, 2.2, chrf=40.0), v(20, 11.0, 2.4, chrf=41.0)]),
        },
    )
    jobs = {j.name: j for j in collect(sweep)[0]}
    assert ranking(jobs.values()) == "bleu" and jobs["by_chrf"].best["step"] == 20
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    lines = capsys.readouterr().err.splitlines()
    assert "best valid BLEU first (greedy" in lines[0]
    assert [x.split() for x in lines[1:3]] == [["11.00", "step", "20", "by_chrf"], ["9.00", "step", "20", "by_bleu"]]


def test_report_rows_selected_by_loss_show_it_and_are_ordered_by_it(tmp_path):
    """Jobs selected by loss: report.md's table has a valid loss column (best.pt's validation) and the
    lowest loss comes first, though the other job has the higher BLEU."""
    from nmt.report import best_first, markdown, row
    from nmt.sweep import collect, group, ranking

    sweep = sweep_of(tmp_path, {"a": ("loss", [v(10, 5.0, 3.0), v(20, 9.0, 2.0)]), "b": ("loss", [v(10, 12.0, 2.5)])})
    jobs = collect(sweep)[0]
    numbers = {
        j.name: {"bleu": j.best["bleu"], "chrf": 1.0, "loss": j.best["loss"], "tgt_tokens_per_s": 1.0, "params": 1}
        | {"seed": 1, "best_step": j.best["step"], "steps": 20, "minutes": 1.0, "example": "x"}
        | dict.fromkeys(("entropy", "max_share", "backward", "coverage"), 0.5)
        for j in jobs
    }
    variants = best_first(group(jobs), ranking(jobs))
    assert [w.attention for w in variants] == ["a", "b"]
    assert [x.split("|")[6].strip() for x in (row(w, numbers, False, "loss") for w in variants)] == ["2.0000", "2.5000"]
    assert [w.attention for w in best_first(group(jobs), "bleu")] == ["b", "a"]
    md = markdown(sweep, variants, numbers, [], ["x"], 0, Path("h.png"), Path("c.png"), "loss")
    assert "| attention | order | seeds | BLEU | chrF | valid loss | entropy |" in "\n".join(md)
    assert "Rows: best first by `trainer.select_by=loss`, which every job shares." in "\n".join(md)


def test_the_report_curves_plot_the_metric_the_rows_are_ranked_by(tmp_path):
    """Jobs selected by loss: report_curves.png plots valid loss against minutes (and its caption says so), and a
    validation record without the metric (written before it was logged) is left out of the curve."""
    from nmt.report import markdown
    from nmt.sweep import collect, group, ranking

    old = {"step": 5, "bleu": 1.0, "chrf": 2.0, "elapsed_s": 30}  # no loss, no acc
    records = [old, v(10, 5.0, 3.0) | {"elapsed_s": 60}, v(20, 9.0, 2.0) | {"elapsed_s": 120}]
    sweep = sweep_of(tmp_path, {"a": ("loss", records)})
    (job,) = collect(sweep)[0]
    by = ranking([job])
    assert by == "loss" and job.curve(by) == ([1.0, 2.0], [3.0, 2.0])
    assert job.curve() == ([0.5, 1.0, 2.0], [1.0, 5.0, 9.0])  # BLEU by default, every validation
    numbers = {
        "a": {"bleu": 9.0, "chrf": 1.0, "loss": 2.0, "tgt_tokens_per_s": 1.0, "params": 1, "seed": 1, "best_step": 20}
        | {"steps": 20, "minutes": 2.0, "example": "x"}
        | dict.fromkeys(("entropy", "max_share", "backward", "coverage"), 0.5)
    }
    md = markdown(sweep, group([job]), numbers, [], ["x"], 0, Path("h.png"), Path("c.png"), by)
    assert "![valid loss (lower is better) against training minutes, every job](c.png)" in md
