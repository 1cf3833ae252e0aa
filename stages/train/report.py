"""Training curves as PNG figures (their TSV tables: stages/core/plots.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from stages.core.io import atomic_path


def plot_curves(path: str | os.PathLike[str], history: Sequence[dict[str, float]], evals: Sequence[dict[str, float]],
                title: str, best_step: int | None = None) -> None:
    """A PNG with the training loss (and held-out loss) against steps, and the learning rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], label="train loss")
    if evals:
        ax.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], "o-", label="held-out loss")
    if best_step is not None:
        ax.axvline(best_step, color="grey", ls=":", label=f"best (step {best_step})")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    ax2.plot([h["step"] for h in history], [h["lr"] for h in history], color="tab:green")
    ax2.set_ylabel("LR")
    ax2.set_xlabel("optimizer step")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    p = Path(path)
    with atomic_path(p) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
