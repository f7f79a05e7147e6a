"""Plots, tables and JSON for replay and eval runs: people would rather look than read.

Plots use matplotlib's Agg backend (no display needed): per episode, the tracking
error of every joint over time and, with counterfactual replay, the policy's deviation
with intervention spans shaded; per eval run, success bars with 95 % CIs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.table import Table

from robot_rl.replay.counterfactual import CounterfactualResult, spans
from robot_rl.replay.open_loop import TrackingResult

if TYPE_CHECKING:
    from robot_rl.app.evaluation import PolicyEval


def _pyplot():
    import matplotlib

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
    plt = _pyplot()
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
    return _save(fig, path)


def plot_eval(path: str | Path, evals: Sequence[PolicyEval]) -> Path:
    """Success bars with 95 % Wilson CIs, one per checkpoint."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(evals), 3.6))
    rates = [e.result.success_rate for e in evals]
    lower = [r - e.result.ci95[0] for r, e in zip(rates, evals, strict=True)]
    upper = [e.result.ci95[1] - r for r, e in zip(rates, evals, strict=True)]
    ax.bar(range(len(evals)), rates, yerr=[lower, upper], capsize=6, color="tab:blue", alpha=0.8)
    ax.set_xticks(range(len(evals)), [e.name for e in evals], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% CI)")
    ax.set_title(f"closed-loop eval, {len(evals[0].result.episodes) if evals else 0} episodes each")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def eval_table(evals: Sequence[PolicyEval]) -> Table:
    table = Table(title="closed-loop evaluation (same scenes for every checkpoint)")
    for column in ("checkpoint", "success", "95% CI", "completion s", "intervention-free", "stall s/ep", "episodes"):
        table.add_column(column, justify="left" if column == "checkpoint" else "right")
    for e in evals:
        r = e.result
        table.add_row(
            e.name,
            f"{r.success_rate:.0%}",
            f"{r.ci95[0]:.0%}-{r.ci95[1]:.0%}",
            "-" if math.isnan(r.completion_s) else f"{r.completion_s:.2f}",
            f"{e.intervention_free_rate:.0%}",
            f"{r.stall_s_per_episode:.2f}",
            str(len(r.episodes)),
        )
    return table


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


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path
