"""The learner: replay store (exactly-once, LeRobotDataset v3), trainer loop, and the wire service.

Module map: config (every learner setting, typed; ``configs/learner`` holds recipes), ledger +
store (what is stored, once; its stages in open_episodes, index_feed, commit and recovery), index
(in-memory sampling streams), rewards and staleness (the learning signal), algorithms (one update
each, chosen by ``learner/algorithm``), trainer (the loop), checkpoint (atomic, exact resume),
publisher (weights snapshots), service (sockets + threads), ddp (data-parallel ranks).
"""

from robot_rl.learner.config import LearnerConfig, ServiceConfig, StoreConfig, TrainerConfig

__all__ = ["LearnerConfig", "ServiceConfig", "StoreConfig", "TrainerConfig"]
