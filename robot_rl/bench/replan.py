"""`robot-rl bench replan`: held-out success of given weights at several re-planning floors.

The edge asks for the next chunk when ``remaining <= max(d + margin, edge.min_request_threshold)``.
With fast inference (``d`` ~ 0) the adaptive part alone lets a 20-action chunk run ~18 ticks
open loop; a floor makes the policy re-plan sooner, at one policy call per (H - floor) ticks.
Whether that buys success depends on the weights, so this scores every weights directory on
the same held-out scenes (seed + 9,000,000 onwards, no operator, virtual time) at every floor:
the episodes are paired (same scene, same policy noise), and the table's last rows give each
floor's mean and its difference to the first floor over all weights.

    robot-rl bench replan --json /tmp/bench/replan.json "bench.weights=[checkpoints/bc_push,RUN/checkpoints/latest]"

Settings (``bench.*``): ``weights`` (default: the shipped start), ``floors`` (default [0, 10]),
``episodes`` per weights and floor (default 80; ``--quick``: 4). Every other override goes to
the config (e.g. ``edge.threshold_margin=3``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from robot_rl.bench.heldout import evaluate_weights, format_score
from robot_rl.bench.settings import split_bench_settings
from robot_rl.commands.policy_loading import SHIPPED_BC
from robot_rl.config import ConfigError

log = logging.getLogger(__name__)



@dataclass
class ReplanBenchConfig:
    """The benchmark's own settings (``bench.*`` overrides); see the module docstring."""

    weights: tuple[str, ...] = (str(SHIPPED_BC),)  # the shipped BC start, wherever this runs from
    floors: tuple[int, ...] = (0, 10)
    episodes: int = 80

    def __post_init__(self) -> None:
        self.weights = (self.weights,) if isinstance(self.weights, str) else tuple(str(w) for w in self.weights)
        self.floors = (self.floors,) if isinstance(self.floors, int) else tuple(self.floors)
        if not self.weights:
            raise ConfigError("bench.weights: give at least one weights directory")
        missing = [w for w in self.weights if not Path(w).is_dir()]
        if missing:
            raise ConfigError(f"bench.weights: not a directory: {missing}")
        bad = [f for f in self.floors if isinstance(f, bool) or not isinstance(f, int) or f < 0]
        if bad or not self.floors:
            raise ConfigError(f"bench.floors must be integers >= 0, got {list(self.floors)}")
        if isinstance(self.episodes, bool) or not isinstance(self.episodes, int) or self.episodes < 1:
            raise ConfigError(f"bench.episodes must be an integer >= 1, got {self.episodes!r}")


def parse_overrides(overrides: Sequence[str], quick: bool = False) -> tuple[ReplanBenchConfig, list[str]]:
    """Split ``bench.*`` settings from the config overrides; ``--quick`` changes the defaults only."""
    explicit, rest = split_bench_settings(overrides, ReplanBenchConfig, list_fields=("weights",))
    base = {"episodes": 4} if quick else {}
    return ReplanBenchConfig(**{**base, **explicit}), rest


def with_floor(cfg: DictConfig, floor: int) -> DictConfig:
    """A copy of ``cfg`` whose edge re-plans with at least ``floor`` actions left."""
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    copy.edge.min_request_threshold = int(floor)
    return copy


def summarize(scores: dict[str, dict[int, dict]], floors: Sequence[int]) -> dict[str, Any]:
    """Mean success per floor over all weights, and each floor's paired difference to the first."""
    means = {f: sum(scores[w][f]["success"] for w in scores) / len(scores) for f in floors}
    return {"mean": means, "vs_first_floor": {f: means[f] - means[floors[0]] for f in floors}}


def run_replan_bench(cfg: DictConfig, bench: ReplanBenchConfig) -> dict[str, Any]:
    """Every weights at every floor on the same held-out scenes."""
    scores: dict[str, dict[int, dict]] = {}
    for weights in bench.weights:
        scores[weights] = {}
        for floor in bench.floors:
            result = evaluate_weights(Path(weights), with_floor(cfg, floor), bench.episodes,
                                      f"{Path(weights).name} floor {floor}")
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


def run_from_cli(quick: bool, overrides: list[str]) -> dict[str, Any]:
    from robot_rl.config import load_config

    bench, rest = parse_overrides(overrides, quick)
    cfg = load_config(rest)
    report = run_replan_bench(cfg, bench)
    report["quick"] = quick
    report["overrides"] = list(overrides)
    print_table(report)
    return report
