"""scripts/preset_curves.py: validation BLEU against training minutes from run directories' metrics.jsonl."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))
import preset_curves  # noqa: E402


def write_run(path, records):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_curves_read_only_validation_records_and_plot_every_run(tmp_path, capsys):
    small = write_run(
        tmp_path / "small",
        [
            {"step": 100, "train_loss": 5.0, "elapsed_s": 30.0},  # a progress record: no BLEU
            {"step": 460, "bleu": 9.21, "elapsed_s": 190.2},
            {"step": 920, "bleu": 21.71, "elapsed_s": 385.3},
        ],
    )
    best = write_run(tmp_path / "best", [{"step": 540, "bleu": 12.5, "elapsed_s": 300.0}])
    assert preset_curves.validations(small) == [(190.2 / 60, 9.21), (385.3 / 60, 21.71)]
    png = tmp_path / "curves.png"
    preset_curves.main([f"{small}=cpu_small", str(best), "--plot", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "cpu_small: 3.2 min 9.21, 6.4 min 21.71" in out and "best: 5.0 min 12.50" in out


def test_a_broken_metrics_line_or_a_missing_run_is_one_line_naming_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"bleu": 1, "elapsed_s": 2}\n{oops\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"metrics.jsonl:2: not JSON"):
        preset_curves.validations(run)
    with pytest.raises(SystemExit, match="not found"):
        preset_curves.validations(tmp_path / "nowhere")
