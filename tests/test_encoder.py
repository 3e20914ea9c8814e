"""The CPU encoder (explicit step loops) against nn.GRU/nn.LSTM over packed sequences."""

from __future__ import annotations

import pytest
import torch

from nmt.models.encoder import Encoder


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_step_loop_matches_packed_rnn_outputs_states_and_gradients(cell, layers, seeded):
    enc = Encoder(30, 8, 6, layers, cell, dropout=0.0, dec_size=10, dec_layers=1, dec_cell=cell).train()
    src_len = torch.tensor([5, 1, 7, 3])  # one full-length, one single-token sentence
    src = torch.randint(4, 30, (4, 7))
    src[torch.arange(7) >= src_len.unsqueeze(1)] = 0  # PAD
    emb = enc.embed(src).detach().requires_grad_()
    mask = src != 0

    def run(fn):
        enc.zero_grad()
        emb.grad = None
        out, final = fn()
        h = final[0] if cell == "lstm" else final
        c = final[1] if cell == "lstm" else torch.zeros(())
        # Weigh every output so that each position's gradient differs.
        loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() + (h**3).sum() + (c**2).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in enc.rnn.named_parameters()}
        return out.detach(), h.detach(), c.detach(), emb.grad.clone(), grads

    got = run(lambda: enc._step_loop(emb, src_len, mask))
    ref = run(lambda: enc._packed(emb, src_len))
    for a, r, what in zip(got[:4], ref[:4], ("outputs", "final h", "final c", "input gradient")):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6, msg=what)
    assert (got[0][~mask] == 0).all()
    for n in ref[4]:
        torch.testing.assert_close(got[4][n], ref[4][n], rtol=1e-5, atol=1e-6, msg=n)


def test_cpu_forward_uses_the_step_loop(monkeypatch):
    enc = Encoder(30, 8, 6, 1, "gru", dropout=0.0, dec_size=10, dec_layers=1, dec_cell="gru")
    monkeypatch.setattr(enc, "_packed", lambda *a: pytest.fail("packed path used on CPU"))
    out = enc(torch.tensor([[5, 6, 0], [7, 8, 9]]), torch.tensor([2, 3]))
    assert out.keys.shape == (2, 3, 12)
