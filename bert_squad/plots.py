"""Figures, drawn with matplotlib (the `plot` extra, which the test extra and the images install; without it a
command says so in one line and draws nothing): a sweep's F1 by combination and a run's training curves. Each is
written atomically, so a reader never sees half a PNG (two jobs may summarize one sweep at once)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_squad.files import scratch

if TYPE_CHECKING:
    from bert_squad.history import History

MISSING = "matplotlib is not installed, so no {} (pip install matplotlib)"


def _pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend; ImportError where matplotlib is not installed."""
    import matplotlib  # heavy and optional: only for a figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    """The figure as `path`, whole or not at all (a figure that cannot be written leaves no scratch file)."""
    tmp = scratch(path.parent, path.name)
    try:
        fig.savefig(tmp, dpi=120, format="png")
        tmp.replace(path)
    finally:
        _pyplot().close(fig)
        tmp.unlink(missing_ok=True)


def f1_by_combination(rows: list[dict[str, Any]], path: Path) -> None:
    """A sweep's F1 per combination, as `f1_figure` draws it."""
    _save(f1_figure(rows), path)


def f1_figure(rows: list[dict[str, Any]]) -> Any:
    """A sweep's F1 per combination: each seed a dot, the mean with its standard deviation (none for one seed).
    The title in two short lines, so that a figure of one combination (a seeds-only sweep) shows it whole."""
    fig, ax = _pyplot().subplots(figsize=(max(4, 1.6 * len(rows)), 3.5))
    for i, r in enumerate(rows):
        if r["f1_values"]:
            ax.scatter([i] * len(r["f1_values"]), r["f1_values"], color="tab:blue", alpha=0.5, s=16)
            ax.errorbar(i, r["f1_mean"], yerr=r["f1_std"], fmt="o", color="black", capsize=4)
    ax.set_xticks(range(len(rows)), [r["combination"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("F1")
    ax.set_title("F1 by combination\nmean ± standard deviation, seeds as dots", fontsize=10)
    fig.tight_layout()
    return fig


def training_curves(history: History, path: Path) -> None:
    """The training loss at each log line and the dev F1 at each evaluation, against the step; the parts of a
    resumed run shaded in turn and labelled with their ranks."""
    fig, loss_ax = _pyplot().subplots(figsize=(7, 3.8))
    loss_ax.plot([r["step"] for r in history.logs], [r["loss"] for r in history.logs], color="tab:blue")
    loss_ax.set_xlabel("optimizer step")
    loss_ax.set_ylabel("training loss", color="tab:blue")
    scored = [e for e in history.evals if "f1" in e]
    if scored:
        f1_ax = loss_ax.twinx()
        f1_ax.plot([e["step"] for e in scored], [e["f1"] for e in scored], "o-", color="tab:orange")
        f1_ax.set_ylabel("dev F1", color="tab:orange")
        f1_ax.set_ylim(-2, 102)  # F1's whole scale: one evaluation alone would otherwise span 95 to 105
    parts = len(history.parts)
    if parts > 1:
        for n, part in enumerate(history.parts, 1):
            loss_ax.axvspan(part.first_step, part.last_step, color="0.9" if n % 2 else "0.8", zorder=0)
            ranks = f"{part.world_size} rank{'s' if part.world_size > 1 else ''}"
            where = {"xycoords": ("data", "axes fraction"), "xytext": (3, -3), "textcoords": "offset points"}
            loss_ax.annotate(f"part {n}: {ranks}", (part.first_step, 1), va="top", fontsize=8, **where)
    loss_ax.set_title("training loss and dev F1" + (f", in {parts} parts" if parts > 1 else ""))
    fig.tight_layout()
    _save(fig, path)
