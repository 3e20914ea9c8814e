"""Decoding's matrix products (translate/evaluate/serve ``amp``): measured per CPU, cached, applied to search."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from test_decoder import CASES, random_batch, tiny_model

from helpers import run_module, source_file
from nmt.calibrate import Calibration, ProductTimer, decode_dtype
from nmt.config import DecodeConfig, TranslateConfig, validate
from nmt.errors import ConfigError
from nmt.models.rnn import CastLinear, StepLinear, _packing_available, packs_float32, pin_kernel_choices
from nmt.runtime import load_translator
from nmt.search import SearchOptions, beam_search

CPU = torch.device("cpu")


def probe(f32: float, bf16: float):
    """A ``dtype -> seconds`` timer that reports fixed times (and counts its calls)."""

    def timer(dtype):
        timer.calls += 1
        return bf16 if dtype == torch.bfloat16 else f32

    timer.calls = 0
    return timer


def test_auto_takes_bf16_only_where_it_is_measured_faster():
    model = tiny_model("luong", "gru", False)
    dtype, why = decode_dtype(model, "auto", CPU, probe=probe(1.0, 0.5))
    assert dtype == torch.bfloat16 and "bf16 products 2.00x the speed of float32" in why
    dtype, why = decode_dtype(model, "auto", CPU, probe=probe(1.0, 1.0))  # a tie is below the margin
    assert dtype is None and "1.00x" in why
    dtype, _ = decode_dtype(model, "auto", CPU, probe=probe(1.0, 4.0))  # emulated bf16
    assert dtype is None


def test_auto_choice_is_cached_per_machine_and_shape(tmp_path):
    """The first measurement decides for later runs, so one machine always decodes the same way."""
    model = tiny_model("bahdanau", "gru", True)
    dtype, why = decode_dtype(model, "auto", CPU, str(tmp_path), probe=probe(1.0, 0.5))
    assert dtype == torch.bfloat16 and "saved to" in why
    (entry,) = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    assert entry["key"]["decode_projection"] == [256, model.decoder.out_size, 40]
    later = probe(1.0, 3.0)  # would say float32 if it were asked
    dtype, why = decode_dtype(model, "auto", CPU, str(tmp_path), probe=later)
    assert dtype == torch.bfloat16 and "cached" in why and later.calls == 0
    # Another projection shape is another entry, measured afresh.
    other = tiny_model("bahdanau", "gru", True, tie=True)
    dtype, _ = decode_dtype(other, "auto", CPU, str(tmp_path), probe=probe(1.0, 3.0))
    assert dtype is None and len(list(tmp_path.glob("*.json"))) == 2


@pytest.mark.parametrize("float32_packing", [True, False])
def test_auto_times_the_products_the_search_runs(tmp_path, float32_packing):
    """The search multiplies over weights blocked once for oneDNN on the CPU fast path (bf16 where PyTorch
    can; float32 where packing measured faster), so decoding's ``auto`` times those; the plain path
    (``eager``) and a training step's probe multiply with F.linear. The cache key records which."""
    pin_kernel_choices({"float32_packing": float32_packing})
    fast, plain = tiny_model("luong", "gru", False), tiny_model("luong", "gru", False, rnn_impl="eager")
    bf16_packs = _packing_available(torch.bfloat16)
    timer = ProductTimer(fast, Calibration(), rows=8, packed=True)
    assert (timer.packed[torch.bfloat16] is not None) == bf16_packs
    assert (timer.packed[None] is not None) == (float32_packing and _packing_available(torch.float32))
    assert timer(None) > 0 and timer(torch.bfloat16) > 0
    assert set(ProductTimer(fast, Calibration(), rows=8).packed.values()) == {None}  # a training step's probe
    for model, packed in ((fast, True), (plain, False)):
        cache = tmp_path / str(packed)
        decode_dtype(model, "auto", CPU, str(cache), probe=probe(1.0, 0.5))
        (entry,) = [json.loads(f.read_text()) for f in cache.glob("*.json")]
        assert entry["key"]["packed"] == {"bf16": packed, "float32": packed and packs_float32()}


def test_forced_choices_and_cuda_measure_nothing():
    model = tiny_model("luong", "gru", False)
    never = probe(1.0, 1.0)
    assert decode_dtype(model, "none", CPU, probe=never) == (None, "amp=none")
    assert decode_dtype(model, "bf16", CPU, probe=never)[0] == torch.bfloat16
    dtype, why = decode_dtype(model, "auto", torch.device("cuda"), probe=never)
    assert dtype is None and "CUDA" in why
    assert never.calls == 0


@pytest.mark.parametrize("order,cell,feed", CASES)
def test_search_step_runs_the_projection_in_the_models_product_dtype(order, cell, feed, seeded):
    """With bf16 products set, a search step's logits come from the bf16 projection (as the teacher-forced
    pass's do), within bf16 rounding of float32; and the step still equals the full pass."""
    model = tiny_model(order, cell, feed, layers=2, rnn_impl="loop")
    b = random_batch()

    def steps():
        with torch.no_grad():
            state, out = model.start(b.src, b.src_len), []
            for t in range(b.tgt_in.size(1)):
                logits, state, _ = model.decoder.step(b.tgt_in[:, t], state)
                out.append(logits)
            return torch.stack(out, 1), model(b.src, b.src_len, b.tgt_in)[0]

    f32, _ = steps()
    model.set_matmul_dtype(torch.bfloat16)
    bf16, full = steps()
    assert f32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    assert not torch.equal(bf16.float(), f32)
    torch.testing.assert_close(bf16.float(), f32, rtol=0.05, atol=0.05)
    torch.testing.assert_close(bf16, full, rtol=1e-2, atol=1e-2)
    hyps = beam_search(model, b.src, b.src_len, SearchOptions(beam_size=3))
    assert all(len(h) == 1 and h[0].score <= 0 for h in hyps)


