"""What a run does once training has ended normally (a limit or early stopping; never after an
interrupt or a fault): average its newest checkpoints, store a vocabulary shortlist and choose each
checkpoint's decoding defaults.

- ``averaged.pt`` (``trainer.average_last=N``): the parameter mean of the newest N ``step_N.pt``
  checkpoints (Junczys-Dowmunt et al. 2016; Vaswani et al. 2017; fewer when the run saved fewer, none when it
  saved only one, which would be a copy of it), through the one implementation
  ``nmt.checkpoint.average``, written weights-only like ``best.pt`` and validated once, so the run's
  last lines can put its valid BLEU beside ``best.pt``'s.
- ``decoding`` (``trainer.tune_decoding``): the beam size and GNMT length penalty (Wu et al. 2016)
  that give the highest BLEU on the validation sentences (``data.valid_max_sentences``), searched
  over a small grid for ``best.pt`` and ``averaged.pt`` each; then, at the chosen beam and penalty,
  the faster ``stop=early`` rule (``nmt.search``) is kept when its BLEU is no lower than ``exact``'s.
  Stored in the checkpoint as ``{beam_size, length_penalty, stop, bleu, sentences}``;
  ``nmt.translate``/``evaluate``/``serve`` decode with it where the user leaves a key unset
  (``nmt.runtime.search_options``). Tuned on valid only,
  so test.tsv stays unseen. Only for a checkpoint whose validation BLEU reaches ``trainer.tune_min_bleu``
  (default 1.0): below it the grid measures noise, and its ties would store greedy search.
- ``shortlist`` (``trainer.shortlist``): a lexical vocabulary shortlist built from the training pairs
  (``nmt.shortlist``), stored in ``best.pt`` and ``averaged.pt``; the decoding commands search each batch
  over it when told ``shortlist=true``. The decoding defaults above are chosen over the whole vocabulary.

What was written is recorded in the run's ``finished.json`` (``RunDir.write_finished``) with the step and the
settings. A resume that trains no further step (the limit was already reached) with the same settings keeps it
instead of spending the minutes again; another step, other settings or a missing file and the end is done again.

Plain objects: the grid, the switches and the shortlist builder come from ``nmt.training.build_finisher``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt import checkpoint
from nmt.heartbeat import heartbeat
from nmt.models.seq2seq import Seq2Seq
from nmt.rundir import RunDir
from nmt.runtime import DEFAULT_SEARCH
from nmt.search import SearchOptions
from nmt.shortlist import Shortlist
from nmt.trainer import Progress, Validator

log = logging.getLogger(__name__)


@dataclass
class DecodingGrid:
    """The beam sizes × length penalties tried; beam 1 (greedy) is tried once, as it ignores the penalty."""

    beam_sizes: tuple[int, ...] = (1, 3, 5, 8)
    length_penalties: tuple[float, ...] = (0.6, 0.8, 1.0, 1.2)

    def points(self) -> list[SearchOptions]:
        out = []
        for k in sorted(set(self.beam_sizes)):
            alphas = [DEFAULT_SEARCH.alpha] if k == 1 else sorted(set(self.length_penalties))
            out += [SearchOptions(beam_size=k, alpha=a) for a in alphas]
        return out


def grid_line(beam_size: int, row: list[tuple[float, float]]) -> str:
    """One beam size's scores as one log line: 'beam 1: BLEU 40.10' (greedy ignores the length penalty),
    'beam 5, lp 1: BLEU 41.30', or 'beam 5, lp 0.6 / 1: BLEU 41.20 / 41.30' (penalties and scores in order)."""
    if beam_size == 1:
        return f"beam 1: BLEU {row[0][1]:.2f}"
    alphas = " / ".join(f"{a:g}" for a, _ in row)
    return f"beam {beam_size}, lp {alphas}: BLEU " + " / ".join(f"{b:.2f}" for _, b in row)


def choose_decoding(score: Callable[[SearchOptions], float], grid: DecodingGrid) -> tuple[SearchOptions, float]:
    """The grid point with the highest ``score`` (BLEU); ties go to the smaller beam (faster), then to the
    length penalty nearest 1.0. Logs every point, a line per beam size."""
    results = [(o, score(o)) for o in grid.points()]
    for k in sorted({o.beam_size for o, _ in results}):
        row = [(o.alpha, b) for o, b in results if o.beam_size == k]
        log.info("  %s", grid_line(k, row))
    return max(results, key=lambda r: (r[1], -r[0].beam_size, -abs(r[0].alpha - DEFAULT_SEARCH.alpha)))


def choose_stop(
    score: Callable[[SearchOptions], float], best: SearchOptions, bleu: float
) -> tuple[SearchOptions, float]:
    """``best`` with ``stop=early`` when that scores no lower than ``bleu`` (``best``'s score with the exact
    rule), else ``best`` unchanged. Greedy search (beam 1) has no stopping rule to choose."""
    if best.beam_size == 1:
        return best, bleu
    early = dataclasses.replace(best, stop="early")
    early_bleu = score(early)
    log.info("  beam %d, lp %g: BLEU %.2f with stop=early (exact %.2f)", best.beam_size, best.alpha, early_bleu, bleu)
    return (early, early_bleu) if early_bleu >= bleu else (best, bleu)


@dataclass
class Finished:
    """What the end of a run wrote, for its last log lines. ``decoding``: checkpoint path → stored choice."""

    averaged: Path | None = None
    averaged_from: list[str] = field(default_factory=list)
    averaged_bleu: float | None = None  # with the validation search, comparable to Progress.best_bleu
    decoding: dict[Path, dict] = field(default_factory=dict)

    def decodes(self, path: Path) -> str:
        """'; decodes with beam 5, length penalty 1.0 (valid BLEU ...)' when ``path``'s defaults were chosen."""
        return f"; decodes with {describe(self.decoding[path])}" if path in self.decoding else ""

    def record(self) -> dict[str, Any]:
        """As JSON (``finished.json``): checkpoints by file name, so a run folder that was moved still reads."""
        return {
            "averaged": None if self.averaged is None else self.averaged.name,
            "averaged_from": [Path(f).name for f in self.averaged_from],
            "averaged_bleu": self.averaged_bleu,
            "decoding": {p.name: choice for p, choice in self.decoding.items()},
        }

    @classmethod
    def from_record(cls, r: dict[str, Any], folder: Path) -> Finished:
        """The record's checkpoints as paths in ``folder`` (the run's ``checkpoints/``)."""
        return cls(
            averaged=None if r["averaged"] is None else folder / r["averaged"],
            averaged_from=[str(folder / f) for f in r["averaged_from"]],
            averaged_bleu=r["averaged_bleu"],
            decoding={folder / name: choice for name, choice in r["decoding"].items()},
        )

    def files(self) -> list[Path]:
        """The checkpoints it wrote or rewrote."""
        return list(dict.fromkeys(p for p in (self.averaged, *self.decoding) if p is not None))

    def recommended(self, best: Path, best_bleu: float) -> Path:
        """The checkpoint to translate with: averaged.pt when it scores higher on valid than best.pt (each with
        its chosen decoding when both were tuned, else with the validation search)."""
        if self.averaged is None:
            return best
        tuned_avg, tuned_best = self.decoding.get(self.averaged), self.decoding.get(best)
        if tuned_avg and tuned_best:
            return self.averaged if tuned_avg["bleu"] > tuned_best["bleu"] else best
        return self.averaged if (self.averaged_bleu or 0.0) > best_bleu else best


