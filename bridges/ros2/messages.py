"""Conversions between ROS 2 messages and numpy, kept free of node plumbing so they are easy to test."""

from __future__ import annotations

import cv2
import numpy as np
from builtin_interfaces.msg import Duration
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint


def duration(seconds: float) -> Duration:
    nanoseconds = int(round(seconds * 1e9))
    return Duration(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def duration_s(d: Duration) -> float:
    return d.sec + d.nanosec * 1e-9


def joint_positions(msg: JointState, joint_names: tuple[str, ...]) -> dict[str, float]:
    """Positions of those of ``joint_names`` that ``msg`` carries, by name (any order).

    Drivers publish joints in their own order and sometimes split them over several
    JointState messages (arm and gripper); the caller merges the parts by name.
    """
    count = len(msg.position)
    wanted = set(joint_names)
    return {name: float(msg.position[i]) for i, name in enumerate(msg.name) if name in wanted and i < count}


def image_to_rgb(msg: Image) -> np.ndarray:
    """sensor_msgs/Image (rgb8, bgr8, mono8) -> uint8 HxWx3 RGB."""
    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1}.get(msg.encoding)
    if channels is None:
        raise ValueError(f"unsupported image encoding {msg.encoding!r}; publish rgb8, bgr8 or mono8")
    rows = np.frombuffer(bytes(msg.data), dtype=np.uint8).reshape(msg.height, msg.step)
    image = rows[:, : msg.width * channels].reshape(msg.height, msg.width, channels)
    if msg.encoding == "bgr8":
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    if msg.encoding == "mono8":
        return cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    return image.copy()


def compressed_to_rgb(msg: CompressedImage) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(bytes(msg.data), dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"cannot decode compressed image (format {msg.format!r})")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def rgb_to_image(rgb: np.ndarray, frame_id: str = "camera") -> Image:
    msg = Image()
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(rgb.shape[0]), int(rgb.shape[1])
    msg.encoding = "rgb8"
    msg.step = msg.width * 3
    msg.data = np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()
    return msg


def trajectory(joint_names: tuple[str, ...], points: np.ndarray, period_s: float) -> JointTrajectory:
    """A trajectory whose point i is due at (i + 1) * period_s from now.

    Point 0 is this tick's target, reached by the next tick; the rest is the plan, so a
    joint_trajectory_controller interpolates between ticks instead of stepping. The header
    stamp is left at zero, which the controller reads as "start now".
    """
    msg = JointTrajectory()
    msg.joint_names = list(joint_names)
    for i, positions in enumerate(np.asarray(points, dtype=np.float64)):
        point = JointTrajectoryPoint()
        point.positions = positions.tolist()
        point.time_from_start = duration((i + 1) * period_s)
        msg.points.append(point)
    return msg


def forward_command(positions: np.ndarray) -> Float64MultiArray:
    msg = Float64MultiArray()
    msg.data = np.asarray(positions, dtype=np.float64).tolist()
    return msg