@pytest.mark.parametrize("order", ["bahdanau", "luong"])
def test_search_casts_the_decoders_layers_once_and_training_keeps_the_modules(order, seeded):
    """With bf16 products, a search's readout/combine, attention and vocabulary products are cast once
    when the search starts (CastLinear, bf16 weights) and carried through every step and beam
    reordering; a training pass (gradients on) makes the readout/combine and attention products as the
    RNN's step loops do (StepLinear: bf16, one weight gradient per pass) and keeps the vocabulary
    projection's module (Decoder.logits); float32 decoding uses the layers themselves, or
    packs them once where oneDNN's float32 product measured faster (loop only)."""
    model = tiny_model(order, "gru", True, layers=1, rnn_impl="loop")
    dec, b = model.decoder, random_batch()
    model.set_matmul_dtype(torch.bfloat16)
    with torch.no_grad():
        state = model.start(b.src, b.src_len)
        made = state.weights
        assert isinstance(made.read, CastLinear) and isinstance(made.out, CastLinear)
        assert made.read.w.dtype == made.out.w.dtype == torch.bfloat16
        assert torch.equal(made.out.w, dec.out.weight.to(torch.bfloat16))
        names = dec.attention.products
        assert names and all(isinstance(state.attn.products[n], CastLinear) for n in names)
        attn = state.attn.products
        _, state, _ = dec.step(b.tgt_in[:, 0], state)
        assert state.weights is made and state.index_select(torch.tensor([1, 0])).weights is made
        assert state.attn.products is attn and state.index_select(torch.tensor([1, 0])).attn.products is attn
    train_state = model.start(b.src, b.src_len)
    assert isinstance(train_state.weights.read, StepLinear) and train_state.weights.read.w.dtype == torch.bfloat16
    assert train_state.weights.out == dec.logits
    assert all(isinstance(train_state.attn.products[n], StepLinear) for n in names)
    model.set_matmul_dtype(None)
    with torch.no_grad():
        state = model.start(b.src, b.src_len)
        if packs_float32():  # this CPU's oneDNN float32 product measured faster: packed once per search
            made = [state.weights.read, state.weights.out, *(state.attn.products[n] for n in names)]
            assert all(isinstance(p, CastLinear) and p.packed is not None for p in made)
        else:
            assert state.weights.read is dec.read_layer()
            assert all(state.attn.products[n] is getattr(dec.attention, n) for n in names)


@pytest.mark.parametrize(
    "key,bad,choices,default", [("amp", "fp8", "auto, bf16, none", "auto"), ("quantize", "int4", "none, int8", "none")]
)
def test_decoding_choice_keys_are_validated_before_any_work(key, bad, choices, default):
    for schema in (DecodeConfig, TranslateConfig):
        cfg = OmegaConf.merge(OmegaConf.structured(schema), {"checkpoint": "x.pt", key: bad})
        with pytest.raises(ConfigError, match=rf"{key}='{bad}' is unknown; choose one of {choices}"):
            validate(cfg, "translate")
    assert OmegaConf.structured(DecodeConfig)[key] == default


def test_translate_cli_says_which_products_it_decodes_with(trained, tmp_path, sample_dir):
    run, cache, _ = trained
    best = f"{run}/checkpoints/best.pt"
    lines, src = source_file(sample_dir, tmp_path, 20)
    outs = {}
    for amp in ("none", "bf16", "auto"):
        out = tmp_path / f"{amp}.txt"
        proc = run_module("nmt.translate", [f"checkpoint={best}", f"input={src}", f"output={out}", f"amp={amp}"], cache)
        outs[amp] = out.read_text().splitlines()
        assert len(outs[amp]) == len(lines)
        (said,) = [ln for ln in proc.stderr.splitlines() if "decoding products:" in ln]
        # float32 on the CPU fast path names its products' kernel: oneDNN packed weights or F.linear, and why
        assert ("float32 (amp=none; products by " in said) if amp == "none" else True
        assert ("bf16 (amp=bf16)" in said) if amp == "bf16" else True
        assert ("measured: bf16 products" in said) if amp == "auto" else True
    # bf16 products barely move a greedy-or-beam search on a trained model: most lines are the same.
    same = sum(a == b for a, b in zip(outs["none"], outs["bf16"]))
    assert same >= 0.7 * len(lines), (same, len(lines))
    # The cached choice makes a second auto run decode exactly as the first.
    out = tmp_path / "again.txt"
    proc = run_module("nmt.translate", [f"checkpoint={best}", f"input={src}", f"output={out}"], cache)
    assert out.read_text().splitlines() == outs["auto"] and "cached" in proc.stderr
    # int8 has its own products: amp does not apply, and the log says so.
    proc = run_module("nmt.translate", [f"checkpoint={best}", f"input={src}", "quantize=int8"], cache)
    assert "decoding products: int8" in proc.stderr
    bad = run_module("nmt.translate", [f"checkpoint={best}", "amp=fp8"], cache, check=False)
    assert bad.returncode == 2 and "amp='fp8' is unknown" in bad.stderr


def test_load_translator_applies_the_choice_to_every_ensemble_member(trained):
    run, _, _ = trained
    best = f"{run}/checkpoints/best.pt"
    cfg = OmegaConf.merge(
        OmegaConf.structured(DecodeConfig),
        {"checkpoint": best, "ensemble": [best], "device": "cpu", "amp": "bf16", "amp_cache": None},
    )
    tr = load_translator(cfg)
    assert [m.decoder.rnn.matmul_dtype for m in tr.model.members] == [torch.bfloat16] * 2
    assert len(tr.translate(["Hello.", "How are you?"])) == 2
