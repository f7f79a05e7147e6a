"""The edge runtime: one control loop per robot with asynchronous chunk inference.

Start with ``EdgeRuntime`` (runtime.py: a robot's node, learner link and recorder, wired once),
``EdgeNode`` (node.py) and ``EdgeConfig`` (config.py); the timing contract is node.py's module
docstring, the weight swap swap.py's.
"""

from robot_rl.core.motion_limits import JointDeltaClamp
from robot_rl.edge.action_queue import ActionQueue, QueuedAction
from robot_rl.edge.config import EdgeConfig, ModeRules
from robot_rl.edge.delay import DelayEstimator
from robot_rl.edge.inference import (
    InferenceRequest,
    InferenceResult,
    InferenceWorker,
    PolicyRunner,
    PolicySwap,
    ThreadedRunner,
    VirtualLatencyRunner,
    make_worker,
)
from robot_rl.edge.latency import LatencyModel
from robot_rl.edge.node import EdgeNode, EpisodeTask, at_tick
from robot_rl.edge.stats import ChunkRecord, EdgeStats

__all__ = [
    "ActionQueue",
    "ChunkRecord",
    "DelayEstimator",
    "EdgeConfig",
    "EdgeNode",
    "EdgeStats",
    "EpisodeTask",
    "InferenceRequest",
    "InferenceResult",
    "InferenceWorker",
    "JointDeltaClamp",
    "LatencyModel",
    "ModeRules",
    "PolicyRunner",
    "PolicySwap",
    "QueuedAction",
    "ThreadedRunner",
    "VirtualLatencyRunner",
    "at_tick",
    "make_worker",
]
