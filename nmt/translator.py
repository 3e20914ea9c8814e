"""Text in, text out: tokenise, batch by length, search, restore input order, detokenise.

Used by validation during training and by ``nmt.translate``, so the BLEU the trainer
selects checkpoints on is computed exactly the way users will translate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from nmt.data.batching import eval_batches
from nmt.data.tokenizer import Tokenizer
from nmt.models.seq2seq import Seq2Seq
from nmt.search import Hypothesis, beam_search, max_lengths

log = logging.getLogger(__name__)


@dataclass
class Translation:
    text: str
    hypothesis: Hypothesis
    src_pieces: list[str]
    tgt_pieces: list[str]


class Translator:
    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        device: torch.device,
        beam_size: int = 5,
        length_penalty: float = 1.0,
        max_len_ratio: float = 2.0,
        max_tokens: int = 4000,
        max_input_len: int = 256,
    ):
        self.model, self.tok, self.device = model, tokenizer, device
        self.beam_size, self.alpha, self.max_len_ratio = beam_size, length_penalty, max_len_ratio
        self.max_tokens, self.max_input_len = max_tokens, max_input_len

    @torch.no_grad()
    def translate(self, texts: list[str], return_attention: bool = False) -> list[Translation]:
        """One translation per input, in input order; blank inputs give empty outputs."""
        was_training = self.model.training
        self.model.eval()
        ids = self.tok.encode_src([t.strip() for t in texts])
        too_long = sum(len(s) > self.max_input_len for s in ids)
        if too_long:
            log.warning("%d input line(s) longer than %d pieces were truncated", too_long, self.max_input_len)
        ids = [s[: self.max_input_len] for s in ids]
        keep = [i for i, s in enumerate(ids) if s]
        results: list[Translation | None] = [None] * len(texts)
        empty = Hypothesis([], 0.0, None)
        for group, batch in eval_batches([ids[i] for i in keep], None, self.max_tokens):
            b = batch.to(self.device)
            lim = max_lengths(b.src_len, self.max_len_ratio)
            hyps = beam_search(self.model, b.src, b.src_len, lim, self.beam_size, self.alpha, return_attention)
            texts_out = self.tok.decode_tgt([h.tokens for h in hyps])
            for j, h, out in zip(group, hyps, texts_out):
                i = keep[j]
                results[i] = Translation(
                    out, h, self.tok.src.id_to_piece(ids[i]) + ["</s>"], self.tok.tgt_pieces(h.tokens) + ["</s>"]
                )
        self.model.train(was_training)
        return [r if r is not None else Translation("", empty, [], []) for r in results]
