"""Model-side regularisers (issue 14): layer-normalised cells, separate embedding dropout, three-way tied
embeddings; and that configs/checkpoints from before them build the same model as before."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from test_decoder import V, random_batch, tiny_model

from nmt import checkpoint
from nmt.config import TrainConfig, validate
from nmt.errors import ConfigError
from nmt.models.build import count_parameters, model_from_config
from nmt.models.rnn import RNN, resolve_impl


def train_config(**sections) -> OmegaConf:
    cfg = OmegaConf.structured(TrainConfig)
    cfg.attention.name = "bahdanau"
    cfg.encoder.update(emb_size=8, hidden_size=6, dropout=0.3)
    cfg.decoder.update(emb_size=8, hidden_size=12, dropout=0.3)
    for name, values in sections.items():
        cfg[name].update(values)
    return cfg


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("impl", ["eager", "loop"])
def test_layer_norm_cell_is_the_papers(cell, impl, seeded):
    """One unidirectional layer against Ba et al. 2016 written out: LN(W_ih x)·g_ih + b_ih and
    LN(W_hh h)·g_hh + b_hh as gate pre-activations; an LSTM's output σ(o)·tanh(LN(c)·g_c + b_c)."""
    rnn = RNN(cell, 5, 4, 1, 0.0, False, impl, layer_norm=True)
    with torch.no_grad():
        for p in rnn.parameters():
            p.uniform_(-1, 1)
    x = torch.randn(3, 6, 5)
    out, _ = rnn(x)
    w = {n: p.detach() for n, p in rnn.named_parameters()}

    def ln(v, g, b=None):
        return F.layer_norm(v, v.shape[-1:]) * g + (0 if b is None else b)

    h, c, ref = torch.zeros(3, 4), torch.zeros(3, 4), []
    for t in range(6):
        gx = ln(x[:, t] @ w["weight_ih_l0"].T, w["ln_ih_l0"], w["bias_ih_l0"])
        gh = ln(h @ w["weight_hh_l0"].T, w["ln_hh_l0"], w["bias_hh_l0"])
        if cell == "lstm":
            i, f, g, o = (gx + gh).chunk(4, 1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            h = o.sigmoid() * ln(c, w["ln_c_l0"], w["ln_c_bias_l0"]).tanh()
        else:
            (xr, xz, xn), (hr, hz, hn) = gx.chunk(3, 1), gh.chunk(3, 1)
            r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
            n = (xn + r * hn).tanh()
            h = (1 - z) * n + z * h
        ref.append(h)
    torch.testing.assert_close(out, torch.stack(ref, 1), rtol=1e-5, atol=1e-5)


def test_layer_norm_starts_at_unit_gains_and_really_normalises(seeded):
    model = tiny_model("bahdanau", "lstm", True, layer_norm=True)
    gains = {n: p for n, p in model.named_parameters() if ".ln_" in n}
    assert gains and all(bool((p == (0 if "ln_c_bias" in n else 1)).all()) for n, p in gains.items())
    plain = tiny_model("bahdanau", "lstm", True)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".ln_" not in k})  # strict
    b = random_batch()
    with torch.no_grad():
        assert not torch.allclose(model(b.src, b.src_len, b.tgt_in)[0], plain(b.src, b.src_len, b.tgt_in)[0])


def test_layer_norm_gains_start_where_each_section_says():
    cfg = train_config(
        encoder={"cell": "lstm", "layer_norm": True, "layer_norm_gain": 0.1},
        decoder={"layer_norm": True, "layer_norm_gain": 0.5},
    )
    model = model_from_config(cfg, V, V, "cpu")
    for part, gain in ((model.encoder, 0.1), (model.decoder, 0.5)):
        norms = {n: p for n, p in part.named_parameters() if ".ln_" in n}
        assert norms and all(bool((p == (0 if "ln_c_bias" in n else gain)).all()) for n, p in norms.items()), part
    # the gains are parameters like any other: they receive gradients
    b = random_batch()
    model(b.src, b.src_len, b.tgt_in)[0].sum().backward()
    assert model.encoder.rnn.ln_ih_l0.grad.abs().sum() > 0


