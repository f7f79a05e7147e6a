"""``robot-rl eval``: the configured policies on the same scenes (``robot_rl.app.evaluation``), and
what the run leaves: ``eval.json``, success bars with 95 % intervals (``eval.png``) and the ranking
table the command prints."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from robot_rl.app.evaluation import PolicyEval, compare_policies, eval_scenes, load_policies, paired_comparison
from robot_rl.app.sim import make_sim
from robot_rl.replay.report import pyplot, save_figure, write_json

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


def run_eval(cfg: RobotRLConfig, progress: bool = True) -> tuple[list[PolicyEval], Path, Path]:
    """``robot-rl eval``: the configured policy (and ``eval.compare_path``) on the same scenes
    (``eval_scenes``); writes ``eval.json`` and a bar plot under ``eval.out_dir``. Returns (evals
    best first, the JSON's path, the plot's path)."""
    policies = load_policies(cfg)
    robot = make_sim(cfg)
    try:
        evals = compare_policies(robot, policies, cfg.edge, eval_scenes(cfg, robot),
                                 max_steps=cfg.eval.max_episode_steps, fallback_seed=cfg.seeds.eval, progress=progress,
                                 wording=cfg.eval.wording)
    finally:
        robot.disconnect()
    out = Path(cfg.eval.out_dir)
    payload = {
        "scenes": f"dataset {cfg.eval.dataset}" if cfg.eval.dataset else f"seeds from {cfg.seeds.eval}",
        "edge": {"mode": cfg.edge.mode, "simulated_latency_ms": cfg.edge.simulated_latency_ms},
        "wording": cfg.eval.wording,
        "ranking": [e.name for e in evals],
        "checkpoints": [e.as_dict() for e in evals],
        # best against second best on the same scenes: is the gap more than luck?
        "paired": paired_comparison(evals[0], evals[1]).as_dict() if len(evals) == 2 else None,
    }
    return evals, write_json(out / "eval.json", payload), plot_eval(out / "eval.png", evals)


def plot_eval(path: str | Path, evals: Sequence[PolicyEval]) -> Path:
    """Success bars with 95 % Wilson CIs, one per checkpoint."""
    plt = pyplot()
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
    return save_figure(fig, path)


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
