"""The CPU fast path's search kernels (``rnn_impl=loop``): blocked top-k, in-place log-probabilities,
oneDNN-packed bf16 products and the embedding-gate table, each against the plain version beside it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from nmt.config import TrainConfig
from nmt.data.batching import collate
from nmt.models.build import build_model
from nmt.models.rnn import (
    PACKING_MARGIN,
    ROW_GRID,
    CastLinear,
    _packing_available,
    describe_packing,
    float32_packing_speedup,
    pack_weight,
    packed_linear,
    packed_weight,
    packs_float32,
    pin_kernel_choices,
    row_grid,
)
from nmt.models.seq2seq import Ensemble
from nmt.search import SearchOptions, beam_search, blocked_topk, log_probs, log_probs_in_place, row_topk

NEG_INF = float("-inf")


def check_topk(x: torch.Tensor, k: int, block: int) -> None:
    """blocked_topk gives torch.topk's values, best first, and columns that hold those values."""
    top, idx = blocked_topk(x, k, block)
    ref, _ = row_topk(x, k)
    assert top.shape == idx.shape == (x.size(0), k)
    assert torch.equal(top, ref)
    assert torch.equal(x.gather(1, idx), top)
    assert all(len(set(r)) == k for r in idx.tolist())  # k different columns


@pytest.mark.parametrize("V", [8000, 8000 + 37, 1280, 1300])  # whole blocks only, a partial last block
@pytest.mark.parametrize("k", [1, 10, 20])
def test_blocked_topk_equals_torch_topk(V, k):
    torch.manual_seed(V + k)
    x = torch.log_softmax(torch.randn(50, V) * 4, dim=1)
    check_topk(x, k, 64)


def test_blocked_topk_finds_the_best_in_the_partial_block_and_in_one_block():
    """The row's best entries all in the last, partial block; or all k in one block."""
    x = torch.randn(3, 64 * 30 + 5)
    x[0, -5:] = 100 + torch.arange(5.0)
    x[1, 64 * 7 : 64 * 7 + 10] = 50 + torch.arange(10.0)
    x[2, :] = -1.0  # one value everywhere: any k columns are right
    check_topk(x, 10, 64)
    top, idx = blocked_topk(x, 5, 64)
    assert idx[0].tolist() == list(range(x.size(1) - 1, x.size(1) - 6, -1))


def test_blocked_topk_with_masked_tokens_and_dead_rows():
    """The search masks tokens at -inf (min length, repeats) and dead beams have -inf everywhere."""
    torch.manual_seed(1)
    x = torch.log_softmax(torch.randn(6, 4000), dim=1)
    x[0] = NEG_INF
    x[1, :3990] = NEG_INF  # fewer finite entries than k
    x[2, ::2] = NEG_INF
    top, idx = blocked_topk(x, 20, 64)
    ref, _ = row_topk(x, 20)
    assert torch.equal(top, ref) and torch.equal(x.gather(1, idx), top)


@pytest.mark.parametrize("V,k,block", [(100, 10, 64), (64 * 19, 10, 64), (5000, 80, 64)])
def test_blocked_topk_falls_back_to_the_plain_one(V, k, block):
    """Rows narrower than 2k blocks, or k wider than a block, take torch.topk itself: same columns too."""
    x = torch.randn(4, V)
    top, idx = blocked_topk(x, k, block)
    ref, ref_idx = row_topk(x, k)
    assert torch.equal(top, ref) and torch.equal(idx, ref_idx)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(7, 8000), (1, 37), (0, 50)])
def test_in_place_log_probs_equal_the_plain_ones_bit_for_bit(dtype, shape):
    """The fast path's normalisation over a float32 copy of the logits (over float32 logits themselves) is
    log_softmax's result exactly, in float32, masked entries included."""
    torch.manual_seed(0)
    logits = (torch.randn(*shape) * 5).to(dtype)
    if logits.numel():
        logits[0, :3] = NEG_INF
    kept = logits.clone()
    ref = log_probs(logits)
    got = log_probs_in_place(logits)
    assert got.dtype == ref.dtype == torch.float32 and torch.equal(got, ref)
    if dtype == torch.bfloat16:
        assert torch.equal(logits, kept)  # a bf16 step's logits stay as they were: the copy is overwritten
    else:
        assert got.data_ptr() == logits.data_ptr()  # float32 logits are the buffer


