"""trainer.select_by: the validation metric that picks best.pt, counts patience and steps the plateau scheduler."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import TINY, compose_cfg
from nmt.runner import run
from nmt.trainer import EarlyStopping, Progress


def v(bleu: float, chrf: float, loss: float) -> dict:
    return {"bleu": bleu, "chrf": chrf, "loss": loss}


def test_each_metric_keeps_its_own_best_and_counts_patience():
    history = [v(10, 40, 3.0), v(12, 39, 2.9), v(11, 41, 3.1), v(11, 38, 2.8)]
    marks = {}
    for metric in ("bleu", "chrf", "loss"):
        stop, p = EarlyStopping(patience=2, metric=metric), Progress()
        marks[metric] = []
        for step, x in enumerate(history, 1):
            p.step = step
            marks[metric].append(stop.update(p, x))
        marks[metric].append((p.best_step, p.best_bleu, p.best_score, stop.reason(p)))
    assert marks["bleu"][:4] == [True, True, False, False]
    assert marks["bleu"][-1] == (2, 12, 12, "no BLEU gain in 2 validations (trainer.patience)")
    assert marks["chrf"][:4] == [True, False, True, False]
    assert marks["chrf"][-1] == (3, 11, 41, None)  # best.pt's BLEU is the chosen validation's, not the highest
    assert marks["loss"][:4] == [True, True, False, True]
    assert marks["loss"][-1] == (4, 11, 2.8, None)
    stop = EarlyStopping(patience=1, metric="loss")
    p = Progress(best_score=2.0, best_bleu=5.0)
    assert not stop.update(p, v(30, 60, 2.1))
    assert stop.reason(p) == "no validation loss improvement in 1 validations (trainer.patience)"
    assert stop.gain(v(30, 60, 2.1)) == -2.1 and EarlyStopping(metric="chrf").gain(v(30, 60, 2.1)) == 60


def test_the_end_of_run_line_names_the_metric_once():
    p = Progress(best_score=2.71828, best_bleu=41.2, best_step=900)
    assert EarlyStopping(metric="loss").describe_best(p) == "best validation loss 2.7183 (BLEU 41.20) at step 900"
    assert EarlyStopping(metric="chrf").describe_best(p) == "best valid chrF 2.72 (BLEU 41.20) at step 900"
    assert EarlyStopping(metric="bleu").describe_best(p) == "best valid BLEU 41.20 at step 900"


def test_a_checkpoint_from_before_select_by_resumes_against_its_best_bleu():
    old = Progress(**{"step": 100, "best_bleu": 20.0, "best_step": 100})  # no best_score in its progress
    stop = EarlyStopping(metric="bleu")
    assert not stop.update(old, v(19.0, 50, 1.0)) and old.bad_validations == 1
    assert stop.update(old, v(21.0, 50, 1.0)) and old.best_score == 21.0


def test_a_run_selected_by_loss_keeps_the_lowest_loss_as_best_pt(tmp_path, sample_dir, cache_env):
    cfg = compose_cfg(
        [
            f"data.dir={sample_dir}",
            *TINY,
            "trainer.max_steps=20",
            "trainer.valid_every=5",
            "data.valid_max_sentences=10",
            "data.num_workers=0",
            "trainer.select_by=loss",
        ]
    )
    run(cfg, tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in rows if "loss" in r and "bleu" in r]
    assert [r["step"] for r in validations] == [5, 10, 15, 20]
    lowest = min(validations, key=lambda r: r["loss"])
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=False)
    assert best["progress"]["best_step"] == lowest["step"]
    assert best["progress"]["best_score"] == lowest["loss"] and best["progress"]["best_bleu"] == lowest["bleu"]


def test_validation_token_accuracy_counts_the_reference_pieces_ranked_first(trained, sample_dir, tmp_path):
    """``acc``: over every valid pair, the share of reference pieces (and EOS) the model's teacher-forced
    distribution ranks first; checked against a sentence-at-a-time count of the same."""
    from nmt.data.batching import collate
    from nmt.data.corpus import CorpusSpec, load_pairs
    from nmt.runtime import load_model
    from nmt.search import SearchOptions
    from nmt.trainer import Validator
    from nmt.training import build_precision
    from nmt.translator import Translator

    run, _, _ = trained
    cpu = torch.device("cpu")
    model, tok = load_model(str(run / "checkpoints" / "best.pt"), cpu)
    pairs = load_pairs(CorpusSpec(path=str(sample_dir / "valid.tsv")))[:60]
    translator = Translator(model, tok, cpu, SearchOptions(beam_size=1), max_tokens=2000)
    v = Validator(translator, pairs, 5, 300, build_precision("none", cpu, model), 0, tmp_path)(model)
    right = total = 0
    model.eval()  # the validator hands the model back in training mode
    with torch.no_grad():
        for src, tgt in pairs:
            b = collate(tok.encode_src([src]), tok.encode_tgt([tgt]))
            logits, _ = model(b.src, b.src_len, b.tgt_in)
            right += int((logits.argmax(-1) == b.tgt_out).sum())
            total += b.n_tgt_tokens
    assert 0 < right < total
    assert v["acc"] == pytest.approx(100.0 * right / total, abs=100.0 / total)  # a tie may fall either way
