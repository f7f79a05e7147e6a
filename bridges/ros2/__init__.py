"""ROS 2 bridge: any ROS 2 arm (JointState + camera topics in, JointTrajectory or
Float64MultiArray out) as a robot_rl ``Robot``, with real rclpy.

``Ros2Robot`` (robot.py) is the backend, ``Ros2ArmConfig`` (config.py) its settings,
``messages.py`` the message conversions, and ``fake_arm.py`` a stand-in driver process
for dry runs and tests. rclpy is imported only when a robot connects.
"""

from typing import TYPE_CHECKING

from robot_rl.bridges.ros2.config import Ros2ArmConfig, Ros2CameraConfig

if TYPE_CHECKING:  # what the lazy exports below are, for type checkers
    from robot_rl.bridges.ros2.robot import Ros2Robot, StaleStateError

__all__ = ["Ros2ArmConfig", "Ros2CameraConfig", "Ros2Robot", "StaleStateError"]


def __getattr__(name: str) -> object:
    if name in ("Ros2Robot", "StaleStateError"):
        from robot_rl.bridges.ros2 import robot

        return getattr(robot, name)
    raise AttributeError(name)