@pytest.mark.parametrize("order,feed", [("bahdanau", True), ("luong", True), ("luong", False)])
def test_layer_norm_step_equals_full_pass(order, feed, seeded):
    """Search's step path against the teacher-forced one (for Luong without feeding, the one-call RNN)."""
    model = tiny_model(order, "gru", feed, layers=2, layer_norm=True)
    b = random_batch()
    with torch.no_grad():
        full, _ = model(b.src, b.src_len, b.tgt_in)
        state, steps = model.start(b.src, b.src_len), []
        for t in range(b.tgt_in.size(1)):
            logits, state, _ = model.decoder.step(b.tgt_in[:, t], state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_cudnn_with_layer_norm_is_refused_and_auto_takes_the_step_loops():
    assert resolve_impl("auto", "cuda", layer_norm=True) == "loop"
    assert resolve_impl("auto", "cuda") == "cudnn"
    with pytest.raises(ConfigError, match="model.rnn_impl=cudnn cannot compute layer-normalised cells"):
        resolve_impl("cudnn", "cuda", layer_norm=True)


def test_bad_values_fail_in_one_line_each_before_any_work():
    cfg = train_config(
        encoder={"layer_norm": True, "emb_dropout": 1.0, "layer_norm_gain": 0.0},
        decoder={"emb_size": 16},
        model={"rnn_impl": "cudnn", "tie_all_embeddings": True},
        tokenizer={"joint": False},
    )
    with pytest.raises(ConfigError) as e:
        validate(cfg, "train")
    lines = str(e.value).splitlines()
    assert len(lines) == 5, lines
    assert "encoder.emb_dropout=1.0: expected a probability in [0, 1)" in lines
    assert "encoder.layer_norm_gain=0.0: expected a number > 0" in lines
    assert any(line.startswith("model.rnn_impl=cudnn cannot compute layer-normalised cells") for line in lines)
    assert any("needs tokenizer.joint=true" in line for line in lines)
    assert any("needs encoder.emb_size (8) == decoder.emb_size (16)" in line for line in lines)


def old_checkpoint_config() -> dict:
    """A train config as checkpoints stored it before these keys existed."""
    cfg = OmegaConf.to_container(train_config())
    keys = ("emb_dropout", "layer_norm", "layer_norm_gain")
    for section in ("encoder", "decoder"):
        for k in keys:
            del cfg[section][k]
    del cfg["model"]["tie_all_embeddings"]
    return cfg


def train_logits(model, seed=1):
    b = random_batch()
    torch.manual_seed(seed)
    return model.train()(b.src, b.src_len, b.tgt_in)[0]


def test_old_configs_build_the_old_model_and_emb_dropout_null_is_dropout(seeded):
    old = model_from_config(OmegaConf.create(old_checkpoint_config()), V, V, "cpu")
    assert not any(".ln_" in k for k in old.state_dict())  # nn.GRU/nn.LSTM parameters only
    assert old.encoder.emb_dropout.p == old.encoder.dropout.p == 0.3
    assert old.decoder.emb_dropout.p == old.decoder.dropout.p == 0.3
    new = model_from_config(train_config(), V, V, "cpu")
    new.load_state_dict(old.state_dict())  # strict: the same parameters
    explicit = model_from_config(train_config(encoder={"emb_dropout": 0.3}, decoder={"emb_dropout": 0.3}), V, V, "cpu")
    explicit.load_state_dict(old.state_dict())
    # The same dropout masks in the same order: training behaves exactly as with one rate.
    torch.testing.assert_close(train_logits(new), train_logits(old), rtol=0, atol=0)
    torch.testing.assert_close(train_logits(explicit), train_logits(old), rtol=0, atol=0)


def test_separate_rates_act_where_they_say(seeded):
    """emb_dropout only on the embeddings, dropout only on the hidden side."""
    b = random_batch()
    seen = {}
    model = model_from_config(
        train_config(encoder={"emb_dropout": 0.0, "dropout": 0.5}, decoder={"emb_dropout": 0.5, "dropout": 0.0}),
        V,
        V,
        "cpu",
    ).train()
    real_encode = model.encoder.rnn.encode
    model.encoder.rnn.encode = lambda x, n: seen.setdefault("enc_in", x) is not None and real_encode(x, n)
    model.encoder(b.src, b.src_len)
    torch.testing.assert_close(seen["enc_in"], model.encoder.embed(b.src))  # no dropout on source embeddings
    emb = model.decoder.emb_dropout(model.decoder.embed(b.tgt_in))
    assert model.decoder.emb_dropout.p == 0.5 and model.decoder.dropout.p == 0.0
    assert (emb == 0).float().mean() > 0.3  # target embeddings dropped


def test_three_way_tying_is_one_parameter_smaller_by_one_matrix_and_round_trips(tmp_path, seeded):
    tied_dec = model_from_config(train_config(decoder={"tie_embeddings": True}), V, V, "cpu")
    cfg = train_config(model={"tie_all_embeddings": True})  # implies decoder.tie_embeddings
    model = model_from_config(cfg, V, V, "cpu")
    w = model.encoder.embed.weight
    assert w is model.decoder.embed.weight is model.decoder.out.weight
    assert count_parameters(model) == count_parameters(tied_dec) - V * cfg.encoder.emb_size
    with torch.no_grad():
        w.normal_()
    checkpoint.save(
        tmp_path / "m.pt", {"model": model.state_dict(), "tokenizer": {}, "config": OmegaConf.to_container(cfg)}
    )
    ckpt = checkpoint.load(tmp_path / "m.pt")
    back = model_from_config(OmegaConf.create(ckpt["config"]), V, V, "cpu")
    back.load_state_dict(ckpt["model"])  # strict
    assert back.encoder.embed.weight is back.decoder.embed.weight is back.decoder.out.weight
    torch.testing.assert_close(back.encoder.embed.weight, w)
    b = random_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            back.eval()(b.src, b.src_len, b.tgt_in)[0], model.eval()(b.src, b.src_len, b.tgt_in)[0]
        )


