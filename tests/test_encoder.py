"""The ``loop`` encoder RNN (explicit step loops) against the ``eager`` one (nn.GRU/nn.LSTM over packed
sequences), and how ``auto`` resolves."""

from __future__ import annotations

import pytest
import torch

from nmt.errors import ConfigError
from nmt.models.encoder import Encoder
from nmt.models.rnn import resolve_impl


def encoder(cell: str, layers: int, impl: str, layer_norm: bool = False) -> Encoder:
    return Encoder(
        30,
        8,
        6,
        layers,
        cell,
        dropout=0.0,
        dec_size=10,
        dec_layers=1,
        dec_cell=cell,
        rnn_impl=impl,
        layer_norm=layer_norm,
    )


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_step_loop_matches_packed_rnn_outputs_states_and_gradients(cell, layers, layer_norm, seeded):
    """Without layer norm ``eager`` is nn.GRU/nn.LSTM over packed sequences; with it, the plain step loop
    (ordinary autograd), which ``loop`` (StepLinear) must equal too, layer-norm gains included. ``loop``'s
    cells may compute tanh as 2σ(2x) − 1 (rnn.tanh_kernel), which rounds differently in the last bit."""
    loop = encoder(cell, layers, "loop", layer_norm).train()
    eager = encoder(cell, layers, "eager", layer_norm).train()
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that their gradients differ per entry
        for n, p in loop.rnn.named_parameters():
            if n.startswith("ln_"):
                p.uniform_(0.5, 1.5)
    eager.load_state_dict(loop.state_dict())
    src_len = torch.tensor([5, 1, 7, 3])  # one full-length, one single-token sentence
    src = torch.randint(4, 30, (4, 7))
    src[torch.arange(7) >= src_len.unsqueeze(1)] = 0  # PAD
    mask = src != 0

    def run(enc):
        emb = loop.embed(src).detach().requires_grad_()
        enc.zero_grad()
        out, final = enc.rnn.encode(emb, src_len)
        h = final[0] if cell == "lstm" else final
        c = final[1] if cell == "lstm" else torch.zeros(())
        # Weigh every output so that each position's gradient differs.
        loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() + (h**3).sum() + (c**2).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in enc.rnn.named_parameters()}
        return out.detach(), h.detach(), c.detach(), emb.grad.clone(), grads

    got, ref = run(loop), run(eager)
    for a, r, what in zip(got[:4], ref[:4], ("outputs", "final h", "final c", "input gradient")):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6, msg=what)
    assert (got[0][~mask] == 0).all()
    for n in ref[4]:  # weight gradients sum over every step: float32 rounding relative to their largest entry
        scale = ref[4][n].abs().max().item()
        torch.testing.assert_close(got[4][n], ref[4][n], rtol=1e-5, atol=1e-6 * max(1.0, scale), msg=n)


def test_auto_is_the_step_loop_on_cpu_and_cudnn_on_cuda():
    assert resolve_impl("auto", torch.device("cpu")) == "loop"
    assert resolve_impl("auto", "cpu") == "loop"
    assert resolve_impl("auto", torch.device("cuda", 1)) == "cudnn"  # a pure function of the device: no GPU needed
    assert [resolve_impl(i, "cuda") for i in ("eager", "loop", "cudnn")] == ["eager", "loop", "cudnn"]


def test_an_unknown_impl_names_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"model\.rnn_impl='fast' is unknown; choose one of auto, cudnn, eager, loop"):
        resolve_impl("fast", "cpu")


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_parameters_keep_torch_rnn_names_and_shapes(cell):
    """Checkpoints written before the RNN room (plain nn.GRU/nn.LSTM) load into every implementation."""
    ref = (torch.nn.GRU if cell == "gru" else torch.nn.LSTM)(8, 6, num_layers=2, batch_first=True, bidirectional=True)
    for impl in ("eager", "loop", "cudnn"):
        rnn = encoder(cell, 2, impl).rnn
        assert {k: v.shape for k, v in rnn.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
        rnn.load_state_dict(ref.state_dict())  # strict
