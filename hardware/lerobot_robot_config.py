"""``LeRobotRobotConfig``: which LeRobot robot to drive and how (``hardware.lerobot_robot`` drives it).

Kept apart from the adapter so that choosing a robot on the command line imports no LeRobot code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from robot_rl.core.registry import ROBOTS


@ROBOTS.register("lerobot", builder="robot_rl.hardware.lerobot_robot:LeRobotRobot")
@dataclass
class LeRobotRobotConfig:
    """Settings of a LeRobot robot (``robot=lerobot robot.type=koch_follower ...``; the preset
    ``robot=so101`` is an SO-101 follower with one camera).

    ``options`` passes any further field of the LeRobot config class (e.g. ``use_degrees``,
    ``position_p_coefficient``); ``joint_limits`` overrides the limits otherwise derived
    from LeRobot's motor calibration (``{joint: [lower, upper]}``, action units).
    """

    type: str = "so101_follower"
    port: str = "/dev/ttyACM0"
    id: str = "follower"
    calibration_dir: str | None = None
    fps: int = 30
    cameras: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_relative_target: float | None = None
    disable_torque_on_disconnect: bool = True
    joint_limits: dict[str, list[float]] | None = None
    # Fastest a joint target may move (action units per second: degrees, gripper 0..100), one
    # number or one per joint. Every commanded target is bounded by it, the first tick, takeovers
    # and hand-backs included. 120 deg/s is a third of an SO-101 servo's no-load speed: quick
    # enough for manipulation, slow enough for a hand to get out of the way.
    max_joint_velocity: Any = 120.0
    # Cameras whose frames are undistorted before anything sees them: {camera: intrinsics.yaml}
    # from `robot-rl calibrate camera`; the policy and the recording get the undistorted frames.
    undistort: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    # Never start LeRobot's interactive calibration from a session: run `robot-rl calibrate motors`.
    calibrate_on_connect: bool = False
