"""StepLinear (the ``loop`` RNNs' products: one weight gradient per pass) against plain F.linear under autograd."""

import pytest
import torch
import torch.nn.functional as F

from nmt.models import rnn as loop
from nmt.models.rnn import StepLinear


def recurrence(w, b, x0, h0, step_linear: bool, dtype=None):
    """A GRU-like toy loop using the weight at every step, once with a 3-D input at the end."""
    lin = StepLinear(w, b, dtype) if step_linear else (lambda x: F.linear(x, w, b))
    h, hs = h0, []
    for t in range(x0.size(1)):
        h = torch.tanh(x0[:, t] + lin(h)[:, : h.size(1)])
        hs.append(h)
    out = lin(torch.stack(hs, 1))  # [B, T, O]: the same weight over all steps at once
    return (out.square().mean() + h.sum()).float()


@pytest.mark.parametrize("bias", [False, True])
def test_loss_and_gradients_match_autograd(bias):
    torch.manual_seed(0)
    full = torch.randn(8, 10, requires_grad=True)
    w = full[:, 2:]  # a slice of a bigger parameter, like the decoder's context half of W_ih
    b = torch.randn(8, requires_grad=True) if bias else None
    x0, h0 = torch.randn(3, 5, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)
    leaves = [full, x0, h0] + ([b] if bias else [])
    got = recurrence(w, b, x0, h0, True)
    g_got = torch.autograd.grad(got, leaves)
    ref = recurrence(w, b, x0, h0, False)
    g_ref = torch.autograd.grad(ref, leaves)
    torch.testing.assert_close(got, ref)
    for a, r in zip(g_got, g_ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)


def test_weight_gradient_is_one_product_after_all_steps(monkeypatch):
    calls = []
    real = loop._WeightGrad.backward
    monkeypatch.setattr(loop._WeightGrad, "backward", staticmethod(lambda ctx, g: calls.append(1) or real(ctx, g)))
    w = torch.randn(6, 6, requires_grad=True)
    recurrence(w, None, torch.randn(2, 4, 6), torch.randn(2, 6), True).backward()
    assert len(calls) == 1 and w.grad is not None


def test_bf16_products_keep_float32_outputs_and_gradients():
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x0, h0 = torch.randn(3, 5, 8), torch.randn(3, 8)
    lin = StepLinear(w, None, torch.bfloat16)
    assert lin.w.dtype == torch.bfloat16 and lin(h0).dtype == torch.float32
    (g16,) = torch.autograd.grad(recurrence(w, None, x0, h0, True, torch.bfloat16), [w])
    (g32,) = torch.autograd.grad(recurrence(w, None, x0, h0, False), [w])
    assert g16.dtype == torch.float32
    assert not torch.equal(g16, g32)  # really computed in bf16
    torch.testing.assert_close(g16, g32, rtol=0.05, atol=0.05 * g32.abs().max().item())


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_strided_inputs_and_gradients_take_matrix_products(dtype):
    """A product over [B, S, I] keys whose input and output gradient are strided (the keys a Luong
    ``general`` score reads transposed): autograd's gradients, computed by matrix products. A strided
    3-D tensor times W is a batched product over a broadcast W in PyTorch (3-5x slower on CPU)."""
    torch.manual_seed(0)
    w = torch.randn(6, 5, requires_grad=True)
    keys = torch.randn(3, 5, 4, requires_grad=True)  # [B, I, S]: read as [B, S, I] through a transpose
    query = torch.randn(3, 2, 6)

    def scores(product):
        proj = product(keys.transpose(1, 2))  # [B, S, O], from a strided input
        return torch.bmm(query, proj.transpose(1, 2)).float().square().sum()  # ∂proj arrives strided

    def grads_and_batched_products(product):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            grads = torch.autograd.grad(scores(product), [w, keys])
        return grads, sum(e.count for e in prof.key_averages() if e.key == "aten::bmm")

    cast = dtype or torch.float32
    ref, ref_bmm = grads_and_batched_products(lambda x: F.linear(x.to(cast), w.to(cast)).to(x.dtype))
    got, got_bmm = grads_and_batched_products(StepLinear(w, None, dtype))
    assert got_bmm == ref_bmm == 2  # the score's product and its gradient: none for W
    tol = {} if dtype is None else {"rtol": 0.02, "atol": 0.02}
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, **tol)