@pytest.mark.parametrize("shape", [(5, 48), (2, 3, 48), (0, 48), (1, 48)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_products_equal_the_plain_product_bit_for_bit(shape, bias):
    """Where PyTorch's oneDNN ops can pack a bf16 weight, the packed product is F.linear's result exactly;
    elsewhere (no oneDNN bf16 on this CPU/build) nothing is packed and CastLinear takes F.linear."""
    torch.manual_seed(0)
    w = torch.randn(40, 48).bfloat16()
    b = torch.randn(40).bfloat16() if bias else None
    x = torch.randn(*shape).bfloat16()
    lin = CastLinear(w, b, torch.bfloat16, torch.float32, pack=True)
    plain = CastLinear(w, b, torch.bfloat16, torch.float32)
    assert plain.packed is None
    if _packing_available():
        assert lin.packed is not None
        assert torch.equal(packed_linear(x, packed_weight(w), b), F.linear(x, w, b))
    else:
        assert lin.packed is None
    got = lin(x.float())
    assert got.dtype == torch.float32 and torch.equal(got, plain(x.float()))


def test_the_row_grid():
    """Up to 2 * ROW_GRID rows a product runs on its own rows; above, on the next multiple of ROW_GRID."""
    assert [row_grid(n) for n in (0, 1, 2 * ROW_GRID)] == [0, 1, 2 * ROW_GRID]
    assert row_grid(2 * ROW_GRID + 1) == 3 * ROW_GRID and row_grid(3 * ROW_GRID) == 3 * ROW_GRID
    assert row_grid(10 * ROW_GRID - 5) == 10 * ROW_GRID


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [2 * ROW_GRID + 1, 3 * ROW_GRID, 5 * ROW_GRID - 3, 570])
def test_a_product_on_the_row_grid_is_the_product_on_its_own_rows_bit_for_bit(dtype, rows):
    """Rows padded up to the grid change no row's result: oneDNN's product on the rows themselves, exactly
    (and for bf16, F.linear's)."""
    if not _packing_available(dtype):
        pytest.skip(f"this PyTorch/CPU cannot pack {dtype} weights for oneDNN")
    torch.manual_seed(rows)
    w, b = torch.randn(40, 96).to(dtype), torch.randn(40).to(dtype)
    x = torch.randn(rows, 96).to(dtype)
    packed = pack_weight(w)
    got = packed_linear(x, packed, b)
    assert got.shape == (rows, 40) and got.is_contiguous()
    assert torch.equal(got, torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""))
    if dtype == torch.bfloat16:
        assert torch.equal(got, F.linear(x, w, b))


@pytest.mark.parametrize("shape", [(5, 48), (2, 3, 48), (0, 48)])
def test_float32_weights_are_packed_where_measured_faster_with_float32_results(shape):
    """A float32 weight is packed exactly where oneDNN's float32 product measured at least PACKING_MARGIN
    faster than F.linear on this CPU (once per process), and its products are F.linear's up to float32
    rounding (another GEMM kernel); the log line says which and why."""
    torch.manual_seed(0)
    w, b, x = torch.randn(40, 48), torch.randn(40), torch.randn(*shape)
    speedup = float32_packing_speedup()
    assert speedup == float32_packing_speedup()  # measured once
    assert packs_float32() == (_packing_available(torch.float32) and speedup >= PACKING_MARGIN)
    lin = CastLinear(w, b, torch.float32, pack=True)
    assert (lin.packed is not None) == packs_float32()
    got = lin(x)
    assert got.dtype == torch.float32 and got.shape == (*shape[:-1], 40)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    line = describe_packing()
    assert line.startswith("oneDNN packed weights" if packs_float32() else "F.linear")
    if _packing_available(torch.float32):
        assert f"{speedup:.2f}x" in line


def model(rnn_impl: str, vocab: int = 1500) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(cell="gru", emb_size=8, hidden_size=6, layers=1, dropout=0.0)
    cfg.decoder.update(order="bahdanau", emb_size=8, hidden_size=12, layers=1, dropout=0.0)
    cfg.attention.name = "bahdanau"
    m = build_model(cfg.encoder, cfg.attention, cfg.decoder, 30, vocab, rnn_impl=rnn_impl, device="cpu").eval()
    with torch.no_grad():  # a peaked output layer, so that beams do not tie
        m.decoder.out.weight.mul_(20)
    return m


def test_the_fast_path_is_chosen_at_build_time():
    """rnn_impl=loop takes the blocked top-k and, with bf16 products where oneDNN can pack them, packed
    weights for the search's products; rnn_impl=eager keeps every kernel plain."""
    eager, fast = model("eager"), model("loop")
    assert not eager.fast_search and fast.fast_search
    assert Ensemble([fast, fast]).fast_search and not Ensemble([fast, eager]).fast_search
    src, src_len = torch.tensor([[5, 6, 7]]), torch.tensor([3])
    for m in (eager, fast):
        with torch.no_grad():  # float32: the fast path packs where oneDNN's float32 product measured faster
            made = m.start(src, src_len).weights
        if m is fast and packs_float32():
            assert made.out.packed is not None and made.read.packed is not None
        else:
            assert not isinstance(made.out, CastLinear) and not isinstance(made.read, CastLinear)
        m.set_matmul_dtype(torch.bfloat16)
        with torch.no_grad():
            made = m.start(src, src_len).weights
        packed = m is fast and _packing_available()
        assert (made.out.packed is not None) == packed and (made.read.packed is not None) == packed


