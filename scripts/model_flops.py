"""FLOPs of a training step and of decoding, per token, counted by PyTorch on the real code paths.

``torch.utils.flop_counter.FlopCounterMode`` sees every matrix product that reaches the
dispatcher (``mm``, ``addmm``, ``bmm``, …: 2 FLOPs per multiply-add), whether nn.Linear, the step
loop's hand-written ``StepLinear`` products or their backward, in any dtype; oneDNN's products over
packed weights (the CPU fast path's search) are added to its table here. Element-wise work
(gates, tanh, softmax, the loss, Adam) is not counted: it is small beside the products and is not
what a GEMM peak measures. Padded positions are computed, so they are counted; the count is
divided by the batch's *real* target tokens, the tokens a tokens/s figure counts.

Cross-check, model R (embeddings 256, bi-GRU encoder 2×256, GRU decoder 512, additive attention
of width 512, Bahdanau order, readout 512, 8k vocabulary), forward multiply-adds:

* per source token: encoder 2 directions × (256·768 input + 256·768 hidden) = 786,432, attention
  keys W_k 512·512 = 262,144 → 1.05 M;
* per target token: decoder GRU input [e; c] (256+512)·1536 = 1,179,648, hidden 512·1536 =
  786,432, attention query W_q 512·512 = 262,144, scores and context 2·512·S (S = padded source
  length, ~12: ~12 k), readout (512+512+256)·512 = 655,360, vocabulary projection 512·8000 =
  4,096,000 → 6.99 M;

with about as many source as target tokens, 8.04 M multiply-adds = 16.1 MFLOP forward per token;
backward computes a gradient for both inputs of every product (the embeddings are trained), twice
the forward: ~48 MFLOP per target token for a training step, half of it the vocabulary projection.
The counter gives that plus the padding (measured numbers in docs/benchmarks.md), and on a tiny
model it matches such a hand count exactly (tests/test_efficiency.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch.utils.flop_counter import FlopCounterMode

from nmt.data.batching import Batch
from nmt.trainer import Trainer
from nmt.translator import Translator

T = TypeVar("T")


@dataclass
class FlopCount:
    flops: int  # counted FLOPs of the matrix products (2 per multiply-add)
    tokens: int  # training: real target tokens (EOS included); decoding: output tokens (EOS included)
    sentences: int = 0

    @property
    def per_token(self) -> float:
        return self.flops / max(self.tokens, 1)


def packed_linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """oneDNN's product over a packed weight (nmt.models.rnn.packed_linear, the CPU fast path's search):
    x [.., I] · W [O, I]ᵀ, which the counter does not know by itself."""
    rows = math.prod(x_shape[:-1])
    return 2 * rows * x_shape[-1] * w_shape[0]


# products the counter's own table lacks (torch.ops.mkldnn may be missing from a build: then nothing to add)
EXTRA = {torch.ops.mkldnn._linear_pointwise: packed_linear_flops} if hasattr(torch.ops, "mkldnn") else {}


def counted(fn: Callable[[], T]) -> tuple[T, int]:
    """``fn()``'s result and the FLOPs of the matrix products it ran (forward and any backward)."""
    with FlopCounterMode(display=False, custom_mapping=EXTRA) as counter:
        out = fn()
    return out, counter.get_total_flops()


def train_flops(trainer: Trainer, batches: Iterable[Batch]) -> FlopCount:
    """FLOPs per target token of ``Trainer.train_step``: one real update (forward, backward, optimiser)
    per batch (already on the trainer's device), summed over the batches."""
    total = tokens = sentences = 0
    for b in batches:
        _, flops = counted(lambda b=b: trainer.train_step([b]))
        total, tokens, sentences = total + flops, tokens + b.n_tgt_tokens, sentences + b.src.size(0)
    return FlopCount(total, tokens, sentences)


def decode_flops(translator: Translator, texts: list[str]) -> FlopCount:
    """FLOPs per output token of translating ``texts`` as ``nmt.translate`` does (the translator's
    search options); every hypothesis a beam keeps alive costs, only the best one's tokens count."""
    out, flops = counted(lambda: translator.translate(texts))
    tokens = sum(len(t.hypothesis.tokens) + 1 for t in out if t.src_pieces)  # blank inputs decode nothing
    return FlopCount(flops, tokens, len(texts))
