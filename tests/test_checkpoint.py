from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from helpers import tokenizer_cfg
from nmt import checkpoint
from nmt.checkpoint import average
from nmt.config import TrainConfig, to_plain
from nmt.data import build_tokenizer
from nmt.data.corpus import CorpusSpec
from nmt.data.tokenizer import BOS
from nmt.errors import CheckpointError
from nmt.models.build import build_model
from nmt.runtime import load_model


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


def test_random_bytes_of_a_checkpoints_size_give_one_line_errors(tmp_path):
    """A resume fell back to an older checkpoint on a last.pt overwritten with os.urandom, except when the
    random bytes sent torch.load's legacy pickle reader into a MemoryError (CI, 2026-11-26): every such file is
    now refused before unpickling. Seeded, so the same 200 files every run."""
    p = tmp_path / "x.pt"
    checkpoint.save(p, payload())
    size = p.stat().st_size
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        p.write_bytes(bytes(torch.randint(0, 256, (size,), generator=gen, dtype=torch.uint8).tolist()))
        with pytest.raises(CheckpointError, match="not a readable checkpoint"):
            checkpoint.load(p)


def test_a_damaged_archive_member_gives_a_one_line_error(tmp_path):
    """A valid zip archive whose pickled payload is garbage (so the zip check alone does not catch it)."""
    import zipfile

    p = tmp_path / "x.pt"
    checkpoint.save(p, payload())
    with zipfile.ZipFile(p) as z:
        members = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in members if n.endswith("data.pkl"))
    members[pkl] = b"\x80\x02" + bytes(range(256)) * 4
    with zipfile.ZipFile(p, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_weights_only_keeps_what_translating_needs_and_loads_like_a_full_checkpoint(tmp_path, sample_dir):
    cfg = OmegaConf.structured(TrainConfig)
    cfg.attention.name = "bahdanau"
    for part in (cfg.encoder, cfg.decoder):
        part.emb_size, part.hidden_size = 16, 16
    tok = build_tokenizer(tokenizer_cfg(tmp_path), CorpusSpec(str(sample_dir / "train.tsv")))
    model = build_model(cfg.encoder, cfg.attention, cfg.decoder, tok.src_vocab_size, tok.tgt_vocab_size)
    opt = torch.optim.Adam(model.parameters())
    model(*probe_batch(tok))[0].sum().backward()
    opt.step()  # Adam's moments: the bulk of a full checkpoint
    full = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": {"last_epoch": 1},
        "scaler": {},
        "rng": {"torch": torch.get_rng_state()},
        "tokenizer": tok.state_dict(),
        "config": to_plain(cfg),
        "progress": {"step": 1},
    }
    best = checkpoint.weights_only(full)
    assert set(best) == {"model", "tokenizer", "config", "progress"}
    assert set(checkpoint.weights_only({k: full[k] for k in ("model", "tokenizer", "config")})) == set(
        checkpoint.TRANSLATE_KEYS
    )
    with pytest.raises(KeyError, match="config"):
        checkpoint.weights_only({"model": {}, "tokenizer": {}})
    checkpoint.save(tmp_path / "last.pt", full)
    checkpoint.save(tmp_path / "best.pt", best)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    saved = (tmp_path / "last.pt").stat().st_size - (tmp_path / "best.pt").stat().st_size
    assert saved > 1.9 * weight_bytes  # Adam's two moments per weight are left out
    outputs = []
    for name in ("last.pt", "best.pt"):  # as nmt.translate / nmt.evaluate load them
        loaded, loaded_tok = load_model(str(tmp_path / name), torch.device("cpu"))
        assert loaded_tok.state_dict() == tok.state_dict()
        with torch.no_grad():
            outputs.append(loaded(*probe_batch(tok))[0])
    assert torch.equal(outputs[0], outputs[1])
    averaged = average([str(tmp_path / "best.pt"), str(tmp_path / "last.pt")])  # as nmt.average does
    assert all(torch.equal(averaged["model"][k], v) for k, v in model.state_dict().items())


def probe_batch(tok):
    """(src, src_len, tgt_in) of one sentence pair."""
    src = torch.tensor([tok.encode_src(["Where is the station?"])[0]])
    tgt = torch.tensor([[BOS, *tok.encode_tgt(["¿Dónde está la estación?"])[0]]])
    return src, torch.tensor([src.size(1)]), tgt
