"""Robots, cameras and teleoperation devices behind one ``Robot`` protocol.

Backends: the MuJoCo SO-101 simulation (``robot_rl.hardware.sim``), LeRobot robots, and ROS 2
arms (through ``robot_rl.bridges.ros2``). Nothing here knows about learning.
"""

from robot_rl.hardware.robot import InvalidActionError, Observation, Robot, validate_action

__all__ = ["InvalidActionError", "Observation", "Robot", "validate_action"]
