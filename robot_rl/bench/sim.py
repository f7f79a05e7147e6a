"""Benchmark of the MuJoCo SO-101 sim: rendering, physics and the scripted expert.

Measured side by side in one run, because these machines are shared and noisy:
render frames/s per camera for the default ``fast`` look and for the stock ``full``
meshes (a few frames only; it is ~100x slower), raw ``mj_step`` calls per second,
the scripted expert's success rate per task family and cost per command (its IK on a
contact-free copy of the model against the live model), and the time to record demonstrations
in one process against the sim in a child process (``robot_rl.app.demo_process``).

    robot-rl bench sim bench.episodes=20 --json bench_results/sim.json
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from robot_rl.app.record_demos import record_demos
from robot_rl.hardware.sim import TASK_FAMILIES, ScriptedExpert, SimConfig, SimSO101, run_expert_episode
from robot_rl.hardware.sim.rendering import mujoco

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


def measure_render_fps(config: SimConfig, frames: int, seed: int = 0) -> dict[str, float]:
    """Frames per second for each camera, rendered one at a time on the calling thread."""
    robot = SimSO101(config)
    robot.connect()
    try:
        robot.reset(seed)
        fps = {}
        for cam in config.cameras:
            robot.render((cam,))  # warm-up: GL context, uploads
            start = time.perf_counter()
            for _ in range(frames):
                robot.render((cam,))
            fps[cam] = frames / (time.perf_counter() - start)
        return fps
    finally:
        robot.disconnect()


def measure_steps_per_s(config: SimConfig, steps: int = 5000, seed: int = 0) -> float:
    """Raw ``mj_step`` calls per second with the arm holding a pose over the cubes."""
    robot = SimSO101(config)
    robot.reset(seed)
    model, data = robot.model, robot.data
    start = time.perf_counter()
    for _ in range(steps):
        mujoco.mj_step(model, data)
    return steps / (time.perf_counter() - start)


def measure_expert(
    episodes_per_family: int, seed: int, progress: bool
) -> tuple[dict[str, float], dict[str, float]]:
    """Success rate and mean episode length (seconds of sim time) per task family."""
    robot = SimSO101(SimConfig(cameras=()))
    robot.connect()
    expert = ScriptedExpert(robot)
    success: dict[str, float] = {}
    seconds: dict[str, float] = {}
    total = episodes_per_family * len(TASK_FAMILIES)
    with tqdm(total=total, desc="expert episodes", disable=not progress, leave=False) as bar:
        for family in TASK_FAMILIES:
            results = []
            for k in range(episodes_per_family):
                results.append(run_expert_episode(robot, expert, seed=seed + k, family=family))
                bar.update(1)
            success[family] = float(np.mean([r["success"] for r in results]))
            seconds[family] = float(np.mean([r["sim_time_s"] for r in results]))
    robot.disconnect()
    return success, seconds


def measure_expert_act_ms(seed: int, episodes: int = 3, ticks: int = 60) -> dict[str, float]:
    """Milliseconds per expert ``act()``, its IK on a contact-free model copy against the live model.

    Both replay the very same ticks (same seeds, the fast expert's commands sent), so the
    ratio is the cost of collision detection inside the IK's ``mj_forward`` calls alone.
    """
    robot = SimSO101(SimConfig(cameras=()))
    robot.connect()
    experts = {"contact-free IK": ScriptedExpert(robot),
               "IK on the live model": ScriptedExpert(robot, contact_free_ik=False)}
    elapsed = dict.fromkeys(experts, 0.0)
    calls = 0
    for family in TASK_FAMILIES:
        for k in range(episodes):
            robot.reset(seed + k, family=family)
            for _ in range(ticks):
                commands = []
                for name, expert in experts.items():
                    start = time.perf_counter()
                    commands.append(expert.act())
                    elapsed[name] += time.perf_counter() - start
                calls += 1
                robot.send_action(commands[0])
    robot.disconnect()
    return {name: 1000.0 * seconds / calls for name, seconds in elapsed.items()}


def measure_demo_recording(cfg: RobotRLConfig, episodes: int) -> dict[str, dict[str, float]]:
    """Seconds to record ``episodes`` push demonstrations as ``record-demos`` does (the default
    config: half-speed expert, two cameras, LeRobotDataset v3), in one process against the sim in a
    child process (``demos.sim_process``). The child's start (spawn, imports: ~6 s here) is
    included, the one-process way runs in this process, whose imports are done: so a few episodes
    favour one process, and the ratio approaches the steady state's only over tens of episodes."""
    timings = {}
    with tempfile.TemporaryDirectory(prefix="bench-demos-") as tmp:
        for name, in_child in (("sim in a child process", True), ("one process", False)):
            demos = dataclasses.replace(cfg.demos, dir=f"{tmp}/{int(in_child)}", episodes=episodes,
                                        sim_process=in_child)
            start = time.perf_counter()
            summary = record_demos(dataclasses.replace(cfg, demos=demos), progress=False)
            seconds = time.perf_counter() - start
            timings[name] = {"seconds": seconds, "episodes": summary.stored, "frames": summary.steps,
                             "ms_per_frame": 1000.0 * seconds / max(summary.steps, 1)}
    return timings


def run_sim_bench(cfg: RobotRLConfig, progress: bool = True) -> dict[str, Any]:
    """Run the whole benchmark (``bench.episodes``, ``bench.demo_episodes``), print a table, return the numbers."""
    episodes_per_family, seed = cfg.bench.episodes, cfg.seed
    fast_config = SimConfig(render_quality="fast")
    full_config = SimConfig(render_quality="full")
    render_fps = measure_render_fps(fast_config, frames=300, seed=seed)
    render_fps_full = measure_render_fps(full_config, frames=5, seed=seed)
    steps_per_s = measure_steps_per_s(fast_config, seed=seed)
    expert_success, expert_seconds = measure_expert(episodes_per_family, seed, progress)
    expert_act_ms = measure_expert_act_ms(seed)
    demo_recording = measure_demo_recording(cfg, cfg.bench.demo_episodes)
    result = {
        "render_fps": render_fps,
        "render_fps_full": render_fps_full,
        "render_speedup_fast_vs_full": {
            cam: render_fps[cam] / render_fps_full[cam] for cam in render_fps
        },
        "image_size": [fast_config.image_height, fast_config.image_width],
        "steps_per_s": steps_per_s,
        "physics_dt": fast_config.physics_dt,
        "realtime_factor": steps_per_s * fast_config.physics_dt,
        "expert_success": expert_success,
        "expert_episode_s": expert_seconds,
        "expert_act_ms": expert_act_ms,
        "demo_recording": demo_recording,
        "episodes_per_family": episodes_per_family,
        "seed": seed,
    }
    print_table(result)
    return result


def print_table(result: dict[str, Any]) -> None:
    console = Console()
    h, w = result["image_size"]
    render = Table(title=f"SO-101 sim rendering ({h}x{w}, one core)")
    for column in ("camera", "fast fps", "full fps", "fast / full"):
        render.add_column(column, justify="right")
    for cam, fps in result["render_fps"].items():
        full = result["render_fps_full"][cam]
        render.add_row(cam, f"{fps:.0f}", f"{full:.1f}", f"{fps / full:.0f}x")
    console.print(render)
    console.print(
        f"physics: {result['steps_per_s']:.0f} mj_step/s "
        f"(dt {result['physics_dt'] * 1000:.2f} ms, {result['realtime_factor']:.1f}x real time)"
    )
    expert = Table(title=f"scripted expert ({result['episodes_per_family']} episodes per family)")
    for column in ("family", "success", "mean episode (s)"):
        expert.add_column(column, justify="right")
    for family, rate in result["expert_success"].items():
        expert.add_row(family, f"{rate:.0%}", f"{result['expert_episode_s'][family]:.1f}")
    console.print(expert)
    act_ms = result["expert_act_ms"]
    fast, live = act_ms["contact-free IK"], act_ms["IK on the live model"]
    console.print(f"expert act(): {fast:.2f} ms with contact-free IK, {live:.2f} ms on the live model "
                  f"({live / fast:.2f}x; the same commands)")
    recording = result.get("demo_recording")
    if recording:
        demos = Table(title="recording demonstrations (record-demos; the same dataset either way; "
                            "the child's start-up included)")
        for column in ("how", "episodes", "frames", "seconds", "ms / frame", "speed-up"):
            demos.add_column(column, justify="right")
        serial = recording["one process"]["seconds"]
        for how, row in recording.items():
            demos.add_row(how, str(row["episodes"]), str(row["frames"]), f"{row['seconds']:.1f}",
                          f"{row['ms_per_frame']:.1f}", f"{serial / row['seconds']:.2f}x")
        console.print(demos)


def run_from_cli(cfg: RobotRLConfig) -> dict[str, Any]:
    """Entry for `robot-rl bench sim` (the table is printed by run_sim_bench)."""
    return run_sim_bench(cfg)


