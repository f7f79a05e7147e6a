"""Learner settings in plain types, so ``configs/learner/*.yaml`` can mirror them field by field.

Three groups, one per job: where the replay store lives and how it samples
(``StoreConfig``), how the trainer updates and publishes (``TrainerConfig``), and
where the service listens (``ServiceConfig``). ``LearnerConfig`` bundles them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from robot_rl.learner.rewards import RewardConfig

STREAMS = ("online", "intervention", "demonstration")


@dataclass
class StoreConfig:
    """The replay store: a LeRobotDataset v3 on disk plus an in-memory sampling index."""

    root: str = "outputs/learner/store"
    repo_id: str = "local/robot_rl_replay"
    fps: int = 30
    joint_names: tuple[str, ...] = (
        "shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
    cameras: tuple[str, ...] = ("front", "wrist")
    image_height: int = 96
    image_width: int = 96
    # Recorded demonstrations (a LeRobotDataset v3 dir) preloaded into the demonstration stream.
    demonstrations: str | None = None
    demonstrations_repo_id: str = "local/robot_rl"
    # An open episode that receives nothing for this long is stored as truncated.
    episode_timeout_s: float = 300.0
    # Write finished episodes on a background thread (True) or inline (False: tests, tools).
    background_commit: bool = True
    # Nice value added to that thread (image encoding for the dataset): > 0 where robots share
    # the CPU (`robot-rl run`, `bench learning`), so their control ticks are served first.
    commit_nice: int = 0
    # Closed episodes already queued for the writer share one dataset open/finalize (re-opening
    # a LeRobotDataset costs ~2 s of the ~6 s an episode takes); they stay staged until that
    # finalize, so a crash loses none of them. 1 = finalize after every episode.
    commit_batch: int = 8
    # A writer that is keeping up waits this long after an episode for more to join its batch
    # (flush and close do not wait). Finalizing and re-opening the dataset for every episode, as
    # it did when episodes trickled in one at a time, was ~half of the writer's hold on the GIL
    # the trainer shares (BENCHMARKS.md "store"). 0 = write whatever is queued at once.
    commit_linger_s: float = 30.0
    # Where LeRobot's writer runs: "process" (its own, so it never holds the GIL the trainer and
    # the robots share: 4.8 instead of 4.0 updates/s in a 3-minute `robot-rl run`, 5.4 with no
    # writing at all; BENCHMARKS.md "store") or "thread" (in the learner's process: tools, tests).
    writer: str = "process"

    def __post_init__(self) -> None:
        self.joint_names = tuple(self.joint_names)
        self.cameras = tuple(self.cameras)
        if self.writer not in ("thread", "process"):
            raise ValueError(f"StoreConfig: writer must be 'thread' or 'process', got {self.writer!r}")
        if self.commit_batch < 1:
            raise ValueError(f"StoreConfig: commit_batch must be >= 1, got {self.commit_batch}")
        if self.commit_linger_s < 0:
            raise ValueError(f"StoreConfig: commit_linger_s must be >= 0, got {self.commit_linger_s}")
        if not 0 <= self.commit_nice <= 19:
            raise ValueError(f"StoreConfig: commit_nice must be in 0..19, got {self.commit_nice}")
        if self.fps <= 0 or self.image_height <= 0 or self.image_width <= 0:
            raise ValueError(f"StoreConfig: fps and image size must be > 0, got fps={self.fps}, "
                             f"image={self.image_height}x{self.image_width}")
        if not self.joint_names:
            raise ValueError("StoreConfig: joint_names must name at least one joint")

    @property
    def camera_shapes(self) -> dict[str, tuple[int, int]]:
        return {cam: (self.image_height, self.image_width) for cam in self.cameras}


@dataclass
class TrainerConfig:
    """The update loop: batch mixing, optimiser, publishing and checkpoint cadence."""

    algorithm: str = "bc"
    batch_size: int = 32
    lr: float = 1e-4
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    # Publish and checkpoint an exponential moving average of the weights with this decay
    # (robot_rl.learner.averaging); None: the training weights themselves.
    ema_decay: float | None = None
    # Share of each batch drawn from each stream (renormalised over the non-empty ones).
    # Demonstration-heavy: a few dozen online successes at 50 % are memorised and cost success.
    online_ratio: float = 0.2
    intervention_ratio: float = 0.1
    demonstration_ratio: float = 0.7
    min_steps_to_train: int = 64  # wait (idle, not blocking ingest) until the store holds this many steps
    max_updates: int | None = None  # None: train until stopped
    publish_every_updates: int = 50
    publish_every_s: float = 30.0
    transfer_dtype: str = "float32"  # weights on the wire: float32, float16 or bfloat16
    checkpoint_dir: str = "outputs/learner/checkpoints"
    checkpoint_every_updates: int = 500
    keep_checkpoints: int = 3
    seed: int = 0
    device: str = "auto"  # "auto": CUDA when present, else CPU
    # The algorithm's own settings (fields of RWRConfig / AWRConfig / RLConfig; nested ``staleness: {...}``).
    algorithm_params: dict[str, Any] = field(default_factory=dict)
    # Fields of robot_rl.learner.rewards.RewardConfig: discount, success/failure reward, shaping, takeover penalty.
    rewards: dict[str, Any] = field(default_factory=dict)
    # TensorBoard event files. None: "<parent of checkpoint_dir>/tensorboard"; "" turns file logging off.
    log_dir: str | None = None
    log_every_updates: int = 10
    wandb_project: str | None = None  # also log to Weights & Biases (needs the wandb package); None = off
    # Nice value added to the training thread (and the intra-op threads it starts): > 0 where
    # robots share the CPU, so training takes only the cycles their control loops leave.
    thread_nice: int = 0

    def __post_init__(self) -> None:
        self.algorithm_params = dict(self.algorithm_params or {})
        self.rewards = dict(self.rewards or {})
        self.reward_config()  # a typo in ``rewards`` fails here, at start, not at the first batch
        if not 0 <= self.thread_nice <= 19:
            raise ValueError(f"TrainerConfig: thread_nice must be in 0..19, got {self.thread_nice}")
        if self.log_every_updates < 1:
            raise ValueError(f"TrainerConfig: log_every_updates must be >= 1, got {self.log_every_updates}")
        ratios = (self.online_ratio, self.intervention_ratio, self.demonstration_ratio)
        if min(ratios) < 0 or sum(ratios) <= 0:
            raise ValueError(f"TrainerConfig: stream ratios must be >= 0 with a positive sum, got {ratios}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"TrainerConfig: ema_decay must be in (0, 1) or null, got {self.ema_decay}")
        if self.batch_size < 1:
            raise ValueError(f"TrainerConfig: batch_size must be >= 1, got {self.batch_size}")
        if self.publish_every_updates < 1 or self.checkpoint_every_updates < 1:
            raise ValueError("TrainerConfig: publish_every_updates and checkpoint_every_updates must be >= 1")

    @property
    def stream_ratios(self) -> dict[str, float]:
        return dict(zip(STREAMS, (self.online_ratio, self.intervention_ratio, self.demonstration_ratio), strict=True))

    def reward_config(self) -> RewardConfig:
        """``rewards`` as a RewardConfig (unknown keys are an error)."""
        from robot_rl.learner.rewards import RewardConfig

        return RewardConfig.from_dict(self.rewards)

    @property
    def tensorboard_dir(self) -> Path | None:
        """Where the learning metrics go (None: file logging is off)."""
        if self.log_dir == "":
            return None
        return Path(self.log_dir) if self.log_dir is not None else Path(self.checkpoint_dir).parent / "tensorboard"


@dataclass
class ServiceConfig:
    """Where the learner listens and whom it lets in."""

    router_endpoint: str = "tcp://127.0.0.1:5555"
    pub_endpoint: str = "tcp://127.0.0.1:5556"
    server_id: str = "learner"
    # CURVE: the learner's NAME.key_secret and a directory of robots' *.key files (both or neither).
    secret_key: str | None = None
    robot_keys_dir: str | None = None
    allow_insecure: bool = False
    heartbeat_interval_s: float = 1.0
    peer_timeout_s: float = 15.0
    status_every_s: float = 10.0  # log a one-line status this often


@dataclass
class HubConfig:
    """Pushing checkpoints and the replay store to the Hugging Face Hub (``robot_rl.learner.hub``); off by default."""

    enabled: bool = False
    checkpoints_repo_id: str | None = None  # model repo, e.g. "me/robot_rl-run1"; None: checkpoints stay local
    store_repo_id: str | None = None  # dataset repo for the replay store (LeRobotDataset v3); None: not pushed
    every_checkpoints: int = 1  # push after this many new checkpoints (0: only by time)
    every_minutes: float = 30.0  # ... or this long after the last attempt (0: only by count)
    private: bool = True  # repos created by the learner are private
    token: str | None = None  # None: HF_TOKEN or `huggingface-cli login`
    poll_s: float = 5.0  # how often the pusher thread looks at the schedule

    def __post_init__(self) -> None:
        if self.enabled and not (self.checkpoints_repo_id or self.store_repo_id):
            raise ValueError("HubConfig: hub.enabled needs hub.checkpoints_repo_id and/or hub.store_repo_id")
        if self.every_checkpoints < 0 or self.every_minutes < 0 or (self.every_checkpoints == 0 and
                                                                   self.every_minutes == 0):
            raise ValueError(f"HubConfig: every_checkpoints ({self.every_checkpoints}) and every_minutes "
                             f"({self.every_minutes}) must be >= 0 and not both 0")


@dataclass
class LearnerConfig:
    """Everything ``robot-rl learner`` needs besides the policy config."""

    store: StoreConfig = field(default_factory=StoreConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    # Initial weights: a FlowVLA checkpoint dir (save_pretrained layout); None = fresh init.
    init_checkpoint: str | None = None


def learner_config_from(node: object) -> LearnerConfig:
    """Build a ``LearnerConfig`` from the composed ``learner`` group (None -> defaults).

    Each sub-group goes through ``robot_rl.config.to_dataclass``, so an unknown key
    (a typo in YAML or on the command line) is refused with the list of known fields.
    """
    from omegaconf import DictConfig, OmegaConf

    from robot_rl.config import ConfigError, to_dataclass

    raw = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    unknown = sorted(set(raw) - {"store", "trainer", "service", "hub", "init_checkpoint", "_name"})
    if unknown:
        raise ConfigError(f"learner config has unknown key(s) {unknown}; "
                          "known: store, trainer, service, hub, init_checkpoint")
    try:
        return LearnerConfig(
            store=to_dataclass(raw.get("store"), StoreConfig),
            trainer=to_dataclass(raw.get("trainer"), TrainerConfig),
            service=to_dataclass(raw.get("service"), ServiceConfig),
            hub=to_dataclass(raw.get("hub"), HubConfig),
            init_checkpoint=raw.get("init_checkpoint"),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
