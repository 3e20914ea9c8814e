"""Attention decoders in the two classic orders.

* Bahdanau order (Bahdanau et al. 2015): attend with the *previous* state, feed the
  context into the RNN, read out from [s_t; c_t; e_t].
* Luong order (Luong et al. 2015): run the RNN, attend with the *current* state,
  attentional state h̃_t = tanh(W_c [c_t; h_t]); optionally fed to the next input.

Speed is designed in: the RNN (nmt.models.rnn, which decides how it is computed) keeps
its weights in one ``nn.GRU``/``nn.LSTM`` so that Luong order without input feeding runs
the whole target in one (cuDNN) call; step loops use the same weights through a
hand-written cell so the embedding part of the input GEMM is computed once for all
steps; per-step outputs are collected and the output projection runs once after the loop. ``step`` (used by search)
and ``forward`` share the same cell code, and a test holds them to the same logits.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from nmt.data.tokenizer import PAD
from nmt.errors import ConfigError
from nmt.models.attention import Attention, AttentionState
from nmt.models.encoder import EncoderOutput, check_cell
from nmt.models.rnn import RNN, CastLinear, RNNState, StepLinear, StepWeights, dropout_layer, packs_float32


@dataclass
class PassProducts:
    """A pass's products, made once in ``init_state``: the RNN's (opaque, from RNN.step_weights) and the
    decoder's own layers: ``read`` (readout in Bahdanau order, combine in Luong order) and ``out`` (the
    vocabulary projection, → logits). In training these are the modules themselves (``out`` through
    ``Decoder.logits``); in a search with bf16 products set (Seq2Seq.set_matmul_dtype) they are
    ``CastLinear``s, so their weights are cast once per search instead of at every step, and the readout /
    combine product runs in bf16 too. Batch-independent: a search reuses them at every step and every
    beam reordering."""

    rnn: StepWeights
    read: Callable[[torch.Tensor], torch.Tensor]
    out: Callable[[torch.Tensor], torch.Tensor]
    gates: GateTable | None = None  # a search's layer-0 embedding gates by target id (Decoder.gate_table)


# Each decoder's GateTable, kept for its next search (Decoder.gate_table). Beside the module, not on it: a cache,
# which copies of the model (deepcopy, pickle) neither carry nor need, and whose packed weight cannot be copied.
_GATE_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class GateTable:
    """Layer 0's embedding gates by target id, for searches on the CPU fast path (``loop``).

    A search step feeds back the ids it chose; the RNN's first input product turns each id's embedding e_y
    into W_e e_y + b [G*H] (``RNN.first_gates``), the same vector whenever the same id comes back. The table
    computes an id's row the first time a search feeds it (one product over the step's new ids) and gathers
    it after that, so most steps gather [N, G*H] rows instead of an [N, E] × [E, G*H] product (for model R
    about 6% of a search step's arithmetic). The rows come from the same packed product
    (``rnn.packed_linear``), whose result for a row does not depend on the other rows of the call
    (tests/test_fast_search.py): a step's gates are the same bit for bit as without the table. One table
    serves every search while the weights it was made from are unchanged (``Decoder.gate_table``); its
    memory ([V, G*H] floats) is only touched for the ids that occur.
    """

    def __init__(self, first: StepLinear, embed: torch.Tensor, key: tuple):
        self.first, self.embed, self.key = first, embed, key
        self.table: torch.Tensor | None = None  # [V, G*H], rows valid where ``have``
        self.have = torch.zeros(embed.size(0), dtype=torch.bool, device=embed.device)

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        """y [N] target ids → their gates [N, G*H]."""
        new = y[~self.have[y]]
        if new.numel():
            new = new.unique()
            rows = self.first(self.embed.index_select(0, new))
            if self.table is None:
                self.table = rows.new_empty(self.embed.size(0), rows.size(1))
            self.table[new] = rows
            self.have[new] = True
        return self.table.index_select(0, y)


@dataclass
class DecoderState:
    hidden: RNNState  # [L, B, H] (GRU) or a pair of them (LSTM)
    attn: AttentionState
    weights: PassProducts  # made once per pass in init_state
    feed: torch.Tensor | None = None  # [B, O] last attentional vector (Luong input feeding)

    def index_select(self, idx: torch.Tensor) -> DecoderState:
        """Reorder/expand along the batch (any rows: e.g. sentences leaving a search)."""
        return self._with(idx, self.attn.index_select(idx))

    def reorder_beams(self, idx: torch.Tensor) -> DecoderState:
        """``index_select`` for beam back-pointers that stay within each sentence's beams: the
        hypothesis' own state moves, the sentence's encoder side stays (AttentionState.reorder_beams)."""
        return self._with(idx, self.attn.reorder_beams(idx))

    def _with(self, idx: torch.Tensor, attn: AttentionState) -> DecoderState:
        """This state's own rows ``idx`` (hidden, input feed) beside ``attn``."""
        if isinstance(self.hidden, tuple):
            hidden = tuple(h.index_select(1, idx) for h in self.hidden)
        else:
            hidden = self.hidden.index_select(1, idx)
        feed = None if self.feed is None else self.feed.index_select(0, idx)
        return DecoderState(hidden, attn, self.weights, feed)


def output_rows(
    layer: nn.Module, vocab: torch.Tensor, dtype: torch.dtype | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The output layer's rows ``vocab`` as one product, x [.., O] → [.., len(vocab)], in ``dtype`` (None: the
    weight's own); an int8 layer (nmt.models.quant.QuantLinear) makes its own."""
    if hasattr(layer, "rows"):
        return layer.rows(vocab)
    w = layer.weight.detach().index_select(0, vocab)
    b = None if layer.bias is None else layer.bias.detach().index_select(0, vocab)
    return CastLinear(w, b, dtype or w.dtype)


def top(hidden: RNNState) -> torch.Tensor:
    """Top-layer hidden state [B, H]."""
    return (hidden[0] if isinstance(hidden, tuple) else hidden)[-1]


class Decoder(nn.Module):
    """Shared parts: embeddings, the stacked RNN, attention, output layer, scheduled sampling."""

    def __init__(
        self,
        vocab_size: int,
        emb_size: int,
        hidden_size: int,
        layers: int,
        cell: str,
        dropout: float,
        attention: Attention,
        key_size: int,
        extra_input: int,
        out_size: int,
        tie_embeddings: bool,
        rnn_impl: str = "loop",
        emb_dropout: float | None = None,
        layer_norm: bool = False,
        tanh: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        """``dropout``: between RNN layers and on the readout / attentional vector; ``emb_dropout``: on
        the target embeddings (None = ``dropout``); ``layer_norm``: layer-normalised cells; ``tanh``: the
        model's (``nmt.models.rnn.tanh_kernel``; None = the CPU's choice)."""
        super().__init__()
        check_cell(cell, "decoder.cell")
        self.emb_size, self.hidden_size, self.layers = emb_size, hidden_size, layers
        self.key_size, self.out_size = key_size, out_size
        self.embed = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        self.emb_dropout = dropout_layer(dropout if emb_dropout is None else emb_dropout, rnn_impl)
        self.dropout = dropout_layer(dropout, rnn_impl)
        self.rnn = RNN(cell, emb_size + extra_input, hidden_size, layers, dropout, False, rnn_impl, layer_norm, tanh)
        # The readout / combine's and the attention's tanh: the RNN implementation's (rnn.tanh_kernel).
        self.tanh = attention.tanh = self.rnn.tanh
        self.attention = attention
        self.out = nn.Linear(out_size, vocab_size)
        if tie_embeddings:
            if out_size != emb_size:
                raise ConfigError(
                    f"decoder.tie_embeddings needs the output size {out_size} == decoder.emb_size {emb_size}"
                )
            self.out.weight = self.embed.weight

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """[.., O] → [.., V]: once over all steps of a teacher-forced pass ([B, T, O]), or one step ([B, O])
        of a pass that records gradients (scheduled sampling) or runs in float32; a search with bf16
        products uses PassProducts.out instead, the same product with the weight cast once per search.

        In the RNN's product dtype (bf16 on CPUs with matrix units, see Seq2Seq.set_matmul_dtype; the
        logits then come out in bf16): with the step loop's GEMMs, the vocabulary projection is most
        of a step's arithmetic, in training and in beam search alike.
        """
        dtype = self.rnn.matmul_dtype
        if dtype is None:
            return self.out(x)
        with torch.autocast(x.device.type, dtype=dtype):
            return self.out(x)

    def read_layer(self) -> nn.Module:
        """The layer between the RNN/attention and the output projection (readout or combine)."""
        raise NotImplementedError

    def linear(self, layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        """One of the decoder's own layers (readout / combine, the attention's projections) as this pass
        computes it. With a product dtype set (Seq2Seq.set_matmul_dtype: bf16 on CPUs with matrix units),
        an ``nn.Linear`` becomes its product in that dtype with a float32 result: in training made by the
        RNN's implementation (``loop``: nmt.models.rnn.StepLinear, one weight cast and one weight gradient
        per pass however many steps use it; ``eager``: EagerLinear), in a search cast once (CastLinear).
        In float32 the layer itself, except in a search or validation on the CPU fast path (``loop``), where
        oneDNN's packed float32 product is taken where it measured faster (CastLinear, rnn.packed_weight).
        An int8 layer of nmt.models.quant stays itself."""
        dtype = self.rnn.matmul_dtype
        if type(layer) is not nn.Linear or (dtype is None and not self._packs_float32()):
            return layer
        if torch.is_grad_enabled():
            return self.rnn.linear(layer)
        return CastLinear(layer.weight, layer.bias, dtype or torch.float32, torch.float32, pack=self.packs_weights())

    def packs_weights(self) -> bool:
        """Whether this pass may block weights once for all its steps (rnn.packed_weight): the CPU fast
        path (``loop``); ``eager`` keeps F.linear."""
        return self.rnn.impl == "loop"

    def _packs_float32(self) -> bool:
        """Whether this pass takes float32 products over packed weights: the fast path, no gradients, on a
        CPU where oneDNN's packed float32 product measured faster (rnn.packs_float32)."""
        return (
            self.packs_weights()
            and not torch.is_grad_enabled()
            and self.out.weight.device.type == "cpu"
            and packs_float32()
        )

    def pass_products(self, vocab: torch.Tensor | None = None) -> PassProducts:
        """This pass's products (PassProducts): the readout / combine as ``linear`` makes it; the vocabulary
        projection cast once to the RNN's product dtype when no gradient is being recorded (search,
        validation) and that dtype is set, ``Decoder.logits`` otherwise (training, float32, or int8 layers
        put in by nmt.models.quant). ``vocab`` (sorted target ids, a search's shortlist: nmt.shortlist)
        restricts the vocabulary projection to those rows, so logits come out [.., len(vocab)]."""
        rnn, read, dtype = self.rnn.step_weights(self.emb_size), self.linear(self.read_layer()), self.rnn.matmul_dtype
        if vocab is not None and torch.is_grad_enabled():
            raise ValueError("a vocabulary shortlist is for search only (no gradients through it)")
        if dtype is None and vocab is None and type(self.out) is nn.Linear and self._packs_float32():
            out = CastLinear(self.out.weight, self.out.bias, torch.float32, pack=True)
        elif dtype is None or torch.is_grad_enabled():
            out = self.logits if vocab is None else output_rows(self.out, vocab, None)
        # Logits in the product dtype, as Decoder.logits gives them (an int8 layer makes its own product).
        elif vocab is not None:
            out = output_rows(self.out, vocab, dtype)
        elif type(self.out) is nn.Linear:
            out = CastLinear(self.out.weight, self.out.bias, dtype, pack=self.packs_weights())
        else:
            out = self.out
        return PassProducts(rnn, read, out, self.gate_table(rnn))

    def gate_table(self, rnn: StepWeights) -> GateTable | None:
        """The ``GateTable`` a search over this pass's RNN products ``rnn`` reads its embedding gates from,
        or None where a step computes them (``step_gates``): a table needs a pass without gradients, outside
        training mode (dropout on the embeddings draws per step), the CPU fast path's packed first product
        (``StepLinear`` over a packed weight: not int8, not F.linear), and no layer norm on the gates. The
        table is kept beside the decoder (``_GATE_TABLES``) and used again while the embedding and the RNN's
        layer-0 input weights are the same tensors, unchanged (their storage and version counter: an optimiser
        step or a loaded state dict makes a new one)."""
        first = rnn.first
        if (
            torch.is_grad_enabled()
            or self.training
            or not self.packs_weights()
            or rnn.norm0 is not None
            or type(first) is not StepLinear
            or first.packed is None
        ):
            return None
        weights = (self.embed.weight, self.rnn.weight_ih_l0, self.rnn.bias_ih_l0)
        key = (first.w.dtype, *((w.data_ptr(), w._version) for w in weights))
        table = _GATE_TABLES.get(self)
        if table is None or table.key != key:
            table = _GATE_TABLES[self] = GateTable(first, self.embed.weight.detach(), key)
        return table

    def step_gates(self, y_prev: torch.Tensor, emb: torch.Tensor, products: PassProducts) -> torch.Tensor:
        """Layer 0's input gates from this step's target ids ``y_prev`` [B] and their embeddings ``emb`` [B, E]
        (after dropout) → [B, G*H]: from the pass's GateTable where it has one, else the product itself."""
        if products.gates is not None:
            return products.gates(y_prev)
        return self.rnn.first_gates(products.rnn, emb)

    # ---- interface ----
    def init_state(self, enc: EncoderOutput, vocab: torch.Tensor | None = None) -> DecoderState:
        """The state a pass starts from; ``vocab``: a search's shortlist (``pass_products``)."""
        # The RNN's layer-0 input is split embedding | context (Bahdanau) or fed vector (Luong).
        attn = self.attention.prepare(enc.keys, enc.mask, self.linear)
        return DecoderState(enc.state, attn, self.pass_products(vocab))

    def step(self, y_prev: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState, torch.Tensor]:
        """y_prev [B] → (logits [B, V], new state, attention weights [B, S])."""
        raise NotImplementedError

    def forward(
        self, tgt_in: torch.Tensor, enc: EncoderOutput, teacher_forcing: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass: tgt_in [B, T] → (logits [B, T, V], attention [B, T, S])."""
        if teacher_forcing < 1.0 and self.training:
            return self._sampled(tgt_in, enc, teacher_forcing)
        return self._teacher_forced(tgt_in, enc)

    def _teacher_forced(self, tgt_in: torch.Tensor, enc: EncoderOutput):
        raise NotImplementedError

    def _sampled(self, tgt_in: torch.Tensor, enc: EncoderOutput, ratio: float):
        """Scheduled sampling (Bengio et al. 2015): per sentence and step, feed the reference
        token with probability ``ratio``, else the model's own previous argmax. Needs the step loop."""
        state = self.init_state(enc)
        y = tgt_in[:, 0]
        logits, weights = [], []
        for t in range(tgt_in.size(1)):
            lg, state, w = self.step(y, state)
            logits.append(lg)
            weights.append(w)
            if t + 1 < tgt_in.size(1):
                use_ref = torch.rand(y.shape, device=y.device) < ratio
                y = torch.where(use_ref, tgt_in[:, t + 1], lg.argmax(-1))
        return torch.stack(logits, 1), torch.stack(weights, 1)


class BahdanauDecoder(Decoder):
    """Attend with s_{t-1}, feed [e_t; c_t] to the RNN, read out tanh(W_o [s_t; c_t; e_t])."""

    def __init__(
        self,
        vocab_size: int,
        emb_size: int,
        hidden_size: int,
        layers: int,
        cell: str,
        dropout: float,
        attention: Attention,
        key_size: int,
        tie_embeddings: bool,
        rnn_impl: str = "loop",
        **options,  # Decoder's emb_dropout, layer_norm, tanh
    ):
        out_size = emb_size if tie_embeddings else hidden_size
        super().__init__(
            vocab_size,
            emb_size,
            hidden_size,
            layers,
            cell,
            dropout,
            attention,
            key_size,
            extra_input=key_size,
            out_size=out_size,
            tie_embeddings=tie_embeddings,
            rnn_impl=rnn_impl,
            **options,
        )
        self.readout = nn.Linear(hidden_size + key_size + emb_size, out_size)

    def read_layer(self) -> nn.Module:
        return self.readout

    def _readout(self, h: torch.Tensor, ctx: torch.Tensor, emb: torch.Tensor, read) -> torch.Tensor:
        """``read``: this pass's readout (PassProducts.read)."""
        return self.dropout(self.tanh(read(torch.cat([h, ctx, emb], dim=-1))))

    def _core(self, gx_emb: torch.Tensor, state: DecoderState):
        ctx, w = self.attention(top(state.hidden), state.attn)  # [B, K], [B, S]
        hidden = self.rnn.step(state.weights.rnn, gx_emb, state.hidden, ctx)
        return ctx, w, DecoderState(hidden, self.attention.advance(state.attn, w), state.weights)

    def step(self, y_prev, state):
        emb = self.emb_dropout(self.embed(y_prev))  # [B, E]
        ctx, w, state = self._core(self.step_gates(y_prev, emb, state.weights), state)
        products = state.weights
        return products.out(self._readout(top(state.hidden), ctx, emb, products.read)), state, w

    def _teacher_forced(self, tgt_in, enc):
        emb = self.emb_dropout(self.embed(tgt_in))  # [B, T, E]
        # Embedding gates once for all steps, split into per-step views with one unbind: indexing
        # gx[:, t] instead would make backward zero-fill and add a full [B, T, G*H] gradient per step.
        state = self.init_state(enc)
        hs, ctxs, ws = [], [], []
        for gx_t in self.rnn.first_gates(state.weights.rnn, emb).unbind(1):  # [B, G*H] each
            ctx, w, state = self._core(gx_t, state)
            ctxs.append(ctx)
            ws.append(w)
            hs.append(top(state.hidden))
        # Readout and output projection once, over all steps (stacked once, for the same reason).
        hs, ctxs = torch.stack(hs, 1), torch.stack(ctxs, 1)  # [B, T, H], [B, T, K]
        return self.logits(self._readout(hs, ctxs, emb, state.weights.read)), torch.stack(ws, 1)


class LuongDecoder(Decoder):
    """RNN first, then attend with h_t: h̃_t = tanh(W_c [c_t; h_t]); input feeding optional."""

    def __init__(
        self,
        vocab_size: int,
        emb_size: int,
        hidden_size: int,
        layers: int,
        cell: str,
        dropout: float,
        attention: Attention,
        key_size: int,
        tie_embeddings: bool,
        input_feeding: bool,
        rnn_impl: str = "loop",
        **options,  # Decoder's emb_dropout, layer_norm, tanh
    ):
        out_size = emb_size if tie_embeddings else hidden_size
        super().__init__(
            vocab_size,
            emb_size,
            hidden_size,
            layers,
            cell,
            dropout,
            attention,
            key_size,
            extra_input=out_size if input_feeding else 0,
            out_size=out_size,
            tie_embeddings=tie_embeddings,
            rnn_impl=rnn_impl,
            **options,
        )
        self.input_feeding = input_feeding
        self.combine = nn.Linear(key_size + hidden_size, out_size, bias=False)

    def read_layer(self) -> nn.Module:
        return self.combine

    def _attend(self, h: torch.Tensor, attn: AttentionState, combine):
        """``combine``: this pass's combine layer (PassProducts.read, or Decoder.linear's)."""
        ctx, w = self.attention(h, attn)  # [B, (T,) K]
        return self.dropout(self.tanh(combine(torch.cat([ctx, h], dim=-1)))), w

    def init_state(self, enc, vocab=None):
        state = super().init_state(enc, vocab)
        if self.input_feeding:
            state.feed = enc.keys.new_zeros(enc.keys.size(0), self.out_size)
        return state

    def _core(self, gx_emb: torch.Tensor, state: DecoderState):
        hidden = self.rnn.step(state.weights.rnn, gx_emb, state.hidden, state.feed)
        att, w = self._attend(top(hidden), state.attn, state.weights.read)
        attn = self.attention.advance(state.attn, w)
        return att, w, DecoderState(hidden, attn, state.weights, att if self.input_feeding else None)

    def step(self, y_prev, state):
        emb = self.emb_dropout(self.embed(y_prev))  # [B, E]
        att, w, state = self._core(self.step_gates(y_prev, emb, state.weights), state)
        return state.weights.out(att), state, w

    def _teacher_forced(self, tgt_in, enc):
        emb = self.emb_dropout(self.embed(tgt_in))  # [B, T, E]
        if not self.input_feeding and self.attention.parallel:
            # Nothing depends on the previous output: one RNN call over all steps, then
            # attention for all steps as batched matrix products.
            h, _ = self.rnn.sequence(emb, enc.state)  # [B, T, H]
            attn = self.attention.prepare(enc.keys, enc.mask, self.linear)
            att, ws = self._attend(h, attn, self.linear(self.combine))
            return self.logits(att), ws
        state = self.init_state(enc)
        atts, ws = [], []
        # The embedding gates hoisted over all steps, one view per step.
        for gx_t in self.rnn.first_gates(state.weights.rnn, emb).unbind(1):
            att, w, state = self._core(gx_t, state)
            atts.append(att)
            ws.append(w)
        return self.logits(torch.stack(atts, 1)), torch.stack(ws, 1)


DECODERS = {"bahdanau": BahdanauDecoder, "luong": LuongDecoder}
__all__ = ["DECODERS", "BahdanauDecoder", "Decoder", "DecoderState", "LuongDecoder"]
