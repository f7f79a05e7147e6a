"""The learning algorithms' own settings, one dataclass per algorithm, chosen by name.

``learner/algorithm=rwr`` (or a recipe, ``learner=rwr``, whose defaults pick it) puts an
``RWRConfig`` at ``learner.algorithm``; ``ALGORITHMS.build(config, policy, trainer_config,
device)`` makes the algorithm it names. The settings every algorithm shares (optimiser, batch
mixing, rewards) are the trainer's (``robot_rl.learner.config.TrainerConfig``).

Importing this module imports no torch: reading a config stays fast, and an edge PC can
check a learner config it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from robot_rl.core.registry import Registry
from robot_rl.learner.streams import STREAMS

ALGORITHMS: Registry[Any] = Registry("learning algorithm", group="learner/algorithm")

STALENESS_MODES = ("drop", "downweight")


@dataclass
class StalenessConfig:
    """How much a sample made by an old policy version may still count (``robot_rl.learner.staleness``)."""

    # K: policy versions a sample may lag without penalty (a publish every <= 30 s); None = unbounded.
    # A kept step is an autonomous success, still a good example some versions later; K 5 had
    # left the learner only the last ~2.5 min of them (mean staleness ~13 late in a 10-min arm;
    # BENCHMARKS.md "learning").
    max_staleness: int | None = 20
    mode: str = "downweight"  # beyond K: "drop" (weight 0) | "downweight" (decay ** (staleness - K))
    decay: float = 0.5
    streams: tuple[str, ...] = ("online",)  # streams the bound applies to (the policy's own actions)

    def __post_init__(self) -> None:
        self.streams = tuple(self.streams)
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"StalenessConfig: max_staleness must be >= 0 or None, got {self.max_staleness}")
        if self.mode not in STALENESS_MODES:
            raise ValueError(f"StalenessConfig: mode must be one of {STALENESS_MODES}, got {self.mode!r}")
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"StalenessConfig: decay must be in [0, 1], got {self.decay}")
        unknown = sorted(set(self.streams) - set(STREAMS))
        if unknown:
            raise ValueError(f"StalenessConfig: unknown stream(s) {unknown}; streams are {STREAMS}")


FAILURE_MODES = ("drop", "downweight", "keep")
RWR_SCORES = ("episode_return", "return_to_go")


def check_failures_mode(owner: str, failures: str) -> None:
    if failures not in FAILURE_MODES:
        raise ValueError(f"{owner}: failures must be one of {FAILURE_MODES}, got {failures!r}")


def check_min_confidence(owner: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}: min_detector_confidence must be in [0, 1], got {value}")


@ALGORITHMS.register("bc", builder="robot_rl.learner.algorithms.bc:WeightedBC")
@dataclass
class WeightedBCConfig:
    """``bc``: weighted behaviour cloning on the mixed replay; the trainer's settings are all it needs."""


@ALGORITHMS.register("rwr", builder="robot_rl.learner.algorithms.rwr:RWR")
@dataclass
class RWRConfig:
    """``rwr``: reward-weighted regression on the flow-matching loss (Hi-ORS): failed online episodes
    rejected, human corrections weighted up, the rest weighted by exp(R / beta)."""

    beta: float = 0.5  # temperature of exp(R / beta); smaller = greedier
    # R: "episode_return" (RWR: whole rollouts weighted by their return) | "return_to_go" (the step's).
    score: str = "episode_return"
    max_weight: float = 10.0  # clip, in units of the mean weight
    failures: str = "drop"  # online steps of failed episodes: "drop" (rejection sampling) | "downweight" | "keep"
    failure_weight: float = 0.1  # multiplier when failures: downweight
    # Human corrections count this much more (2.0 cost success: BENCHMARKS.md "learning").
    intervention_weight: float = 1.0
    demonstration_weight: float = 1.0
    drop_unfinished: bool = True  # online steps of episodes whose outcome is not known (yet, or ever)
    # A success detector's verdict weighs its episode's online steps by its confidence (0.5..1); below
    # this it is left out (0.5: none is; e.g. 0.9 keeps only the sure ones).
    min_detector_confidence: float = 0.5
    # Online steps after which the operator had to take over count as failed even when the
    # operator then finished the task (True); False credits them with the rescued success.
    rescued_is_failure: bool = True
    # Streams whose samples are weighted by exp(R / beta); the others (corrections and
    # demonstrations: expert labels) by their stream multiplier alone.
    score_streams: tuple[str, ...] = ("online",)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)

    def __post_init__(self) -> None:
        self.score_streams = tuple(self.score_streams)
        unknown = sorted(set(self.score_streams) - set(STREAMS))
        if unknown:
            raise ValueError(f"RWRConfig: score_streams {unknown} unknown; streams are {list(STREAMS)}")
        if self.score not in RWR_SCORES:
            raise ValueError(f"RWRConfig: score must be one of {RWR_SCORES}, got {self.score!r}")
        check_failures_mode("RWRConfig", self.failures)
        if self.beta <= 0 or self.max_weight <= 0:
            raise ValueError(f"RWRConfig: beta and max_weight must be > 0, got {self.beta}, {self.max_weight}")
        if min(self.failure_weight, self.intervention_weight, self.demonstration_weight) < 0:
            raise ValueError("RWRConfig: stream and failure weights must be >= 0")
        check_min_confidence("RWRConfig", self.min_detector_confidence)


