"""Robots, cameras and teleoperation devices behind one ``Robot`` protocol.

Backends: the MuJoCo SO-101 simulation (``hardware.sim``), LeRobot robots, and ROS 2
arms (through ``bridges.ros2``). Nothing here knows about learning.
"""

from hardware.robot import InvalidActionError, Observation, Robot, validate_action

__all__ = ["InvalidActionError", "Observation", "Robot", "validate_action"]