def test_without_autograd_it_is_a_plain_linear():
    w, b, x = torch.randn(4, 3), torch.randn(4), torch.randn(2, 3)
    with torch.no_grad():
        lin = StepLinear(w.requires_grad_(), b)
        assert not lin.taped
        torch.testing.assert_close(lin(x), F.linear(x, w, b))


def test_under_autocast_as_on_cuda():
    """CUDA training autocasts around StepLinear (its own dtype unset): bf16 inputs from autocast ops
    and float32 ones must both work, and backward (outside autocast) must agree on dtypes."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x0, h0 = torch.randn(3, 5, 8), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ctx = torch.bmm(torch.randn(3, 1, 4), torch.randn(3, 4, 8)).squeeze(1)  # bf16, like attention
        lin = StepLinear(w)
        y = lin(ctx) + recurrence(w, None, x0, h0, True)
    (g,) = torch.autograd.grad(y.float().sum(), [w])
    assert g.dtype == torch.float32 and torch.isfinite(g).all()


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_mask_dropout_is_inverted_bernoulli_dropout(p):
    """The loop path's dropout (MaskDropout): about p of the values zeroed, the rest scaled by 1/(1-p)
    exactly, the gradient the same scaled mask; identity in eval mode and at p = 0."""
    torch.manual_seed(0)
    drop = loop.MaskDropout(p).train()
    x = torch.rand(400, 500) + 0.5  # no zeros of its own
    x.requires_grad_(True)
    y = drop(x)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.005  # 200,000 draws: ~0.001 standard error
    torch.testing.assert_close(y[kept], x[kept] / (1 - p), rtol=1e-6, atol=0)
    (g,) = torch.autograd.grad((y * 3).sum(), x)
    torch.testing.assert_close(g, kept.float() * 3 / (1 - p))
    # positions are independent: the kept share in each row and each column is near 1 - p too
    assert (kept.float().mean(1) - (1 - p)).abs().max() < 0.1 and (kept.float().mean(0) - (1 - p)).abs().max() < 0.1
    assert drop.eval()(x) is x and loop.MaskDropout(0.0).train()(x) is x


def test_mask_dropout_follows_the_seed_and_differs_between_calls():
    drop, x = loop.MaskDropout(0.2).train(), torch.ones(64, 33)
    torch.manual_seed(5)
    a, b = drop(x), drop(x)
    torch.manual_seed(5)
    assert torch.equal(drop(x), a) and not torch.equal(a, b)


def test_dropout_layers_come_from_the_rnn_implementation():
    """``loop`` (the CPU fast path) builds MaskDropout layers, the plain ``eager`` and ``cudnn`` nn.Dropout."""
    from test_decoder import tiny_model

    for impl, kind in [("loop", loop.MaskDropout), ("eager", torch.nn.Dropout), ("cudnn", torch.nn.Dropout)]:
        model = tiny_model("luong", "gru", False, layers=2, rnn_impl=impl)
        layers = [model.encoder.emb_dropout, model.encoder.dropout, model.decoder.dropout, model.decoder.rnn.drop]
        assert all(type(m) is kind for m in layers), impl


def test_sigmoid_tanh_is_tanh_with_tanhs_gradient():
    """2σ(2x) − 1 (the step loops' tanh where it is faster) against torch.tanh: values within float32
    rounding over the whole range, saturation included, and the same gradient (1 − y²)·g."""
    x = torch.cat([torch.linspace(-30, 30, 20001), torch.randn(5000) * 1e-3]).requires_grad_()
    y, ref = loop.sigmoid_tanh(x), torch.tanh(x)
    assert (y - ref).abs().max() <= 2.5e-7
    assert y.detach().abs().max() == 1.0  # saturates like tanh, never beyond
    g = torch.randn_like(x)
    (got,) = torch.autograd.grad(y, x, g)
    (want,) = torch.autograd.grad(ref, x, g)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the path without autograd computes the same values
        assert torch.equal(loop.sigmoid_tanh(x), y.detach())
    small = torch.tensor([1e-3, -2e-4], dtype=torch.bfloat16)  # bf16 would lose these in 2σ(2x) − 1
    assert torch.equal(loop.sigmoid_tanh(small), torch.tanh(small))


def test_the_tanh_comes_from_the_rnn_implementation_and_its_measurement():
    """``loop`` models use sigmoid_tanh wherever they take a tanh (cells, attention scores, readout) when it
    measured faster here by the margin, torch.tanh otherwise; ``eager``/``cudnn`` always torch.tanh. The
    measurement leaves the global random state alone (a seeded run builds the same model)."""
    from test_decoder import tiny_model

    state = torch.get_rng_state()
    speedup = loop.sigmoid_tanh_speedup.__wrapped__()  # measure afresh, not the process's cached result
    assert torch.equal(torch.get_rng_state(), state) and speedup > 0
    fast = loop.sigmoid_tanh if loop.sigmoid_tanh_speedup() >= loop.SIGMOID_TANH_MARGIN else torch.tanh
    for impl, want in [("loop", fast), ("eager", torch.tanh), ("cudnn", torch.tanh)]:
        model = tiny_model("bahdanau", "gru", False, layers=2, rnn_impl=impl)
        dec = model.decoder
        assert dec.tanh is dec.attention.tanh is dec.rnn.tanh is model.encoder.rnn.tanh is want, impl


def test_a_model_built_for_a_gpu_takes_torch_tanh_without_measuring_the_host_cpu():
    """Layer-norm cells run the step loops (``loop``) on a GPU too; the model's tanh is chosen for the device
    it is built for: the CPU's measured choice on the CPU, torch.tanh elsewhere, with no host-CPU measurement
    (the pin below says "the formula"; building for CUDA needs no GPU, the model stays on the CPU)."""
    from test_decoder import tiny_model

    loop.pin_kernel_choices({"sigmoid_tanh": True})
    on_cpu = tiny_model("luong", "gru", True, rnn_impl="loop", layer_norm=True)
    assert on_cpu.decoder.tanh is on_cpu.encoder.rnn.tanh is loop.sigmoid_tanh
    loop.pin_kernel_choices({})  # unpinned: a CPU build would measure now
    loop.sigmoid_tanh_speedup.cache_clear()
    try:
        model = tiny_model("luong", "gru", True, layer_norm=True, device="cuda")  # auto → loop, for the cells
        dec = model.decoder
        assert dec.rnn.impl == model.encoder.rnn.impl == "loop"
        assert dec.tanh is dec.attention.tanh is dec.rnn.tanh is model.encoder.rnn.tanh is torch.tanh
        assert loop.sigmoid_tanh_speedup.cache_info().currsize == 0  # the host CPU was not measured
    finally:
        loop.sigmoid_tanh_speedup.cache_clear()


def test_the_tanh_log_line_names_the_choice_and_its_measurement():
    """The training log's ``tanh:`` line: the formula with its factor; torch.tanh with the factor that was too
    small (the AMX Xeon of session 18 chose torch.tanh); plain torch.tanh where nothing was measured (CUDA)."""
    assert loop.tanh_line(True, 4.16) == "2σ(2x) − 1 (measured 4.2x as fast as torch.tanh on this CPU)"
    slow = loop.tanh_line(False, 0.93)
    assert slow.startswith("torch.tanh (2σ(2x) − 1 measured 0.93x") and f"{loop.SIGMOID_TANH_MARGIN}x" in slow
    assert loop.tanh_line(False, None) == "torch.tanh"
    # a pinned choice says where it came from: a resume (no measurement), or the per-machine cache
    assert loop.tanh_line(False, None, "kept") == "torch.tanh (kept)"
    assert loop.tanh_line(True, 1.9, "cached") == "2σ(2x) − 1 (measured 1.9x as fast as torch.tanh on this CPU; cached)"
    loop.sigmoid_tanh_speedup()  # measured in this process, so describe_tanh reports it whichever it chose
    assert "measured" in loop.describe_tanh(loop.tanh_kernel("loop"))
    # a model on a GPU (layer-norm cells run the loop there) computes torch.tanh whatever the host CPU measured
    # (sigmoid_tanh falls back to it off the CPU): the line says so, and names no CPU measurement
    on_gpu = loop.describe_tanh(loop.tanh_kernel("loop"), torch.device("cuda", 0))
    assert on_gpu.startswith("torch.tanh (on cuda") and "measured" not in on_gpu
