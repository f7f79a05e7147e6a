"""Optional live view of cameras, joint state and actions in Rerun (LeRobot's convention:
``observation.images.<cam>``, ``observation.state.<joint>``, ``action.<joint>``)."""

from __future__ import annotations

import rerun as rr  # ImportError when rerun-sdk is not installed: the session then runs without a viewer

from robot_rl.core.types import Step


class RerunViewer:
    def __init__(self, app_id: str = "robot_rl_session") -> None:
        rr.init(app_id, spawn=True)

    def log_step(self, step: Step) -> None:
        rr.set_time("tick", sequence=step.tick)
        for cam, image in step.images.items():
            rr.log(f"observation.images.{cam}", rr.Image(image))
        for i, value in enumerate(step.state):
            rr.log(f"observation.state.{i}", rr.Scalars(float(value)))
        for i, value in enumerate(step.action):
            rr.log(f"action.{i}", rr.Scalars(float(value)))
        rr.log("is_intervention", rr.Scalars(float(step.is_intervention)))
