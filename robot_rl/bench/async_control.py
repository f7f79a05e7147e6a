"""`robot-rl bench async`: sync vs async_naive vs async_rollforward under inference latency.

One run, one policy checkpoint, the same seeds for every cell: for each mode and each
simulated inference latency (virtual clock, so a 2-core CPU stands in for a slow VLA on
a GPU) it measures success, completion time, stall time, reaction latency (see
``robot_rl.bench.reaction``), and, in a short real-time section on the wall clock, the
fraction of late ticks with the sim and the policy sharing this machine.

The same cells are then run with the scripted expert as the chunk policy
(``robot_rl.hardware.sim.expert_policy``): it sees the world perfectly and at once, so its
completion times and reaction latencies are the runtime's alone; the checkpoint's are
the runtime's plus its own perception (JSON ``results_expert_policy``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from robot_rl.app.config import Seeds
from robot_rl.app.evaluation import evaluate_policy, run_scene_episode
from robot_rl.bench.config import AsyncBenchConfig
from robot_rl.bench.reaction import commanded_ee, reaction_time
from robot_rl.core.errors import ConfigError
from robot_rl.edge import EdgeConfig
from robot_rl.replay.scenes import Scene

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

MODES = ("sync", "async_naive", "async_rollforward")
# Variants of a mode, benchmarked side by side with it. The modes run the edge's defaults
# (``edge.replan=auto``: continuous re-planning where the policy's compute affords it). "thrifty":
# ask for the next chunk only when the queue runs low, one request in flight. "pipelined": re-plan
# continuously (ask again whenever a request slot is free) with two requests in flight, staggered
# half an inference apart, so a change in the world reaches the executed plan about a quarter
# of an inference sooner on average than with one request in flight. "rtc": real-time
# chunking (LeRobot's RTCProcessor) instead of trim/blend: the new chunk, computed from the
# request tick's observation, is guided onto what the queue executes meanwhile, so it joins
# without a jump and without rolling the state forward. Flow policies only (the scripted
# expert has no flow to guide, so its table leaves it out).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "async_rollforward_thrifty": ("async_rollforward", {"replan": "thrifty"}),
    "async_rollforward_pipelined": ("async_rollforward", {"replan": "continuous", "max_inflight": 2}),
    "async_naive_rtc": ("async_naive", {"real_time_chunking": True}),
}
# The target moves 0.5-0.9 s in: the arm is on its way to the cube, nothing grasped yet.
# The tick varies over seeds so the move lands at every phase of an inference cycle (at a
# fixed tick and constant latency, one phase would decide the result for the whole cell).
PERTURB_FIRST_TICK = 15
PERTURB_SPREAD_TICKS = 12  # one 400 ms inference at 30 Hz
REACTION_WINDOW_TICKS = 45


def perturb_tick(i: int) -> int:
    """Tick at which reaction episode ``i`` moves the target (a stride-5 walk over 12 phases)."""
    return PERTURB_FIRST_TICK + (5 * i) % PERTURB_SPREAD_TICKS


def mode_config(base: EdgeConfig, mode: str, latency_ms: float) -> EdgeConfig:
    """The edge settings of one benchmark cell: the configured edge, with this mode (or
    variant, see ``VARIANTS``) and latency."""
    settings: dict = {"real_time_chunking": False}
    if mode in VARIANTS:
        mode, variant = VARIANTS[mode]
        settings["max_inflight"] = variant.get("max_inflight", base.max_inflight)
        settings["replan"] = variant.get("replan", base.replan)
        settings["real_time_chunking"] = bool(variant.get("real_time_chunking", False))
    return replace(
        base,
        **settings,
        mode=mode,
        simulated_latency_ms=float(latency_ms),
        latency_distribution="constant",
        latency_jitter_ms=0.0,
        inference_runner="virtual",
    )


def measure_reaction(robot, policy, config: EdgeConfig, seeds: list[int],
                     families: Sequence[str] | None = None) -> list[float]:
    """Counterfactual reaction times (s) over seeds: moved target vs untouched twin run."""
    times = []
    for i, seed in enumerate(seeds):
        family = families[i % len(families)] if families else None
        moved_to: dict[str, np.ndarray] = {}
        at = perturb_tick(i)

        def perturb(node, tick, seed=seed, at=at, moved_to=moved_to):
            if tick == at:
                before = robot.target_position().copy()
                after = robot.move_target(seed)
                moved_to["direction"] = np.asarray(after) - before

        steps = at + REACTION_WINDOW_TICKS
        moved, _ = run_scene_episode(robot, policy, config, Scene(seed, family=family), on_tick=perturb,
                                     max_steps=steps)
        ee_moved = commanded_ee(robot, moved)
        baseline, _ = run_scene_episode(robot, policy, config, Scene(seed, family=family), max_steps=steps)
        ee_base = commanded_ee(robot, baseline)
        if "direction" not in moved_to:
            continue  # the episode ended (success) before the perturbation
        times.append(reaction_time(ee_moved, ee_base, moved_to["direction"], at, robot.fps).reaction_s)
    return times


def measure_late_ticks(robot, policy, config: EdgeConfig, seeds: list[int]) -> float:
    """Late-tick fraction in real time: wall clock, policy in a background thread."""
    from robot_rl.core.clock import WallClock
    from robot_rl.edge import EdgeNode

    late = total = 0
    for seed in seeds:
        instruction = robot.reset(seed=seed)
        rt = replace(config, inference_runner="thread", latency_distribution="constant", simulated_latency_ms=0.0)
        with EdgeNode(robot, policy, WallClock(), rt, task=robot) as node:
            episode = node.run_episode(robot.config.max_episode_steps, instruction, seed=seed)
            late += node.stats.late_ticks
            total += episode.num_steps
    return late / total if total else 0.0


def measure_cells(
    robot,
    policy,
    base: EdgeConfig,
    seeds: list[int],
    reaction_seeds: list[int],
    latencies_ms: Sequence[int],
    modes: Sequence[str] = (*MODES, *VARIANTS),
    families: Sequence[str] | None = None,
    desc: str = "bench async",
    progress: bool = True,
) -> dict[str, dict[str, dict]]:
    """``results[mode][latency_ms]`` -> success, completion, stall and reaction of one policy."""
    results: dict[str, dict[str, dict]] = {m: {} for m in modes}
    cells = [(m, lat) for m in modes for lat in latencies_ms]
    for mode, latency in tqdm(cells, desc=desc, disable=not progress):
        config = mode_config(base, mode, latency)
        evaluation = evaluate_policy(robot, policy, config, seeds, families=families, progress=False)
        reactions = measure_reaction(robot, policy, config, reaction_seeds, families)
        finite = [r for r in reactions if math.isfinite(r)]
        floor_s = latency / 1000.0 + 1.0 / robot.fps
        reaction = float(np.mean(finite)) if finite else float("nan")
        results[mode][str(latency)] = {
            "success": evaluation.success_rate,
            "success_ci95": list(evaluation.ci95),
            "completion_s": evaluation.completion_s,
            "stall_s_per_episode": evaluation.stall_s_per_episode,
            "reaction_s": reaction,
            "reaction_floor_s": floor_s,
            "reaction_over_floor": reaction / floor_s if finite else float("nan"),
            "reaction_measured": f"{len(finite)}/{len(reactions)}",
        }  # no lateness: on the virtual clock every tick starts on time (realtime_late_tick_frac measures it)
    add_ratios_to_sync(results)
    return results


def run_async_bench(
    robot,
    policy,
    base: EdgeConfig,
    settings: AsyncBenchConfig,
    seeds: Seeds,
    latencies_ms: Sequence[int],
    modes: Sequence[str],
    families: Sequence[str] | None = None,
    expert_policy=None,
    progress: bool = True,
) -> dict:
    """The checkpoint in every cell; then, if given, the privileged ``expert_policy`` (see
    ``robot_rl.hardware.sim.expert_policy``) in every cell, which isolates the runtime's timing from
    the learned policy's perception; then late ticks in real time."""
    episodes = settings.episodes
    scenes = [seeds.eval + i for i in range(episodes)]
    reaction_seeds = [seeds.reaction + i for i in range(settings.reaction_episodes)]
    report: dict = {
        "results": measure_cells(robot, policy, base, scenes, reaction_seeds, latencies_ms, modes, families,
                                 "bench async (checkpoint)", progress),
    }
    if expert_policy is not None:
        expert_modes = [m for m in modes if not mode_config(base, m, 0).real_time_chunking]
        report["results_expert_policy"] = measure_cells(
            robot, expert_policy, base, scenes, reaction_seeds, latencies_ms, expert_modes, families,
            "bench async (expert policy)", progress)
    realtime_seeds = [seeds.realtime + i for i in range(settings.realtime_episodes)]
    report["realtime_late_tick_frac"] = measure_late_ticks(
        robot, policy, mode_config(base, "async_rollforward", 0), realtime_seeds)
    # Continuous re-planning runs the policy several times as often: does the control loop still keep time?
    report["realtime_late_tick_frac_by_mode"] = {
        mode: measure_late_ticks(robot, policy, mode_config(base, mode, 0),
                                 realtime_seeds)
        for mode in VARIANTS if mode in modes
    } | {"async_rollforward": report["realtime_late_tick_frac"]}
    report.update(episodes_per_cell=episodes, reaction_episodes_per_cell=settings.reaction_episodes, fps=robot.fps)
    return report


