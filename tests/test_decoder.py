"""The step path (used by search) and the teacher-forced paths give the same logits."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import TrainConfig
from nmt.data.batching import collate
from nmt.models.attention import ATTENTIONS
from nmt.models.build import build_model, model_from_config

V = 40


def tiny_model(
    order: str,
    cell: str,
    feed: bool,
    attention: str = "bahdanau",
    layers: int = 1,
    tie: bool = False,
    rnn_impl: str = "auto",
    layer_norm: bool = False,
    device: str = "cpu",
):
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(cell=cell, emb_size=8, hidden_size=6, layers=layers, dropout=0.0, layer_norm=layer_norm)
    cfg.decoder.update(
        order=order,
        emb_size=8,
        hidden_size=12,
        layers=layers,
        dropout=0.0,
        input_feeding=feed,
        tie_embeddings=tie,
        layer_norm=layer_norm,
    )
    cfg.attention.name = attention
    if attention == "dot" or attention == "scaled_dot":
        cfg.decoder.hidden_size = 2 * cfg.encoder.hidden_size
    return build_model(cfg.encoder, cfg.attention, cfg.decoder, V, V, rnn_impl=rnn_impl, device=device).eval()


def random_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens_s, lens_t = [5, 3, 7], [4, 6, 2]
    src = [torch.randint(4, V, (n,), generator=g).tolist() for n in lens_s]
    tgt = [torch.randint(4, V, (n,), generator=g).tolist() for n in lens_t]
    return collate(src, tgt)


CASES = [
    (order, cell, feed)
    for order, feed in [("bahdanau", True), ("luong", True), ("luong", False)]
    for cell in ("gru", "lstm")
]


@pytest.mark.parametrize("order,cell,feed", CASES)
@pytest.mark.parametrize("attention,layers", [("bahdanau", 2)] + [(a, 1) for a in sorted(ATTENTIONS)])
def test_step_equals_full_pass(order, cell, feed, attention, layers, seeded):
    model = tiny_model(order, cell, feed, attention=attention, layers=layers)
    b = random_batch()
    with torch.no_grad():
        full, att_full = model(b.src, b.src_len, b.tgt_in)
        state = model.start(b.src, b.src_len)
        steps, atts = [], []
        for t in range(b.tgt_in.size(1)):
            logits, state, w = model.decoder.step(b.tgt_in[:, t], state)
            steps.append(logits)
            atts.append(w)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(atts, 1), att_full, rtol=1e-5, atol=1e-5)


def test_one_call_luong_equals_step_loop_with_gradients(seeded):
    """The one-call path (nn.GRU over all steps) and the hand-written cell loop: same loss and grads."""
    model = tiny_model("luong", "gru", feed=False, attention="general")
    b = random_batch(1)
    logits_fast, _ = model(b.src, b.src_len, b.tgt_in)
    model.zero_grad()
    logits_fast.sum().backward()
    grads_fast = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    state = model.start(b.src, b.src_len)
    steps = []
    for t in range(b.tgt_in.size(1)):
        lg, state, _ = model.decoder.step(b.tgt_in[:, t], state)
        steps.append(lg)
    logits_loop = torch.stack(steps, 1)
    logits_loop.sum().backward()
    torch.testing.assert_close(logits_loop, logits_fast, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        if n in grads_fast:
            torch.testing.assert_close(p.grad, grads_fast[n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_hand_written_cell_matches_torch_cell(cell, seeded):
    model = tiny_model("luong", cell, feed=False)
    dec = model.decoder
    torch_cell = (torch.nn.GRUCell if cell == "gru" else torch.nn.LSTMCell)(8, 12)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(torch_cell, name).data.copy_(getattr(dec.rnn, f"{name}_l0").data)
    x, h = torch.randn(3, 8), torch.randn(3, 12)
    weights = dec.rnn.step_weights()
    gx = dec.rnn.first_gates(weights, x)
    if cell == "gru":
        torch.testing.assert_close(dec.rnn.step(weights, gx, h[None])[0], torch_cell(x, h))
    else:
        c = torch.randn(3, 12)
        got_h, got_c = (s[0] for s in dec.rnn.step(weights, gx, (h[None], c[None])))
        ref_h, ref_c = torch_cell(x, (h, c))
        torch.testing.assert_close(got_h, ref_h)
        torch.testing.assert_close(got_c, ref_c)


def test_tied_embeddings_share_the_matrix():
    model = tiny_model("luong", "gru", feed=True, tie=True)
    assert model.decoder.out.weight is model.decoder.embed.weight


@pytest.mark.parametrize("order,cell,feed", CASES)
@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_a_tiny_train_step_lowers_the_loss(order, cell, feed, attention, seeded):
    from nmt.models.seq2seq import nll_loss

    model = tiny_model(order, cell, feed, attention=attention).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    b = random_batch()
    losses = []
    for _ in range(3):
        logits, _ = model(b.src, b.src_len, b.tgt_in)
        loss = nll_loss(logits, b.tgt_out) / b.n_tgt_tokens
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None for n, p in model.named_parameters() if "attention" in n), attention
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("order,cell,feed", CASES)
def test_scheduled_sampling_trains(order, cell, feed, seeded):
    model = tiny_model(order, cell, feed).train()
    b = random_batch()
    logits, _ = model(b.src, b.src_len, b.tgt_in, teacher_forcing=0.5)
    assert logits.shape == (3, b.tgt_in.size(1), V)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.decoder.rnn.parameters())


def loss_and_grads(model, b):
    from nmt.models.seq2seq import nll_loss

    model.zero_grad()
    logits, _ = model(b.src, b.src_len, b.tgt_in)
    loss = nll_loss(logits, b.tgt_out, 0.1) / b.n_tgt_tokens
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("order,cell,feed", CASES)
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_one_weight_gradient_per_pass_matches_per_step_autograd(order, cell, feed, layers, layer_norm, seeded):
    """The ``loop`` RNNs (StepLinear: ∂W once per pass, in the encoder and the decoder) give the ``eager``
    ones' (packed nn.GRU/nn.LSTM encoder, per-step F.linear decoder loop) logits, loss and gradients;
    with layer-normalised cells too (both then step loops; every layer-norm gain's gradient compared)."""
    model = tiny_model(order, cell, feed, layers=layers, rnn_impl="loop", layer_norm=layer_norm).train()
    eager = tiny_model(order, cell, feed, layers=layers, rnn_impl="eager", layer_norm=layer_norm).train()
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that their gradients differ per entry
        for n, p in model.named_parameters():
            if ".ln_" in n:
                p.uniform_(0.5, 1.5)
    eager.load_state_dict(model.state_dict())
    b = random_batch()
    loss, grads = loss_and_grads(model, b)
    ref_loss, ref_grads = loss_and_grads(eager, b)
    with torch.no_grad():
        torch.testing.assert_close(model(b.src, b.src_len, b.tgt_in), eager(b.src, b.src_len, b.tgt_in))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("order,cell,feed", CASES)
def test_bf16_decoder_products_match_float32_loss_and_gradients(order, cell, feed, seeded):
    """The CPU fast path (vocabulary projection, both RNNs' step-loop GEMMs, the readout / combine and the
    attention's projections in bf16) stays within bf16 rounding of float32."""
    model = tiny_model(order, cell, feed, layers=2, rnn_impl="loop").train()
    b = random_batch()
    loss32, g32 = loss_and_grads(model, b)
    model.set_matmul_dtype(torch.bfloat16)
    loss16, g16 = loss_and_grads(model, b)
    assert model.decoder.logits(torch.ones(1, 1, model.decoder.out_size)).dtype == torch.bfloat16
    assert model.decoder.rnn.step_weights().hh[0].w.dtype == torch.bfloat16
    assert model.encoder.rnn.matmul_dtype == torch.bfloat16
    dec = model.decoder
    assert dec.linear(dec.read_layer()).w.dtype == dec.linear(dec.attention.W_q).w.dtype == torch.bfloat16
    assert loss16 != loss32  # the fast path really ran in bf16
    torch.testing.assert_close(loss16, loss32, rtol=1e-2, atol=1e-2)
    assert g16.keys() == g32.keys()
    for n in g32:
        scale = g32[n].abs().max().clamp_min(1e-3)
        assert (g16[n] - g32[n]).abs().max() / scale < 0.05, n


def test_rnn_impl_comes_from_config_and_old_configs_get_auto():
    """model.rnn_impl picks both RNNs' implementation; a checkpoint config from before the key existed
    (no ``model`` section) builds with ``auto``, the loop on CPU."""
    cfg = OmegaConf.to_container(OmegaConf.structured(TrainConfig))
    cfg["attention"]["name"] = "bahdanau"
    cfg["model"] = {"rnn_impl": "eager"}
    model = model_from_config(OmegaConf.create(cfg), V, V, "cpu")
    assert (model.encoder.rnn.impl, model.decoder.rnn.impl) == ("eager", "eager")
    del cfg["model"]
    model = model_from_config(OmegaConf.create(cfg), V, V, "cpu")
    assert (model.encoder.rnn.impl, model.decoder.rnn.impl) == ("loop", "loop")