def test_three_way_tying_refuses_two_vocabularies():
    with pytest.raises(ConfigError, match="source has 40 pieces and the target 50"):
        model_from_config(train_config(model={"tie_all_embeddings": True}), V, 50, "cpu")


def test_a_run_from_before_these_keys_resumes_without_reporting_them():
    from nmt.training import config_changes

    new = OmegaConf.to_container(train_config())
    assert config_changes(old_checkpoint_config(), new, []) == []
    new["encoder"]["layer_norm"] = True
    # the old run had the key's default (no layer norm), so that is what the change is reported from
    assert config_changes(old_checkpoint_config(), new, []) == [("encoder.layer_norm", False, True)]


def test_lstm_forget_bias_starts_every_forget_gate_there_and_nothing_else():
    cfg = train_config(encoder={"cell": "lstm", "layer_norm": True}, model={"lstm_forget_bias": 1.0})
    validate(cfg, "train")
    model = model_from_config(cfg, V, V, "cpu")
    plain = model_from_config(train_config(encoder={"cell": "lstm", "layer_norm": True}), V, V, "cpu")
    rnns = [m for m in model.modules() if isinstance(m, RNN)]
    assert len(rnns) == 2 and all(m.lstm for m in rnns)  # the encoder's and the decoder's
    for m in rnns:
        h = m.hidden_size
        for name, p in m.named_parameters():
            if name.startswith("bias_"):
                expected = 1.0 if name.startswith("bias_ih") else 0.0
                assert bool((p[h : 2 * h] == expected).all()), name
                others = torch.cat([p[:h], p[2 * h :]])
                assert others.abs().max() <= 0.1 and others.abs().max() > 0, name  # still the uniform start
    # without the key, the forget gates start like every other bias
    for m in (m for m in plain.modules() if isinstance(m, RNN)):
        h = m.hidden_size
        assert m.bias_ih_l0[h : 2 * h].abs().max() < 0.1


def test_lstm_forget_bias_on_gru_cells_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        validate(train_config(model={"lstm_forget_bias": 1.0}), "train")
    assert str(e.value) == (
        "model.lstm_forget_bias=1.0 is for LSTM cells, but encoder.cell and decoder.cell are 'gru' "
        "(set encoder.cell=lstm, or drop the key)"
    )
