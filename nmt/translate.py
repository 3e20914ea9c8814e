"""``python -m nmt.translate checkpoint=PATH [input=FILE] [output=FILE] [beam_size=K]``.

Exactly one output line per input line, in input order (an empty line gives an empty
line). Without ``input`` it reads stdin line by line and answers each line as it
arrives, so it works at a prompt and inside a pipe.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from omegaconf import DictConfig

from nmt.cli import check_paths, command
from nmt.config import register_configs
from nmt.errors import line_list

if TYPE_CHECKING:
    from nmt.translator import Translation, Translator, Workers

# Startup: only the launcher is imported up front, so `--help` and a config mistake answer without
# loading torch; the model code (nmt.runtime) comes in when there is something to translate, and
# matplotlib only with attention_plot (docs/benchmarks.md, "translate startup").

log = logging.getLogger("nmt.translate")
register_configs()


def __getattr__(name: str) -> Any:
    """``nmt.translate.load_model`` / ``load_translator``, still importable from here, loaded on use."""
    if name in ("load_model", "load_translator"):
        from nmt import runtime

        return getattr(runtime, name)
    raise AttributeError(name)


# Characters that some tools treat as line ends; never let them into an output line.
_LINE_BREAKS = str.maketrans(dict.fromkeys("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029", " "))


def one_line(text: str) -> str:
    return text.translate(_LINE_BREAKS)


def read_lines(f: TextIO, odd: list[int] | None = None) -> Iterator[str]:
    """Lines without their newline. The numbers (1-based) of lines holding NUL bytes or bytes that
    are not UTF-8 (decoded as U+FFFD) are appended to ``odd``: binary input is translated, but reported."""
    for n, line in enumerate(f, 1):
        if odd is not None and ("\x00" in line or "\ufffd" in line):
            odd.append(n)
        yield line.rstrip("\n").rstrip("\r")


def report_odd_lines(odd: list[int], name: str) -> None:
    if odd:
        shown = line_list(odd)
        log.warning(
            "%s: %d line(s) hold NUL bytes or bytes that are not UTF-8 (is it a text file?): lines %s; "
            "translated with those bytes as they decode (U+FFFD for non-UTF-8)",
            name,
            len(odd),
            shown,
        )


@dataclass
class Sink:
    """Where each translated line goes: the text output, and optionally attention plots / matrices."""

    out: TextIO
    n_best: int = 1
    plot_dir: Path | None = None
    attention_out: TextIO | None = None
    line: int = 0  # lines written so far (0-based index of the next input line)
    truncated: list[int] = field(default_factory=list)  # input lines (1-based) cut to max_input_len pieces

    @property
    def wants_attention(self) -> bool:
        return self.plot_dir is not None or self.attention_out is not None

    def write(self, t: Translation) -> None:
        if self.n_best > 1:  # n-best: "text<TAB>score" lines, a blank line after each input
            self.out.write("".join(f"{one_line(text)}\t{score:.4f}\n" for text, score in t.n_best) + "\n")
        else:
            self.out.write(one_line(t.text) + "\n")
        att = t.hypothesis.attention
        if att is not None and self.plot_dir is not None:
            from nmt.plots import heatmap  # matplotlib: only when plots are asked for

            heatmap(att, t.src_pieces, t.tgt_pieces, self.plot_dir / f"{self.line:05d}.png", title=t.text[:80])
        if att is not None and self.attention_out is not None:
            record = {"line": self.line, "src": t.src_pieces, "tgt": t.tgt_pieces, "attention": att.tolist()}
            self.attention_out.write(json.dumps(record, ensure_ascii=False) + "\n")
        if t.truncated:
            self.truncated.append(self.line + 1)
        self.line += 1


def translate_stream(
    tr: Translator | Workers, lines: Iterator[str], sink: Sink, batch_size: int, interactive: bool
) -> int:
    """Translate in batches (or line by line when interactive); returns the number of lines."""
    buf: list[str] = []
    for line in lines:
        buf.append(line)
        if interactive or len(buf) >= batch_size:
            _flush(tr, buf, sink)
            buf = []
    _flush(tr, buf, sink)
    return sink.line


def _flush(tr: Translator | Workers, buf: list[str], sink: Sink) -> None:
    if buf:
        for t in tr.translate(buf, return_attention=sink.wants_attention):
            sink.write(t)
        sink.out.flush()


@command("translate")
def main(cfg: DictConfig) -> None:
    check_paths([cfg.checkpoint, *cfg.ensemble], [cfg.input], [cfg.output, cfg.attention_out])
    from nmt.runtime import load_translator
    from nmt.translator import report_truncated, workers

    tr = load_translator(cfg)
    tr.warn_truncated = False  # named line by line at the end (before the fork: the processes inherit it)
    with contextlib.ExitStack() as stack:
        tx = stack.enter_context(workers(tr, cfg.workers, interactive=cfg.input is None))
        # errors="replace": a stray non-UTF-8 byte costs one character, not the run; newline="\n": only
        # \n ends a line (a stray \r inside a line must not make two outputs of one input).
        src = (
            stack.enter_context(open(cfg.input, encoding="utf-8", errors="replace", newline="\n"))
            if cfg.input
            else io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n")
        )
        out = stack.enter_context(open(cfg.output, "w", encoding="utf-8")) if cfg.output else sys.stdout
        sink = Sink(out, cfg.n_best)
        if cfg.attention_plot:
            sink.plot_dir = Path(cfg.attention_plot)
            sink.plot_dir.mkdir(parents=True, exist_ok=True)
        if cfg.attention_out:
            sink.attention_out = stack.enter_context(open(cfg.attention_out, "w", encoding="utf-8"))
        odd: list[int] = []
        if cfg.input is None and sys.stdin.isatty():  # at a prompt: say that it waits, and how to stop it
            log.info("type a line and press Enter to translate it; Ctrl-D (Ctrl-Z Enter on Windows) ends")
        # with several processes a read batch gives each of them batch_size lines
        n = translate_stream(tx, read_lines(src, odd), sink, cfg.batch_size * tx.n, interactive=cfg.input is None)
        report_odd_lines(odd, cfg.input or "stdin")
        report_truncated(sink.truncated, cfg.input or "stdin", tr.max_input_len)
    log.info("translated %d line%s%s", n, "" if n == 1 else "s", f" into {cfg.output}" if cfg.output else "")


if __name__ == "__main__":
    main()
