"""The efficiency share of scripts/benchmark.py: FLOPs counted per token (scripts/model_flops.py) and
this machine's GEMM peak (scripts/gemm_peak.py). No timing is asserted, only what is counted."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from helpers import tokenizer_cfg
from nmt.config import TrainConfig
from nmt.data import build_tokenizer
from nmt.data.batching import collate
from nmt.data.corpus import CorpusSpec
from nmt.distributed import Dist
from nmt.models.build import build_model
from nmt.models.rnn import _packing_available, packed_linear
from nmt.search import SearchOptions
from nmt.trainer import EarlyStopping, Schedule, Trainer
from nmt.training import build_optimizer, build_precision
from nmt.translator import Translator
from scripts.gemm_peak import DTYPES, KERNELS, Peak, ShapeRate, best_of, kernels, measure
from scripts.model_flops import decode_flops, train_flops

CPU = torch.device("cpu")
SIZES = dict(E_src=8, H_enc=6, E_tgt=8, H_dec=12, V=30)  # attention width and readout = H_dec (the defaults)


def tiny(vocab: int = SIZES["V"]):
    """A Bahdanau-order GRU model with additive attention."""
    torch.manual_seed(0)
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(emb_size=SIZES["E_src"], hidden_size=SIZES["H_enc"], layers=1, dropout=0.1)
    cfg.decoder.update(emb_size=SIZES["E_tgt"], hidden_size=SIZES["H_dec"], layers=1, dropout=0.1)
    cfg.attention.name = "bahdanau"
    return cfg, build_model(cfg.encoder, cfg.attention, cfg.decoder, vocab, vocab, device="cpu")


def trainer() -> Trainer:
    cfg, model = tiny()
    opt = build_optimizer(model, cfg.trainer)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    precision = build_precision("none", CPU, model)
    return Trainer(model, opt, sched, precision, None, EarlyStopping(), None, None, Schedule(), {}, Dist())


def hand_count(B: int, S: int, T: int, E_src: int, H_enc: int, E_tgt: int, H_dec: int, V: int) -> int:
    """FLOPs of one training step's matrix products, by hand: forward multiply-adds × 2 FLOPs × 3
    (backward takes a gradient for both operands of every product)."""
    K, D, O = 2 * H_enc, H_dec, H_dec  # keys (both directions), attention width, readout size
    macs = (
        2 * B * S * (E_src * 3 * H_enc + H_enc * 3 * H_enc)  # bi-GRU encoder: input and hidden products
        + B * S * K * D  # attention keys W_k a, once per batch
        + B * K * H_dec  # bridge: final encoder states → first decoder state
        + B * T * ((E_tgt + K) * 3 * H_dec + H_dec * 3 * H_dec)  # decoder GRU on [e_t; c_t], hidden
        + B * T * H_dec * D  # attention query W_q s_{t-1}
        + 2 * B * T * S * D  # scores vᵀ tanh(…) and the context Σ α a
        + B * T * (H_dec + K + E_tgt) * O  # readout of [s_t; c_t; e_t]
        + B * T * O * V  # vocabulary projection
    )
    return 6 * macs


def batch(copies: int = 1):
    src, tgt = [[5, 6, 7], [8, 9]], [[5, 6, 7, 8], [9]]
    return collate(src * copies, tgt * copies)


def test_a_training_step_is_counted_completely_forward_and_backward():
    b = batch()
    count = train_flops(trainer(), [b])
    B, S = b.src.shape
    T = b.tgt_in.size(1)
    # exact today; the tolerance lets a loop skip e.g. its first step's zero-state product
    assert count.flops == pytest.approx(hand_count(B, S, T, **SIZES), rel=0.05)
    assert count.tokens == 7 and count.per_token == count.flops / 7


def test_twice_the_sentences_cost_twice_the_flops_and_the_same_per_token():
    tr = trainer()
    one, two = train_flops(tr, [batch()]), train_flops(tr, [batch(copies=2)])
    assert one.flops > 0 and two.flops == 2 * one.flops and two.tokens == 2 * one.tokens
    assert two.per_token == one.per_token
    both = train_flops(tr, [batch(), batch(copies=2)])  # several batches: summed
    assert (both.flops, both.tokens) == (3 * one.flops, 3 * one.tokens)


def test_decoding_counts_output_tokens_and_at_least_the_projection_per_token(sample_dir, tmp_path):
    spec = CorpusSpec(str(sample_dir / "train.tsv"))
    tok = build_tokenizer(tokenizer_cfg(tmp_path, vocab_size=150, sample_size=500), spec)
    _, model = tiny(tok.tgt_vocab_size)
    texts = ["Tom is here.", "", "I like green apples very much."]
    for beam in (1, 3):
        tr = Translator(model, tok, CPU, SearchOptions(beam_size=beam, max_len_ratio=1.0))
        count = decode_flops(tr, texts)
        got = tr.translate(texts)
        assert count.tokens == sum(len(t.hypothesis.tokens) + 1 for t in got if t.src_pieces) > 0
        # every output token took at least one forward vocabulary projection (readout size H_dec)
        assert count.per_token >= 2 * SIZES["H_dec"] * tok.tgt_vocab_size
        assert count.sentences == 3


def test_gemm_peak_is_positive_for_both_dtypes_and_skips_what_would_take_too_long():
    peak = measure(shapes=((32, 32, 32),), repeats=1)
    assert set(peak.gflops) == {"float32", "bf16"} and all(g > 0 for g in peak.gflops.values())
    assert peak.threads == torch.get_num_threads() and isinstance(peak.bf16_native, bool)
    assert "float32" in peak.describe() and peak.cpu in peak.describe()
    # a bigger shape predicted (at the small one's rate) to take longer than max_seconds is not run
    slow = measure(("float32",), shapes=((16, 16, 16), (256, 256, 256)), repeats=1, max_seconds=1e-12)
    # the first product (torch.mm on the small shape) is timed; everything after it, predicted from its rate, is
    # skipped: oneDNN's packed product where this PyTorch has it, then both kernels on the big shape
    first, *rest = slow.shapes["float32"]
    assert first.gflops and first.kernel == KERNELS[0] and first.gflops == slow.gflops["float32"]
    assert len(rest) == 2 * len(kernels(torch.float32)) - 1
    assert all(r.gflops is None and r.note.startswith("skipped") for r in rest)
    assert dataclasses.asdict(slow)["shapes"]["float32"][1]["gflops"] is None


def test_gemm_peak_is_the_best_kernel_and_the_packed_product_is_the_same_product():
    """torch.mm's float32 is MKL's sgemm, oneDNN's packed product can be twice as fast (AVX-512 AMD EPYC):
    the peak is the best of the kernels this PyTorch has, and each is timed on the product asked for."""
    peak = measure(shapes=((48, 32, 64), (16, 16, 16)), repeats=1)
    for name, dtype in DTYPES.items():
        measured = [r.kernel for r in peak.shapes[name]]
        assert measured == [k for _ in range(2) for k in kernels(dtype)]  # per shape, smallest first
        assert peak.gflops[name] == max(r.gflops for r in peak.shapes[name])
        assert max(peak.kernel_peaks(name).values()) == peak.gflops[name]
    if _packing_available(torch.float32):  # the oneDNN product timed is a · b, not a · bᵀ
        a, b = torch.randn(48, 32), torch.randn(32, 64)
        packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), 256)
        torch.testing.assert_close(packed_linear(a, packed, None), a @ b, rtol=1e-4, atol=1e-4)
    both = Peak({"float32": 480.0}, threads=2, cpu="c", bf16_native=True, cpu_capability="AVX512")
    both.shapes = {"float32": [ShapeRate(8, 8, 8, 220.0, 1.0), ShapeRate(8, 8, 8, 480.0, 0.5, kernel=KERNELS[1])]}
    assert "float32 480.0 GFLOP/s by oneDNN packed (torch.mm 220.0)" in both.describe()


def test_best_of_two_peak_measurements_keeps_the_higher_rate_per_dtype_and_shape():
    """benchmark.py measures the peak before and after its timings; a slow minute must not lower the ceiling."""
    slow = Peak({"float32": 100.0, "bf16": 200.0}, threads=2, cpu="c", bf16_native=True, cpu_capability="AVX512")
    fast = Peak({"float32": 190.0, "bf16": 150.0}, threads=2, cpu="c", bf16_native=True, cpu_capability="AVX512")
    slow.shapes = {"float32": [ShapeRate(8, 8, 8, 100.0, 1.0)], "bf16": [ShapeRate(8, 8, 8, 200.0, 1.0)]}
    fast.shapes = {"float32": [ShapeRate(8, 8, 8, 190.0, 0.5)], "bf16": [ShapeRate(8, 8, 8, None, None, "skipped")]}
    best = best_of(slow, fast)
    assert best.gflops == {"float32": 190.0, "bf16": 200.0}
    assert best.shapes["float32"][0].seconds == 0.5 and best.shapes["bf16"][0].gflops == 200.0
    assert best.cpu == "c" and best.threads == 2 and slow.gflops["float32"] == 100.0  # inputs untouched
