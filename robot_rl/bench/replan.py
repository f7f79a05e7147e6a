"""`robot-rl bench replan`: held-out success of given weights at several re-planning floors.

The edge asks for the next chunk when ``remaining <= max(d + margin, edge.min_request_threshold)``.
With fast inference (``d`` ~ 0) the adaptive part alone lets a 20-action chunk run ~18 ticks
open loop; a floor makes the policy re-plan sooner, at one policy call per (H - floor) ticks.
Whether that buys success depends on the weights, so this scores every weights directory on
the same held-out scenes (``seeds.heldout`` onwards, no operator, virtual time) at every floor:
the episodes are paired (same scene, same policy noise), and the table's last rows give each
floor's mean and its difference to the first floor over all weights.

    robot-rl bench replan --json /tmp/bench/replan.json "bench.weights=[checkpoints/bc_push,RUN/checkpoints/latest]"

Settings: ``bench.weights`` (default: the shipped start), ``bench.floors``, ``bench.episodes`` per
weights and floor (``robot_rl.bench.config.ReplanBenchConfig``). Every other override applies to
the config as usual (e.g. ``edge.threshold_margin=3``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.app.evaluation import HeldoutJob, evaluate_weights, format_score
from robot_rl.app.policies import SHIPPED_BC
from robot_rl.bench.config import ReplanBenchConfig
from robot_rl.core.errors import ConfigError

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)



def with_floor(cfg: RobotRLConfig, floor: int) -> RobotRLConfig:
    """A copy of ``cfg`` whose edge re-plans with at least ``floor`` actions left."""
    return dataclasses.replace(cfg, edge=dataclasses.replace(cfg.edge, min_request_threshold=floor))


def summarize(scores: dict[str, dict[int, dict]], floors: Sequence[int]) -> dict[str, Any]:
    """Mean success per floor over all weights, and each floor's paired difference to the first."""
    means = {f: sum(scores[w][f]["success"] for w in scores) / len(scores) for f in floors}
    return {"mean": means, "vs_first_floor": {f: means[f] - means[floors[0]] for f in floors}}


def run_replan_bench(cfg: RobotRLConfig, bench: ReplanBenchConfig) -> dict[str, Any]:
    """Every weights at every floor on the same held-out scenes."""
    scores: dict[str, dict[int, dict]] = {}
    missing = [w for w in bench.weights if not Path(w).is_dir()]
    if missing:
        raise ConfigError(f"bench.weights: not a directory: {missing}")
    for weights in bench.weights or [str(SHIPPED_BC)]:
        scores[weights] = {}
        for floor in bench.floors:
            job = HeldoutJob.of(with_floor(cfg, floor), bench.episodes)
            result = evaluate_weights(Path(weights), job, f"{Path(weights).name} floor {floor}")
            scores[weights][floor] = result
            log.info("%s at floor %d: %s", weights, floor, format_score(result))
    return {"episodes": bench.episodes, "floors": list(bench.floors), "scores": scores,
            **summarize(scores, bench.floors)}


def print_table(report: dict[str, Any]) -> None:
    floors = report["floors"]
    print(f"\nheld-out success on {report['episodes']} scenes per cell (edge.min_request_threshold)")
    print("| weights | " + " | ".join(f"floor {f}" for f in floors) + " |")
    print("|---|" + "---|" * len(floors))
    for weights, by_floor in report["scores"].items():
        print(f"| {weights} | " + " | ".join(format_score(by_floor[f]) for f in floors) + " |")
    print("| mean | " + " | ".join(f"{report['mean'][f]:.1%}" for f in floors) + " |")
    print(f"| vs floor {floors[0]} | " + " | ".join(f"{report['vs_first_floor'][f]:+.1%}" for f in floors) + " |")


def run_from_cli(cfg: RobotRLConfig) -> dict[str, Any]:
    report = run_replan_bench(cfg, cfg.bench)
    print_table(report)
    return report