class Finisher:
    """Runs on rank 0 after ``Trainer.fit`` ended by a limit or early stopping (see the module docstring)."""

    def __init__(
        self,
        rundir: RunDir,
        average_last: int = 0,
        grid: DecodingGrid | None = None,
        shortlist: Callable[[], Shortlist] | None = None,
        min_bleu: float = 0.0,
        settings: dict[str, Any] | None = None,
    ):
        self.rundir, self.average_last, self.grid, self.shortlist = rundir, average_last, grid, shortlist
        self.min_bleu = min_bleu  # a checkpoint validated below this gets no decoding defaults
        # What the end of the run was asked to do (the config's keys, from build_finisher): finished.json holds
        # them, and a resume asking for anything else does the end again.
        self.settings = settings if settings is not None else self._own_settings()

    def _own_settings(self) -> dict[str, Any]:
        grid = None if self.grid is None else [list(self.grid.beam_sizes), list(self.grid.length_penalties)]
        return {
            "average_last": self.average_last,
            "grid": grid,
            "shortlist": self.shortlist is not None,
            "min_bleu": self.min_bleu,
        }

    def __call__(self, model: Seq2Seq, validator: Validator, progress: Progress) -> Finished:
        done = Finished()
        asked = self.average_last or self.grid or self.shortlist
        if not asked or progress.best_bleu < 0:  # nothing asked, or never validated
            return done
        if (kept := self.done_before(progress)) is not None:
            log.info(
                "the end of this run was done when it stopped at step %d before, with the same settings, and is kept "
                "(%s; recorded in %s)",
                progress.step,
                self._describe(kept),
                self.rundir.finished,
            )
            return kept
        done = self._finish(model, validator, progress)
        record = {"step": progress.step, "best_bleu": progress.best_bleu, "settings": self.settings}
        self.rundir.write_finished({**record, **done.record()})
        return done

    def _describe(self, done: Finished) -> str:
        parts = [done.averaged.name] if done.averaged is not None else []
        if done.decoding:
            parts.append("decoding defaults of " + " and ".join(p.name for p in done.decoding))
        if self.shortlist is not None:
            parts.append("the vocabulary shortlist")
        return ", ".join(parts) or "nothing to write"

    def done_before(self, progress: Progress) -> Finished | None:
        """What ``finished.json`` says the end of the run wrote, when that was at this step and best valid BLEU,
        with these settings, and its files are all still there; else None."""
        r = self.rundir.read_finished()
        at = {"step": progress.step, "best_bleu": progress.best_bleu, "settings": self.settings}
        if r is None or any(r.get(k) != v for k, v in at.items()):
            return None
        try:
            kept = Finished.from_record(r, self.rundir.checkpoints)
        except (KeyError, TypeError, AttributeError):
            return None
        return kept if all(p.is_file() for p in (self.rundir.best, *kept.files())) else None

    def _finish(self, model: Seq2Seq, validator: Validator, progress: Progress) -> Finished:
        done = Finished()
        extra = {}  # what every finished checkpoint stores besides its own decoding choice
        if self.shortlist is not None:
            start = time.monotonic()
            with heartbeat("building the vocabulary shortlist from the training pairs"):
                short = self.shortlist()
            extra["shortlist"] = short.state_dict()
            log.info(
                "vocabulary shortlist: %s, stored in the checkpoints (%.0f s); translate with shortlist=true to use it",
                short.describe(),
                time.monotonic() - start,
            )
        scratch = copy.deepcopy(model)  # scored with other weights; the trained model stays as it is
        if self.average_last:
            self._average(scratch, validator, done, extra)
        validated = {self.rundir.best: progress.best_bleu, done.averaged: done.averaged_bleu}
        for path in (self.rundir.best, done.averaged):
            if path is None or not path.is_file():
                continue
            bleu = validated[path] or 0.0
            if self.grid is not None and bleu >= self.min_bleu:
                done.decoding[path] = self._tune(path, scratch, validator, extra)
                continue
            if self.grid is not None:
                log.info(
                    "%s: valid BLEU %.2f is below trainer.tune_min_bleu=%g, so no decoding defaults were chosen "
                    "(the grid would measure noise); the decoding commands use beam %d, length penalty %g",
                    path.name,
                    bleu,
                    self.min_bleu,
                    DEFAULT_SEARCH.beam_size,
                    DEFAULT_SEARCH.alpha,
                )
            if extra and path != done.averaged:  # averaged.pt was written with them
                self.rundir.write_checkpoint(path.name, {**checkpoint.load(path), **extra})
        return done

    def _average(self, scratch: Seq2Seq, validator: Validator, done: Finished, extra: dict) -> None:
        found = [str(p) for _, p in self.rundir.step_checkpoints()[-self.average_last :]]
        if len(found) < 2:  # the mean of one checkpoint is that checkpoint: nothing to write, validate or tune
            log.warning(
                "trainer.average_last=%d: the run saved %s step_N.pt, so there is nothing to average; no %s",
                self.average_last,
                "only one" if found else "no",
                self.rundir.averaged.name,
            )
            return
        if len(found) < self.average_last:
            log.warning("trainer.average_last=%d: the run has only %d step_N.pt", self.average_last, len(found))
        averaged = checkpoint.average(found)
        done.averaged = self.rundir.write_checkpoint(self.rundir.averaged.name, {**averaged, **extra})
        done.averaged_from = found
        scratch.load_state_dict(averaged["model"])
        with heartbeat(f"validating {done.averaged.name}"):
            done.averaged_bleu = validator.bleu(scratch)

    def _tune(self, path: Path, scratch: Seq2Seq, validator: Validator, extra: dict) -> dict:
        """Choose ``path``'s decoding defaults on valid and store them in it with ``extra`` (rewritten atomically)."""
        ckpt = {**checkpoint.load(path), **extra}
        scratch.load_state_dict(ckpt["model"])
        grid = self.grid.points()
        log.info(
            "choosing decoding defaults for %s on %d valid sentences (%d settings)",
            path.name,
            validator.sentences,
            len(grid),
        )
        start = time.monotonic()
        with heartbeat(f"choosing decoding defaults for {path.name}"):
            best, bleu = choose_decoding(lambda o: validator.bleu(scratch, o), self.grid)
            best, bleu = choose_stop(lambda o: validator.bleu(scratch, o), best, bleu)
        choice = {
            "beam_size": best.beam_size,
            "length_penalty": best.alpha,
            "stop": best.stop,
            "bleu": round(bleu, 2),
            "sentences": validator.sentences,
        }
        ckpt["decoding"] = choice
        self.rundir.write_checkpoint(path.name, ckpt)
        log.info("%s: decoding defaults %s (%.0f s)", path.name, describe(choice), time.monotonic() - start)
        return choice


def describe(choice: dict) -> str:
    """'beam 5, length penalty 1.0 (valid BLEU 23.10 on 500 sentences)', with ', stop=early' when chosen."""
    stop = ", stop=early" if choice.get("stop") == "early" else ""
    return (
        f"beam {choice['beam_size']}, length penalty {choice['length_penalty']:g}{stop} "
        f"(valid BLEU {choice['bleu']:.2f} on {choice['sentences']} sentences)"
    )
