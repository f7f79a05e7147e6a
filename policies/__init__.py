"""Policies that emit action chunks: the ``ChunkPolicy`` protocol, the project's flow-matching
VLA (``robot_rl.policies.flow_vla``) and adapters for LeRobot policies (``robot_rl.policies.lerobot_adapter``).
Nothing here knows about transport."""

from robot_rl.policies.base import ChunkPolicy, InvalidChunkError, validate_chunk

__all__ = ["ChunkPolicy", "InvalidChunkError", "validate_chunk"]
