"""Plots, tables and JSON for replay runs: people would rather look than read.

Plots use matplotlib's Agg backend (no display needed): per episode, the tracking
error of every joint over time and, with counterfactual replay, the policy's deviation
with intervention spans shaded. The figure, table and JSON helpers serve the eval report
(``robot_rl.app.eval_report``) and the benchmarks too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.table import Table

from robot_rl.replay.counterfactual import CounterfactualResult, spans

if TYPE_CHECKING:  # open_loop runs the sim: the tables and figures here import no MuJoCo
    from robot_rl.replay.open_loop import TrackingResult


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib  # the learner extra; the backend is chosen before pyplot is imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_episode(
    path: str | Path,
    title: str,
    fps: int,
    tracking: TrackingResult | None,
    counterfactual: CounterfactualResult | None,
    interventions: np.ndarray,
) -> Path:
    """One PNG: tracking error per joint (top) and counterfactual error (bottom), interventions shaded."""
    plt = pyplot()
    panels = [p for p in (tracking, counterfactual) if p is not None]
    rows = max(1, len(panels))
    fig, axes = plt.subplots(rows, 1, figsize=(10, 3.2 * rows), sharex=True, squeeze=False)
    axes = list(axes[:, 0])
    t = np.arange(len(interventions)) / fps
    row = 0
    if tracking is not None:
        ax = axes[row]
        for j, name in enumerate(tracking.joint_names):
            ax.plot(t, np.abs(tracking.error[:, j]), label=name, lw=1.2)
        ax.set_ylabel("|sim - logged| (deg, gripper %)")
        ax.set_title("open-loop tracking error per joint")
        ax.legend(fontsize=7, ncol=3)
        row += 1
    if counterfactual is not None:
        ax = axes[row]
        ax.plot(t, counterfactual.first_error, label="first action", lw=1.2)
        ax.plot(t, counterfactual.chunk_error, label="whole chunk", lw=1.2)
        worst = counterfactual.top_deviations(1)[0]
        ax.annotate(f"largest: step {worst}", (t[worst], counterfactual.chunk_error[worst]), fontsize=7)
        ax.set_ylabel("|policy - logged| (mean over joints)")
        ax.set_title("counterfactual: policy vs logged actions")
        ax.legend(fontsize=7)
    for ax in axes:
        for start, stop in spans(interventions):
            ax.axvspan(start / fps, stop / fps, color="tab:red", alpha=0.15, lw=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time (s); red = human intervention")
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def tracking_table(results: dict[int, TrackingResult]) -> Table:
    names = next(iter(results.values())).joint_names if results else ()
    table = Table(title="open-loop tracking error, RMSE per joint (sim units)")
    table.add_column("episode")
    table.add_column("scene")
    for name in names:
        table.add_column(name, justify="right")
    for index, result in results.items():
        rmse = result.rmse()
        scene = "re-created" if result.scene_recreated else "first state"
        table.add_row(str(index), scene, *(f"{rmse[n]:.3g}" for n in names))
    return table


def print_table(table: Table) -> None:
    console = Console()
    if not console.is_terminal:  # piped into a log: do not squeeze joint names into 80 columns
        console = Console(width=160)
    console.print(table)


def write_json(path: str | Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_plain(payload), indent=2, sort_keys=True))
    return path


def _plain(value):
    """JSON-safe copy: numpy to Python, NaN/inf to null (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def save_figure(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
