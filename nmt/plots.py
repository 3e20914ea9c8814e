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
    panels: list[tuple[str, torch.Tensor, list[str], list[str]] | None],
    path: str | Path,
    cols: int = 4,
) -> Path:
    """Several (title, attention, src, tgt) heatmaps, ``cols`` to a row, e.g. one sentence across
    models; a None panel leaves its cell empty (a variant missing from a rows × columns layout)."""
    rows = max(1, (len(panels) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.8 * rows), squeeze=False)
    for k, ax in enumerate(axes.flat):
        panel = panels[k] if k < len(panels) else None
        if panel is None:
            ax.axis("off")
            continue
        title, att, src, tgt = panel
        _draw(ax, att, src, tgt, title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def curves(series: list[tuple[str, list[float], list[float]]], path: str | Path, xlabel: str, ylabel: str) -> Path:
    """One line per (label, xs, ys); lines sharing a label (the seeds of one variant) share a colour
    and one legend entry."""
    labels = list(dict.fromkeys(label for label, _, _ in series))
    colours = plt.get_cmap("tab20" if len(labels) > 10 else "tab10")
    fig, ax = plt.subplots(figsize=(10, 6))
    named = set()
    for label, xs, ys in series:
        k = labels.index(label)
        ax.plot(
            xs,
            ys,
            marker=".",
            color=colours(k % colours.N),
            linestyle=("-", "--", ":")[(k // colours.N) % 3],
            label=None if label in named else label,
        )
        named.add(label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
