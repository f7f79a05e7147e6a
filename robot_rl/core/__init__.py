"""Core data types and clocks shared by every part of robot_rl.

This package imports nothing else of the project, so hardware backends, policies
and bridges can depend on it without pulling in the edge or learner.
"""

from robot_rl.core.clock import Clock, VirtualClock, WallClock
from robot_rl.core.types import ActionChunk, Episode, Step

__all__ = ["ActionChunk", "Clock", "Episode", "Step", "VirtualClock", "WallClock"]
