"""Latency calibration: the delays the edge's roll-forward has to plan around, measured on the robot.

Three numbers, each measured where it arises:

* command-to-motion delay (ticks): hold the arm still, command a small step on one joint,
  and count the ticks until the robot's *own joint feedback* shows the move. Servo
  firmware, bus and driver buffering all add to it; the policy's state input lags the
  commanded plan by this much (``EdgeConfig.command_lag_ticks``: roll-forward gives the policy
  the target commanded that much before the new chunk starts).
* camera frame age (ms): how old the newest frame is when the control loop reads it
  (exposure + USB + driver buffering), for robots whose cameras timestamp frames.
* inference latency (ms): the distribution of the policy's chunk computation on this
  machine. Its high quantile in ticks is the delay prior ``EdgeConfig.delay_prior_ticks``
  starts from (the online estimator takes over after the first chunks).

All timing goes through a ``Clock``, so the same code runs on the wall clock on a robot
and on a virtual clock in the sim.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import yaml

from robot_rl.core.clock import Clock
from robot_rl.hardware.robot import Observation, Robot
from robot_rl.policies.base import ChunkPolicy

log = logging.getLogger(__name__)


class LatencyCalibrationError(RuntimeError):
    """The measurement could not be made (the joint never moved, ...)."""


@dataclass
class StepTestConfig:
    """The step command: which joint, how far, how long to settle and to wait for motion."""

    joint: int = 0
    step: float = 4.0  # degrees: visible above encoder noise, harmless for the arm
    trials: int = 4  # alternating up/down steps, so the arm ends where it started
    settle_ticks: int = 10
    max_wait_ticks: int = 30
    threshold: float = 0.25  # fraction of the step that counts as "moved"


@dataclass
class LatencyReport:
    fps: int
    command_to_motion_ticks: int
    command_to_motion_trials: list[int]
    camera_frame_age_ms: dict[str, float] = field(default_factory=dict)  # median per camera
    inference_ms: dict[str, float] = field(default_factory=dict)  # p50 / p90 / p99 / max, n
    delay_prior_ticks: int = 0

    def save_yaml(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        # The block an operator pastes (or a session loads) into its edge config.
        data["edge"] = {"delay_prior_ticks": self.delay_prior_ticks, "command_lag_ticks": self.command_to_motion_ticks}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


def default_latency_path(output_dir: str | Path, robot_name: str) -> Path:
    """Where ``robot-rl calibrate latency`` writes a robot's report, and where the edge looks for it."""
    return Path(output_dir) / "calibration" / robot_name / "latency.yaml"


def read_latency_calibration(path: str | Path) -> tuple[int, int]:
    """(delay prior, command-to-motion) in ticks from a saved ``LatencyReport``; a clear error for
    anything else."""
    try:
        data = yaml.safe_load(Path(path).read_text())
        prior, lag = int(data["delay_prior_ticks"]), int(data["command_to_motion_ticks"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not a latency calibration (robot-rl calibrate latency): {exc}") from exc
    if prior < 0 or lag < 0:
        raise ValueError(f"{path}: delay_prior_ticks and command_to_motion_ticks must be >= 0, got {prior}, {lag}")
    return prior, lag


def measure_command_delay(robot: Robot, clock: Clock, config: StepTestConfig | None = None) -> list[int]:
    """Ticks from sending a step command to the first joint reading that shows it, per trial.

    Tick k's reading is taken right before tick k's command; a command sent at tick 0 that
    an ideal robot executes within the tick shows in the reading of tick 1 (delay 0).
    """
    cfg = config or StepTestConfig()
    period = 1.0 / robot.fps
    t0 = clock.now()
    tick = 0

    def next_tick() -> np.ndarray:
        nonlocal tick
        tick += 1
        clock.sleep_until(t0 + tick * period)
        return np.asarray(robot.get_observation()["state"], dtype=np.float64)

    hold = np.asarray(robot.get_observation()["state"], dtype=np.float32)
    delays = []
    for trial in range(cfg.trials):
        for _ in range(cfg.settle_ticks):
            robot.send_action(hold)
            baseline = next_tick()
        target = hold.copy()
        target[cfg.joint] += cfg.step if trial % 2 == 0 else -cfg.step
        delay = None
        for k in range(cfg.max_wait_ticks):
            robot.send_action(target)
            reading = next_tick()
            if abs(reading[cfg.joint] - baseline[cfg.joint]) > cfg.threshold * cfg.step:
                delay = k
                break
        if delay is None:
            raise LatencyCalibrationError(
                f"joint {robot.joint_names[cfg.joint]} did not move {cfg.threshold * cfg.step:.2f} within "
                f"{cfg.max_wait_ticks} ticks of a {cfg.step} step; is torque on and the joint free?"
            )
        delays.append(delay)
        hold = target
        log.info("step trial %d: motion after %d ticks", trial, delay)
    return delays


def measure_camera_age(read_ages: Callable[[], dict[str, float]], clock: Clock, samples: int,
                       fps: int) -> dict[str, float]:
    """Median age (ms) per camera of the newest frame, sampled once per tick."""
    ages: dict[str, list[float]] = {}
    t0 = clock.now()
    for i in range(samples):
        clock.sleep_until(t0 + i / fps)
        for cam, age_s in read_ages().items():
            ages.setdefault(cam, []).append(age_s * 1000.0)
    return {cam: float(np.median(v)) for cam, v in ages.items()}


def measure_inference(
    policy: ChunkPolicy,
    observation: Observation,
    instruction: str,
    runs: int = 20,
    warmup: int = 2,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Latency distribution (ms) of ``predict_chunk`` on a real observation."""
    images, state = observation["images"], np.asarray(observation["state"], dtype=np.float32)
    for _ in range(warmup):  # first calls pay for lazy init, allocator growth, kernel compilation
        policy.predict_chunk(images, state, instruction)
    latencies = []
    for _ in range(runs):
        start = timer()
        policy.predict_chunk(images, state, instruction)
        latencies.append((timer() - start) * 1000.0)
    arr = np.asarray(latencies)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "max": float(arr.max()),
        "n": float(len(arr)),
    }


def delay_prior_ticks(inference_p90_ms: float, fps: int) -> int:
    """Ticks consumed while a chunk is computed, at the high quantile (what roll-forward needs)."""
    # A hundredth of a tick is measurement noise, not a tick of delay.
    return max(0, math.ceil(inference_p90_ms / 1000.0 * fps - 0.01))


def calibrate_latency(
    robot: Robot,
    clock: Clock,
    policy: ChunkPolicy | None = None,
    instruction: str = "",
    step: StepTestConfig | None = None,
    inference_runs: int = 20,
    camera_samples: int = 30,
    inference_timer: Callable[[], float] = time.perf_counter,
) -> LatencyReport:
    """Run all three measurements on a connected robot."""
    trials = measure_command_delay(robot, clock, step)
    ages_fn = getattr(robot, "camera_frame_ages_s", None)
    camera = measure_camera_age(ages_fn, clock, camera_samples, robot.fps) if ages_fn is not None else {}
    inference: dict[str, float] = {}
    prior = 0
    if policy is not None:
        inference = measure_inference(policy, robot.get_observation(), instruction, inference_runs,
                                      timer=inference_timer)
        prior = delay_prior_ticks(inference["p90"], robot.fps)
    return LatencyReport(
        fps=robot.fps,
        command_to_motion_ticks=int(np.median(trials)),
        command_to_motion_trials=trials,
        camera_frame_age_ms=camera,
        inference_ms=inference,
        delay_prior_ticks=prior,
    )