@dataclass
class RejectionConfig:
    """Which online steps the policy may imitate at all (Hi-ORS's rejection stage), for awr and rl.

    A critic's weights are learned: until it is accurate, a failed attempt's steps still get
    weights near 1 and the policy imitates its own failures (BENCHMARKS.md, "learning"). The
    critics themselves still learn from every step; this only gates the imitation terms.
    ``failures: keep`` restores the plain algorithm.
    """

    failures: str = "drop"  # online steps of failed (or rescued) episodes: drop | downweight | keep
    failure_weight: float = 0.1  # multiplier when failures: downweight
    rescued_is_failure: bool = True  # a takeover makes the policy's steps before it a failure
    # A success detector's verdict weighs its episode's online steps by its confidence (0.5..1); below
    # this they are not imitated (0.5: every verdict counts).
    min_detector_confidence: float = 0.5

    def __post_init__(self) -> None:
        check_failures_mode("RejectionConfig", self.failures)
        check_min_confidence("RejectionConfig", self.min_detector_confidence)
        if self.failure_weight < 0:
            raise ValueError(f"RejectionConfig: failure_weight must be >= 0, got {self.failure_weight}")


@ALGORITHMS.register("awr", builder="robot_rl.learner.algorithms.awr:AWR")
@dataclass
class AWRConfig:
    """``awr``: advantage-weighted regression with a value critic over chunk boundaries: weights
    clip(exp(A / beta)), A from a Monte-Carlo / TD mix of chunk-level targets."""

    beta: float = 1.0  # temperature of exp(A / beta)
    max_weight: float = 20.0  # w_max of the AWR paper
    normalize_advantages: bool = True  # standardise A over the batch, so beta does not depend on reward scale
    mc_mix: float = 0.5  # share of the Monte-Carlo return in the value target (1 = pure MC, 0 = pure TD)
    critic_lr: float = 3e-4
    critic_hidden: int = 256
    critic_depth: int = 2
    tau: float = 0.01  # Polyak rate of the target value network
    # Failed online attempts are not imitated at all (the critic still learns from them).
    rejection: RejectionConfig = field(default_factory=RejectionConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)

    def __post_init__(self) -> None:
        if self.beta <= 0 or self.max_weight <= 0:
            raise ValueError(f"AWRConfig: beta and max_weight must be > 0, got {self.beta}, {self.max_weight}")
        if not 0.0 <= self.mc_mix <= 1.0 or not 0.0 < self.tau <= 1.0:
            raise ValueError(f"AWRConfig: mc_mix must be in [0, 1] and tau in (0, 1], got {self.mc_mix}, {self.tau}")


@ALGORITHMS.register("rl", builder="robot_rl.learner.algorithms.rl:ChunkQLearning")
@dataclass
class RLConfig:
    """``rl``: off-policy actor-critic: a Q-chunking critic (chunked H-step backups, clipped double Q)
    with best-of-N sampling from the flow policy distilled back into it (PA-RL)."""

    # N chunks sampled from the flow policy per state. 2 rather than 4 buys 1.4x the updates on a
    # CPU learner; with 4 and distill_weight 1.0 rl scored below no learning held-out (0.8 updates/s,
    # 55 %), with 2 and 0.25 above it (1.1/s, 77.5 %; one run each, the two changes not separated:
    # BENCHMARKS.md "learning").
    num_candidates: int = 2
    # FlowVLA's Euler steps per candidate (None: the policy's own; a LeRobot flow policy integrates its
    # config's num_steps). Sampling 2 x N x B chunks is most of an update's cost on a CPU learner:
    # 10 steps and N = 8 made it 14x slower than rwr.
    candidate_integration_steps: int | None = 5
    include_data_chunk: bool = True  # the recorded chunk competes too (a human correction may be best)
    ensemble_size: int = 2  # clipped double Q
    critic_lr: float = 3e-4
    critic_hidden: int = 256
    critic_depth: int = 2
    tau: float = 0.005  # Polyak rate of the target critics
    bc_weight: float = 1.0  # flow-matching loss on the recorded chunk: the anchor to the data
    # Flow-matching loss on the best-of-N chunk: the improvement. A quarter of the anchor's: the
    # critic that picks it is minutes old.
    distill_weight: float = 0.25
    warmup_updates: int = 50  # critic-only updates before its choices are distilled
    # The anchor imitates only what worked: failed online attempts are rejected (the critic
    # and the best-of-N distillation still see every state).
    rejection: RejectionConfig = field(default_factory=RejectionConfig)
    # Bounds the behaviour-cloning term only: the critic is off-policy by construction.
    staleness: StalenessConfig = field(default_factory=StalenessConfig)

    def __post_init__(self) -> None:
        if self.num_candidates < 1 or self.ensemble_size < 1:
            raise ValueError(f"RLConfig: num_candidates and ensemble_size must be >= 1, "
                             f"got {self.num_candidates}, {self.ensemble_size}")
        if self.candidate_integration_steps is not None and self.candidate_integration_steps < 1:
            raise ValueError(f"RLConfig: candidate_integration_steps must be >= 1 or null, "
                             f"got {self.candidate_integration_steps}")
        if not 0.0 < self.tau <= 1.0 or min(self.bc_weight, self.distill_weight) < 0:
            raise ValueError("RLConfig: tau must be in (0, 1] and the loss weights >= 0")
