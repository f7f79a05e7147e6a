"""The data every part of robot_rl exchanges: Steps, Episodes and ActionChunks.

Units follow LeRobot's SO-101 convention everywhere: arm joints in degrees, the
gripper in 0..100 (0 closed, 100 open). Arrays are float32; images are uint8 HxWx3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np


class VerdictSource(StrEnum):
    """Who said whether an episode succeeded. An episode nobody judged has none (``UNJUDGED``)."""

    operator = "operator"
    task = "task"
    detector = "detector"


UNJUDGED = ""  # a step's ``success_source`` when nobody judged the episode (a real arm left alone)
# The sources as small integers, for datasets and batches (which hold numbers): index = code.
SUCCESS_SOURCES: tuple[str, ...] = (UNJUDGED, *(source.value for source in VerdictSource))


def source_code(source: str) -> int:
    """``success_source`` -> its code in ``SUCCESS_SOURCES``; ValueError for an unknown one."""
    try:
        return SUCCESS_SOURCES.index(source)
    except ValueError:
        raise ValueError(f"success_source {source!r} unknown; known {list(SUCCESS_SOURCES)}") from None


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
    # Who gave ``success`` (``VerdictSource``, or ``UNJUDGED``) and how sure they were (1 for a person or
    # the task, the detector's confidence, 0 when nobody judged). Like ``success``, the episode's verdict
    # is its last step's. The default is what a bare success flag always meant: the task's verdict.
    success_source: str = VerdictSource.task.value
    success_confidence: float = 1.0
    policy_version: int = -1
    chunk_id: int = -1
    chunk_index: int = -1
    delay_ticks: int = 0
    rolled_state: np.ndarray | None = None
    stall: bool = False
    lateness_s: float = 0.0
    scene_seed: int = -1  # the sim seed that set the episode's scene up; -1: a real scene (no seed re-creates it)


@dataclass(frozen=True)
class EpisodeVerdict:
    """Whether an episode succeeded, who said so and how sure: what its last step carries."""

    success: bool
    source: str  # a VerdictSource, or UNJUDGED
    confidence: float

    @staticmethod
    def of(steps: list[Step]) -> EpisodeVerdict:
        last = steps[-1]
        return EpisodeVerdict(bool(last.success), last.success_source, float(last.success_confidence))

    def apply(self, steps: list[Step]) -> None:
        """Put this verdict on the episode's last step (the steps are the learner's decoded copies)."""
        last = steps[-1]
        last.success, last.success_source, last.success_confidence = self.success, self.source, self.confidence


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
    # The operator was asked for the verdict because the learner's success detector was unsure of it.
    asked: bool = False

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def verdict_source(self) -> str:
        """Who judged the episode as stored (its last step's ``success_source``; ``UNJUDGED``: nobody)."""
        return self.steps[-1].success_source if self.steps else UNJUDGED

    @property
    def verdict_success(self) -> bool:
        """The verdict stored on its last step, which may differ from ``success`` where the sim knows better."""
        return bool(self.steps[-1].success) if self.steps else False

    @property
    def intervention_steps(self) -> int:
        return sum(1 for s in self.steps if s.is_intervention)

    @property
    def stall_steps(self) -> int:
        return sum(1 for s in self.steps if s.stall)


@dataclass(frozen=True)
class DetectorGuess:
    """The learner's success detector on an episode still running, judged from its frames so far: what
    the learner's acks bring back to the edge. A ``sure`` guess may stand in for a person's verdict."""

    episode_id: int
    success: bool
    confidence: float  # 0.5..1 (``robot_rl.learner.detector.Verdict``)
    sure: bool
