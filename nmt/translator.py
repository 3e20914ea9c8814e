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
from nmt.search import Hypothesis, Searchable, SearchOptions, beam_search
from nmt.shortlist import Shortlist

log = logging.getLogger(__name__)


@dataclass
class Translation:
    text: str  # the best hypothesis, detokenised
    hypothesis: Hypothesis
    src_pieces: list[str]
    tgt_pieces: list[str]
    n_best: list[tuple[str, float]]  # (text, score) for each of the n-best, best first


class Translator:
    def __init__(
        self,
        model: Searchable,  # a Seq2Seq or an Ensemble
        tokenizer: Tokenizer,
        device: torch.device,
        search: SearchOptions | None = None,
        max_tokens: int = 4000,
        max_input_len: int = 256,
        shortlist: Shortlist | None = None,
    ):
        """``shortlist``: search each batch over its lexical shortlist of target pieces (nmt.shortlist)."""
        self.model, self.tok, self.device = model, tokenizer, device
        self.search = search or SearchOptions()
        self.max_tokens, self.max_input_len = max_tokens, max_input_len
        self.shortlist = shortlist.to(device) if shortlist is not None else None

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
        # Beams multiply the batch: keep sentences x beams x length near the budget.
        budget = max(self.max_tokens // self.search.beam_size, 1)
        for group, batch in eval_batches([ids[i] for i in keep], None, budget):
            b = batch.to(self.device)
            vocab = None if self.shortlist is None else self.shortlist.select(b.src)
            nbests = beam_search(self.model, b.src, b.src_len, self.search, return_attention, vocab)
            for j, nbest in zip(group, nbests):
                i = keep[j]
                texts_out = self.tok.decode_tgt([h.tokens for h in nbest])
                best = nbest[0]
                results[i] = Translation(
                    texts_out[0],
                    best,
                    self.tok.src.id_to_piece(ids[i]) + ["</s>"],
                    self.tok.tgt_pieces(best.tokens) + ["</s>"],
                    [(t, h.score) for t, h in zip(texts_out, nbest)],
                )
        self.model.train(was_training)
        empty = Translation("", Hypothesis([], 0.0, 0.0, None), [], [], [("", 0.0)])
        return [r if r is not None else empty for r in results]
