"""Policies that emit action chunks: the ``ChunkPolicy`` protocol, the project's flow-matching
VLA (``policies.flow_vla``) and adapters for LeRobot policies (``policies.lerobot_adapter``).
Nothing here knows about transport."""

from policies.base import ChunkPolicy, InvalidChunkError, validate_chunk

__all__ = ["ChunkPolicy", "InvalidChunkError", "validate_chunk"]
