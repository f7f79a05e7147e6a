"""Open-loop replay: send the logged actions to the sim and compare the states it reaches.

Each step t reads the sim's joint state (before the action, as the recorder logs it),
then sends logged action t, which advances physics by exactly 1/fps. The per-joint
difference between logged and simulated states is the tracking error: near zero when
physics and start match (a recording from our own sim), and otherwise a measure of how
far the sim's dynamics are from the robot's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from robot_rl.core.clock import WallClock
from robot_rl.replay.scenes import Scene, apply_scene

FrameSink = Callable[[int, dict[str, np.ndarray]], None]  # (step, sim camera images) -> None


@dataclass
class TrackingResult:
    """Logged vs simulated joint states of one episode, both in sim units."""

    joint_names: tuple[str, ...]
    logged: np.ndarray  # [T, D]
    simulated: np.ndarray  # [T, D]
    scene_recreated: bool

    @property
    def error(self) -> np.ndarray:
        """[T, D] simulated minus logged."""
        return self.simulated - self.logged

    def rmse(self) -> dict[str, float]:
        return {n: float(v) for n, v in zip(self.joint_names, np.sqrt(np.mean(self.error**2, axis=0)), strict=True)}

    def max_abs(self) -> dict[str, float]:
        return {n: float(v) for n, v in zip(self.joint_names, np.max(np.abs(self.error), axis=0), strict=True)}

    def as_dict(self) -> dict:
        return {
            "steps": int(self.logged.shape[0]),
            "scene_recreated": self.scene_recreated,
            "rmse": self.rmse(),
            "max_abs": self.max_abs(),
        }


def replay_open_loop(
    robot,
    states: np.ndarray,
    actions: np.ndarray,
    scene: Scene,
    *,
    realtime: bool = False,
    frame_sink: FrameSink | None = None,
    fallback_seed: int = 0,
    progress: bool = True,
) -> TrackingResult:
    """Replay ``actions`` [T, D] (sim units) from ``scene``; compare with logged ``states`` [T, D].

    ``realtime`` paces steps on the wall clock at the robot's fps (to watch along);
    otherwise steps run back to back. ``frame_sink`` receives the sim's camera images
    of each step (rendering costs time, so it is skipped without a sink).
    """
    if states.shape != actions.shape:
        raise ValueError(f"states {states.shape} and actions {actions.shape} must have the same shape")
    apply_scene(robot, scene, fallback_seed=fallback_seed)
    clock = WallClock() if realtime else None
    simulated = np.empty_like(states, dtype=np.float32)
    for t in tqdm(range(len(actions)), desc="replaying", leave=False, disable=not progress):
        if clock is not None:
            clock.sleep_until(t / robot.fps)
        if frame_sink is not None:
            observation = robot.get_observation()
            simulated[t] = observation["state"]
            frame_sink(t, observation["images"])
        else:
            simulated[t] = robot.joint_state()
        robot.send_action(actions[t])
    return TrackingResult(tuple(robot.joint_names), np.asarray(states, np.float32), simulated, scene.recreated)
