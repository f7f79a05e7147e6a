"""Settings of a ROS 2 arm: topics, joint names, units, command style."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from robot_rl.core.registry import ROBOTS

COMMAND_TYPES = ("trajectory", "forward")


@dataclass
class Ros2CameraConfig:
    """One camera topic. ``compressed`` = sensor_msgs/CompressedImage (JPEG/PNG), else sensor_msgs/Image."""

    topic: str = "/camera/image_raw"
    compressed: bool = False
    height: int = 480
    width: int = 640


@ROBOTS.register("ros2_arm", builder="robot_rl.bridges.ros2.robot:Ros2Robot")
@dataclass
class Ros2ArmConfig:
    """A ROS 2 arm as a robot_rl Robot (``robot=ros2_arm``).

    command_type: "trajectory" publishes trajectory_msgs/JointTrajectory to a
        joint_trajectory_controller (the remaining plan, one point per tick, so ros2_control
        interpolates between them); "forward" publishes std_msgs/Float64MultiArray to a
        forward_position_controller (one target per tick, joint order as ``joint_names``).
    scale / offset: action units = ROS value * scale + offset per joint (ROS uses radians
        and metres; a policy trained on an SO-101 in LeRobot units wants degrees and 0..100).
    stale_after_ms: get_observation raises if the newest JointState is older than this: a
        policy must never act on a state the arm left long ago (driver crash, cable, network).
    """

    name: str = "ros2_arm"
    fps: int = 30
    joint_names: tuple[str, ...] = ("joint1", "joint2", "joint3", "joint4", "joint5", "gripper")
    joint_state_topic: str = "/joint_states"
    command_topic: str = "/arm_controller/joint_trajectory"
    command_type: str = "trajectory"
    cameras: dict[str, dict] = field(default_factory=dict)  # name -> Ros2CameraConfig fields
    scale: list[float] | None = None
    offset: list[float] | None = None
    joint_limits: dict[str, list[float]] | None = None  # action units
    # Fastest a joint target may move, in action units per second (after scale/offset), one
    # number or one per joint; bounds every commanded target and every point of a trajectory.
    # The default suits degrees; with radians as action units set it (e.g. 1.5).
    max_joint_velocity: Any = 90.0
    # Cameras whose frames are undistorted before anything sees them: {camera: intrinsics.yaml}
    # from `robot-rl calibrate camera`; the policy and the recording get the undistorted frames.
    undistort: dict[str, str] = field(default_factory=dict)
    stale_after_ms: float = 200.0
    connect_timeout_s: float = 5.0
    max_plan_points: int = 50  # cap on the trajectory length sent each tick
    domain_id: int | None = None  # None: ROS_DOMAIN_ID from the environment
    node_name: str = "robot_rl_arm"

    def __post_init__(self) -> None:
        self.joint_names = tuple(self.joint_names)
        n = len(self.joint_names)
        problems = []
        if self.command_type not in COMMAND_TYPES:
            problems.append(f"command_type must be one of {COMMAND_TYPES}, got {self.command_type!r}")
        for label, values in (("scale", self.scale), ("offset", self.offset)):
            if values is not None and len(values) != n:
                problems.append(f"{label} has {len(values)} entries for {n} joints")
        if self.scale is not None and any(s == 0 for s in self.scale):
            problems.append("scale entries must be non-zero")
        if self.fps <= 0 or self.stale_after_ms <= 0:
            problems.append("fps and stale_after_ms must be > 0")
        if problems:
            raise ValueError("invalid Ros2ArmConfig: " + "; ".join(problems))

    def camera_configs(self) -> dict[str, Ros2CameraConfig]:
        return {name: Ros2CameraConfig(**dict(spec)) for name, spec in self.cameras.items()}
