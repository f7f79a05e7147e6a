"""The data every part of robot_rl exchanges: Steps, Episodes and ActionChunks.

Units follow LeRobot's SO-101 convention everywhere: arm joints in degrees, the
gripper in 0..100 (0 closed, 100 open). Arrays are float32; images are uint8 HxWx3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ActionChunk:
    """H future actions predicted from one observation.

    ``request_tick`` is the control tick at which the observation was taken;
    ``delay_ticks`` the delay estimate d used to roll the state forward;
    ``rolled_state`` the state that was given to the policy (None in modes that
    do not roll forward).
    """

    actions: np.ndarray  # [H, action_dim]
    chunk_id: int
    policy_version: int
    request_tick: int
    delay_ticks: int = 0
    rolled_state: np.ndarray | None = None
    inference_s: float = 0.0

    def __post_init__(self) -> None:
        self.actions = np.asarray(self.actions, dtype=np.float32)

    @property
    def horizon(self) -> int:
        return int(self.actions.shape[0])


@dataclass
class Step:
    """What happened at one control tick. Recorded for every tick, stalls included."""

    tick: int
    time_s: float
    state: np.ndarray  # measured joint state before the action
    action: np.ndarray  # action actually sent (after clamps/clipping)
    images: dict[str, np.ndarray] = field(default_factory=dict)
    instruction: str = ""
    policy_action: np.ndarray | None = None  # what the policy wanted, before clamps
    is_intervention: bool = False
    reward: float = 0.0
    done: bool = False
    success: bool = False
    policy_version: int = -1
    chunk_id: int = -1
    chunk_index: int = -1
    delay_ticks: int = 0
    rolled_state: np.ndarray | None = None
    stall: bool = False
    lateness_s: float = 0.0
    scene_seed: int = -1  # the sim seed that set the episode's scene up; -1: a real scene (no seed re-creates it)


@dataclass
class Episode:
    """One attempt at one instruction by one robot."""

    robot_id: str
    episode_id: int
    instruction: str
    task_family: str = ""
    steps: list[Step] = field(default_factory=list)
    success: bool = False
    seed: int | None = None

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def intervention_steps(self) -> int:
        return sum(1 for s in self.steps if s.is_intervention)

    @property
    def stall_steps(self) -> int:
        return sum(1 for s in self.steps if s.stall)