def test_a_fast_search_finds_what_the_plain_search_finds():
    """The same weights searched with the plain kernels (rnn_impl=eager) and the fast ones (loop: blocked
    top-k over 1,500 tokens) give the same hypotheses and scores. (The packed bf16 products equal the
    plain ones bit for bit, above; bf16 searches by the two implementations differ by rounding.)"""
    eager, fast = model("eager"), model("loop")
    fast.load_state_dict(eager.state_dict())
    g = torch.Generator().manual_seed(3)
    b = collate([torch.randint(4, 30, (n,), generator=g).tolist() for n in (5, 3, 7, 2)], [[4]] * 4)
    opts = SearchOptions(beam_size=5, n_best=3, max_len_cap=8)
    with torch.no_grad():
        found = [beam_search(m, b.src, b.src_len, opts) for m in (eager, fast)]
    for plain, quick in zip(*found):
        assert [h.tokens for h in plain] == [h.tokens for h in quick]
        torch.testing.assert_close([h.score for h in plain], [h.score for h in quick], rtol=1e-4, atol=1e-4)


def packed_products(m: torch.nn.Module, dtype: torch.dtype) -> None:
    """Give the search's products in ``dtype`` packed weights (float32: pinned on, as a CPU that measured
    oneDNN's float32 product faster chooses), or skip where this PyTorch/CPU cannot pack them."""
    if not _packing_available(dtype):
        pytest.skip(f"this PyTorch/CPU cannot pack {dtype} weights for oneDNN")
    if dtype == torch.float32:
        pin_kernel_choices({"float32_packing": True})
    m.set_matmul_dtype(None if dtype == torch.float32 else dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gate_table_gives_the_products_gates_bit_for_bit(dtype):
    """A fast search's layer-0 embedding gates read from the GateTable equal the first product's own, bit for
    bit, whatever rows computed them and in whatever steps (ids new and seen, one row or hundreds)."""
    m = model("loop")
    packed_products(m, dtype)
    dec, g = m.decoder, torch.Generator().manual_seed(1)
    with torch.no_grad():
        products = m.start(torch.tensor([[5, 6, 7]]), torch.tensor([3])).weights
        table = products.gates
        assert table is not None and not bool(table.have.any())
        for n in (1, 7, 3 * ROW_GRID + 5, 1, 570, 40):
            y = torch.randint(0, 1500, (n,), generator=g)
            assert torch.equal(table(y), dec.rnn.first_gates(products.rnn, dec.embed(y)))
        assert int(table.have.sum()) < 1500  # only the ids that occurred were computed


def test_a_search_with_the_gate_table_finds_what_one_without_it_finds():
    """The same search with the table and with each step's own product: the same hypotheses and scores."""
    m = model("loop")
    packed_products(m, torch.float32)
    g = torch.Generator().manual_seed(3)
    b = collate([torch.randint(4, 30, (n,), generator=g).tolist() for n in (5, 3, 7, 2)], [[4]] * 4)
    opts = SearchOptions(beam_size=5, n_best=3, max_len_cap=8)
    with torch.no_grad():
        with_table = beam_search(m, b.src, b.src_len, opts)
        table = m.decoder.gate_table(m.decoder.rnn.step_weights(m.decoder.emb_size))
        assert table is not None and bool(table.have.any())  # the searched batch's ids
        m.decoder.gate_table = lambda rnn: None  # this model only: every step runs the product
        without = beam_search(m, b.src, b.src_len, opts)
    for a, c in zip(with_table, without):
        assert [(h.tokens, h.score, h.log_prob) for h in a] == [(h.tokens, h.score, h.log_prob) for h in c]


def test_the_gate_table_is_kept_while_the_weights_are_and_only_where_it_is_exact():
    """One table serves the searches of unchanged weights; an in-place update (an optimiser step) or a loaded
    state dict makes a new one. Training mode (embedding dropout), gradients, the plain path (eager) and
    products that are not packed get none."""
    m = model("loop")
    packed_products(m, torch.float32)
    src, src_len = torch.tensor([[5, 6, 7]]), torch.tensor([3])
    with torch.no_grad():
        first = m.start(src, src_len).weights.gates
        assert first is not None and m.start(src, src_len).weights.gates is first
        m.decoder.rnn.weight_ih_l0.add_(0.01)
        second = m.start(src, src_len).weights.gates
        assert second is not None and second is not first
        m.load_state_dict(m.state_dict())
        third = m.start(src, src_len).weights.gates
        assert third is not None and third is not second
        m.train()
        assert m.start(src, src_len).weights.gates is None
        m.eval()
    assert m.start(src, src_len).weights.gates is None  # gradients recorded
    with torch.no_grad():
        copied = copy.deepcopy(m)  # carries no table (a packed weight cannot be copied) and makes its own
        assert copied.start(src, src_len).weights.gates not in (None, third)
        assert m.start(src, src_len).weights.gates is third
    eager = model("eager")
    eager.set_matmul_dtype(torch.bfloat16)
    with torch.no_grad():
        assert eager.start(src, src_len).weights.gates is None
        pin_kernel_choices({"float32_packing": False})
        m.set_matmul_dtype(None)  # float32 through F.linear: rows may round with the call's other rows
        assert m.start(src, src_len).weights.gates is None
