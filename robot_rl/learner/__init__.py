"""The learner: replay store (exactly-once, LeRobotDataset v3), trainer loop, and the wire service.

Module map: config (dataclasses mirrored by configs/learner), ledger + store (what is
stored, once), index (in-memory sampling streams), algorithms (one update), trainer
(the loop), checkpoint (atomic, exact resume), publisher (weights snapshots), service
(sockets + threads), local (learner + simulated robots in one process).
"""

from robot_rl.learner.config import LearnerConfig, ServiceConfig, StoreConfig, TrainerConfig

__all__ = ["LearnerConfig", "ServiceConfig", "StoreConfig", "TrainerConfig"]
