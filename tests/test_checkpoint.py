from __future__ import annotations

import pytest
import torch

from nmt import checkpoint
from nmt.errors import CheckpointError


def payload():
    return {"model": {"w": torch.randn(3)}, "tokenizer": {"src": b"x", "tgt": None}, "config": {"a": 1}}


def test_roundtrip_and_no_temp_files_left(tmp_path):
    p = tmp_path / "c" / "last.pt"
    data = payload()
    checkpoint.save(p, data)
    got = checkpoint.load(p)
    assert torch.equal(got["model"]["w"], data["model"]["w"]) and got["version"] == checkpoint.VERSION
    assert [f.name for f in p.parent.iterdir()] == ["last.pt"]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "foreign", "version", "missing_key", "absent"])
def test_bad_checkpoints_give_one_line_errors(tmp_path, damage):
    p = tmp_path / "x.pt"
    checkpoint.save(p, payload())
    raw = p.read_bytes()
    if damage == "truncate":
        p.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        p.write_bytes(b"\x00not a checkpoint" * 10)
    elif damage == "foreign":
        torch.save({"state_dict": {}}, p)
    elif damage == "version":
        torch.save({**payload(), "format": checkpoint.FORMAT, "version": 999}, p)
    elif damage == "missing_key":
        torch.save({"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "model": {}}, p)
    else:
        p.unlink()
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(p)
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg
