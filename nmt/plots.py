"""Attention heatmaps (matplotlib, no display needed): one sentence, or a grid of several."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def _draw(ax, att: torch.Tensor, src: list[str], tgt: list[str], title: str | None) -> None:
    ax.imshow(att.float().numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(src)), src, rotation=90, fontsize=8)
    ax.set_yticks(range(len(tgt)), tgt, fontsize=8)
    ax.set_xlabel("source pieces")
    ax.set_ylabel("target pieces")
    if title:
        ax.set_title(title, fontsize=9)


def heatmap(att: torch.Tensor, src: list[str], tgt: list[str], path: str | Path, title: str | None = None) -> Path:
    """att [len(tgt), len(src)] → a PNG at ``path``."""
    fig, ax = plt.subplots(figsize=(1.5 + 0.35 * len(src), 1.2 + 0.3 * len(tgt)))
    _draw(ax, att, src, tgt, title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def grid(
    panels: list[tuple[str, torch.Tensor, list[str], list[str]]],
    path: str | Path,
    cols: int = 4,
    bars: tuple[list[str], list[float], str] | None = None,
) -> Path:
    """Several (title, attention, src, tgt) heatmaps side by side, e.g. one sentence across models;
    ``bars`` = (labels, values, y label) adds a bar chart across the top."""
    rows = (len(panels) + cols - 1) // cols + (1 if bars else 0)
    fig = plt.figure(figsize=(4.2 * cols, 3.8 * rows))
    spec = fig.add_gridspec(rows, cols)
    if bars:
        ax = fig.add_subplot(spec[0, :])
        ax.bar(bars[0], bars[1], color="#3c6bc4")
        ax.set_ylabel(bars[2])
        for x, v in enumerate(bars[1]):
            ax.annotate(f"{v:.1f}", (x, v), ha="center", va="bottom", fontsize=8)
    first = 1 if bars else 0
    for k, (title, att, src, tgt) in enumerate(panels):
        _draw(fig.add_subplot(spec[first + k // cols, k % cols]), att, src, tgt, title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)
