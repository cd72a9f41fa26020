"""The learning curve of a local-mode run, drawn with matplotlib when it is installed (the
`local` extra): without it the run still finishes, and the PNG is skipped with one line."""

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def learning_curve(rows: list[dict], path: Path, target: float) -> bool:
    """Evaluation return against wall seconds and env steps, with the target; False (and one
    log line) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        log.info("matplotlib is not installed: %s not drawn (pip install matplotlib)", path.name)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluated = [r for r in rows if r["eval_rounds"] > 0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x, label in ((axes[0], "seconds", "wall seconds"), (axes[1], "env_steps", "env steps")):
        ax.plot(
            [r[x] for r in evaluated],
            [r["eval_mean_return"] for r in evaluated],
            label="evaluation mean",
        )
        ax.axhline(target, color="gray", linestyle="--", label=f"target {target:g}")
        ax.set_xlabel(label)
        ax.set_ylabel("return")
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