def add_ratios_to_sync(results: dict[str, dict[str, dict]]) -> None:
    """Each cell's reaction and completion time over sync's at the same latency."""
    sync = results.get("sync", {})
    for by_latency in results.values():
        for latency, cell in by_latency.items():
            base = sync.get(latency, {})
            for key in ("reaction_s", "completion_s"):
                ratio = cell[key] / base[key] if base.get(key) and math.isfinite(base[key]) else float("nan")
                cell[f"{key.removesuffix('_s')}_vs_sync"] = ratio


def print_table(report: dict) -> None:
    titles = {"results": "checkpoint", "results_expert_policy": "expert chunk policy (privileged: runtime only)"}
    for key, title in titles.items():
        if key in report:
            print_cells(report[key], f"async control, {title}: mode x simulated inference latency (virtual clock)")
    by_mode = report.get("realtime_late_tick_frac_by_mode", {"async_rollforward": report["realtime_late_tick_frac"]})
    print("real-time mode (wall clock, policy threads + sim in one process): late ticks "
          + ", ".join(f"{mode} {frac:.2%}" for mode, frac in by_mode.items()))


def print_cells(results: dict, title: str) -> None:
    table = Table(title=title)
    for col in ("mode", "latency ms", "success", "completion s", "vs own 0 ms", "stall s/ep", "reaction s", "x floor",
                "x sync"):
        table.add_column(col, justify="right")
    for mode, by_latency in results.items():
        zero = by_latency.get("0", {}).get("completion_s", float("nan"))
        for latency, r in by_latency.items():
            table.add_row(
                mode, latency, f"{r['success']:.0%}", f"{r['completion_s']:.2f}",
                f"{r['completion_s'] / zero:.2f}x" if zero and math.isfinite(zero) else "-",
                f"{r['stall_s_per_episode']:.3f}", f"{r['reaction_s']:.3f}", f"{r['reaction_over_floor']:.2f}",
                f"{r['reaction_vs_sync']:.2f}",
            )
    Console(width=140).print(table)


def run_from_cli(cfg: RobotRLConfig) -> dict:
    from robot_rl.app.policies import load_policy, policy_source
    from robot_rl.app.sim import demo_expert, make_sim, task_families
    from robot_rl.hardware.sim.expert_policy import ExpertChunkPolicy

    modes = tuple(cfg.bench.modes) if cfg.bench.modes is not None else (*MODES, *VARIANTS)
    unknown = [m for m in modes if m not in (*MODES, *VARIANTS)]
    if unknown:
        raise ConfigError(f"bench.modes: unknown {unknown}; choose from {[*MODES, *VARIANTS]}")
    policy = load_policy(cfg)  # episodes are reproducible: run_scene_episode seeds the policy's noise per episode
    robot = make_sim(cfg)
    expert = ExpertChunkPolicy(demo_expert(robot, cfg.demos.expert_speed), getattr(policy, "chunk_size", 20))
    try:
        report = run_async_bench(robot, policy, cfg.edge, cfg.bench, cfg.seeds, tuple(cfg.bench.latencies_ms), modes,
                                 families=task_families(cfg), expert_policy=expert)
    finally:
        robot.disconnect()
    report["policy"] = policy_source(cfg)
    print_table(report)
    return report
