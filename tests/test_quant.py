"""int8 CPU decoding (nmt.models.quant): close to float32, CPU only, and through the CLI (its key is validated in
test_decode_precision.py with the other decoding choice keys)."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from test_decoder import random_batch

from helpers import run_module, source_file
from nmt.config import DecodeConfig, TrainConfig
from nmt.errors import ConfigError
from nmt.models import quant
from nmt.models.build import build_model
from nmt.runtime import load_translator

pytestmark = pytest.mark.skipif(not quant.available(), reason="this torch build has no oneDNN int8 kernels")

V = 300


def small_model(order: str, cell: str, feed: bool, layers: int):
    """Wider than test_decoder's tiny model, so int8 rounding is judged on realistic dot-product lengths."""
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(cell=cell, emb_size=32, hidden_size=32, layers=layers, dropout=0.0)
    cfg.decoder.update(order=order, emb_size=32, hidden_size=64, layers=layers, dropout=0.0, input_feeding=feed)
    cfg.attention.name = "bahdanau"
    return build_model(cfg.encoder, cfg.attention, cfg.decoder, V, V).eval()


def search_logits(model, b, steps: int = 5) -> torch.Tensor:
    """Logits [steps, B, V] of the search path, fed the same tokens whatever the model predicts."""
    out, state = [], model.start(b.src, b.src_len)
    with torch.no_grad():
        for t in range(steps):
            logits, state, _ = model.step(b.tgt_in[:, min(t, b.tgt_in.size(1) - 1)], state)
            out.append(logits)
    return torch.stack(out)


@pytest.mark.parametrize(
    "order,cell,feed,layers", [("bahdanau", "gru", False, 1), ("luong", "lstm", True, 2), ("luong", "gru", False, 1)]
)
def test_int8_logits_are_close_to_float32(order, cell, feed, layers, seeded):
    plain = small_model(order, cell, feed, layers)
    q = quant.quantize(copy.deepcopy(plain), "int8")
    assert isinstance(q.decoder.out, quant.QuantLinear) and q.decoder.rnn.product is not None
    assert type(plain.decoder.out) is torch.nn.Linear and plain.decoder.rnn.product is None  # plain untouched
    b = random_batch()
    ref, got = search_logits(plain, b), search_logits(q, b)
    err = (got - ref).abs()
    assert not torch.equal(got, ref)  # the int8 kernels really ran
    assert float(err.max()) < 0.05 * float(ref.abs().max())
    assert float(err.mean()) < 0.01 * float(ref.abs().max())
    # The ranking that search acts on barely moves: nearly all argmaxes agree.
    assert float((got.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9


def test_int8_product_matches_its_own_dequantised_arithmetic(seeded):
    """The kernel computes exactly (de-quantised x) · (de-quantised W)ᵀ + b: no int16 saturation."""
    w, bias, x = torch.randn(48, 40), torch.randn(48), torch.randn(9, 40) * 3
    lin = quant.Int8Linear(w, bias)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    s = (hi - lo) / 127
    zp = round(-lo / s)
    xd = ((x / s + zp).round().clamp(0, 127) - zp) * s
    wd = (w / lin.scale[:, None]).round().clamp(-127, 127) * lin.scale[:, None]
    torch.testing.assert_close(lin(x), xd @ wd.t() + bias, atol=1e-4, rtol=1e-4)


def test_int8_is_refused_on_cuda_in_one_line():
    with pytest.raises(ConfigError, match=r"^quantize=int8 runs on CPU only \(device=cuda\)"):
        quant.check("int8", torch.device("cuda"))
    quant.check("none", torch.device("cuda"))  # no quantisation: any device
    quant.check("int8", torch.device("cpu"))


def test_translate_cli_with_int8_and_greedy_agreement(trained, tmp_path, sample_dir):
    run, cache, _ = trained
    best = f"{run}/checkpoints/best.pt"
    lines, src = source_file(sample_dir, tmp_path, 40)
    outs = {}
    for mode in ("none", "int8"):
        out = tmp_path / f"{mode}.txt"
        run_module("nmt.translate", [f"checkpoint={best}", f"input={src}", f"output={out}", f"quantize={mode}"], cache)
        outs[mode] = out.read_text().splitlines()
    assert len(outs["int8"]) == len(lines) and sum(map(bool, outs["int8"])) >= 0.9 * len(lines)
    # Greedy in-process, float32 against int8, on the same trained model: mostly the same words.
    texts = {}
    for mode in ("none", "int8"):
        cfg = OmegaConf.merge(
            OmegaConf.structured(DecodeConfig), {"checkpoint": best, "device": "cpu", "beam_size": 1, "quantize": mode}
        )
        texts[mode] = [t.text for t in load_translator(cfg).translate(lines)]
    same = sum(a == b for a, b in zip(texts["none"], texts["int8"]))
    assert same >= 0.7 * len(lines), (same, len(lines))
    bad = run_module("nmt.translate", [f"checkpoint={best}", "quantize=int4"], cache, check=False)
    assert bad.returncode == 2 and "quantize='int4' is unknown" in bad.stderr
