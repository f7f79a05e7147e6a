"""Learner settings: every one a typed field with its default and its comment, here and nowhere else.

One group per job: where the replay store lives and how it samples (``StoreConfig``), how
the trainer updates and publishes (``TrainerConfig``, with the ``RewardConfig`` its batches
are scored by), where the service listens (``ServiceConfig``) and what it pushes to the Hub
(``HubConfig``). ``LearnerConfig`` bundles them with the learning algorithm's own config,
chosen by name (``learner/algorithm=rwr``; ``robot_rl.learner.algorithms.config``).
``configs/learner/*.yaml`` hold only recipes: an algorithm and what differs from these defaults.

Nothing here imports torch, so a command reads and checks its config in a moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from robot_rl.bridges.zmq.admission import PeerLimits
from robot_rl.data.frame_storage import FrameStorageConfig
from robot_rl.learner.algorithms.config import ALGORITHMS, WeightedBCConfig
from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.streams import STREAMS


@dataclass
class RewardConfig:
    """How an episode's columns become rewards (``robot_rl.learner.rewards``). Discounting is per control tick."""

    gamma: float = 0.99  # discount per control tick
    success_reward: float = 1.0  # at the first step where ``success`` is True
    failure_reward: float = 0.0  # at the last step of a finished episode without success
    # The sim's progress (the recorded ``reward`` column) as potential-based shaping; 0 = sparse task reward only.
    dense_scale: float = 0.0
    # Total penalty per human takeover (RLIF), shared by the policy-driven steps just before it.
    intervention_penalty: float = 1.0
    # How many steps before a takeover share the penalty: the mistake that made the person
    # take over happened a reaction time (~0.5 s = 15 ticks at 30 fps) before the takeover.
    penalty_window: int = 15

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"RewardConfig: gamma must be in [0, 1], got {self.gamma}")
        if self.penalty_window < 1:
            raise ValueError(f"RewardConfig: penalty_window must be >= 1, got {self.penalty_window}")
        if self.intervention_penalty < 0:
            raise ValueError("RewardConfig: intervention_penalty is a magnitude and must be >= 0 "
                             f"(it is subtracted), got {self.intervention_penalty}")


@dataclass
class StoreConfig:
    """The replay store: a LeRobotDataset v3 on disk plus an in-memory sampling index."""

    root: str = "outputs/learner/store"  # the dataset, its ledger and the staged episodes
    repo_id: str = "local/robot_rl_replay"  # the dataset's LeRobot repo id
    # What each recorded step holds: the robots' control rate, joints and camera frames. null =
    # the first robot's hello says (robot_rl.learner.layout; kept in ROOT/layout.json), so the
    # learner needs no robot settings; a value pins that field and refuses robots that differ.
    fps: int | None = None
    joint_names: tuple[str, ...] | None = None
    cameras: tuple[str, ...] | None = None
    image_height: int | None = None
    image_width: int | None = None
    # Recorded demonstrations (a LeRobotDataset v3 dir) preloaded into the demonstration stream.
    demonstrations: str | None = None
    demonstrations_repo_id: str = "local/robot_rl"  # the repo id those demonstrations were recorded under
    # An open episode that receives nothing for this long is stored as truncated.
    episode_timeout_s: float = 300.0
    # Bytes of one robot's segments staged and not yet in the dataset (its open episode and those the
    # writer has not reached). Past it its segments are refused, not acked: they wait in its spool
    # (link.spool_max_bytes, the same 4 GiB) until the writer catches up, so a robot that never ends an
    # episode, or a writer that cannot write, does not fill the learner's disk. ~7 h of a robot with two
    # 96x96 cameras at 30 fps; an episode larger than this is stored in pieces (episode_timeout_s).
    max_staged_bytes_per_robot: int = 4 << 30
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
    # How camera frames are stored: PNG for small frames, LeRobot's video encoding for camera-size
    # ones (640x480: PNG would need ~70 ms of a core a frame). A store that exists keeps its layout.
    frames: FrameStorageConfig = field(default_factory=FrameStorageConfig)
    # MB of camera frames the sampling index keeps in memory (at the policy's input size); past it the
    # oldest stored episodes' frames are read back from the dataset when sampled (robot_rl.learner.index).
    # None: an eighth of the machine's RAM (3 GB of 24), leaving the rest to the model, the writer and robots.
    index_memory: float | None = None
    # MB of local disk (under root, emptied at each start) where frames that leave the index's memory are
    # kept at the policy's input size and read back without decoding (robot_rl.learner.frame_spill); past
    # it, the oldest stored episodes' frames are decoded from the dataset instead. None: a quarter of the
    # disk's free space at start; 0: no spill.
    index_spill: float | None = None
    # Worker processes reading frames back from the dataset (video decoding holds a core); 0: on the
    # trainer's thread.
    index_read_workers: int = 2

    @property
    def dataset_root(self) -> Path:
        """The LeRobotDataset the store writes its episodes into."""
        return Path(self.root) / "dataset"

    def index_memory_bytes(self) -> int:
        """``index_memory`` in bytes, the default worked out from this machine's RAM."""
        if self.index_memory is not None:
            return int(self.index_memory * (1 << 20))
        import psutil  # a dependency of the package; imported here so reading a config stays light

        return int(psutil.virtual_memory().total // 8)

    def index_spill_bytes(self, free_disk_bytes: int) -> int:
        """``index_spill`` in bytes, the default a quarter of ``free_disk_bytes`` (the root's disk)."""
        if self.index_spill is not None:
            return int(self.index_spill * (1 << 20))
        return free_disk_bytes // 4

    def __post_init__(self) -> None:
        if self.index_memory is not None and self.index_memory < 0:
            raise ValueError(f"StoreConfig: index_memory must be >= 0 MB or null, got {self.index_memory}")
        if self.index_spill is not None and self.index_spill < 0:
            raise ValueError(f"StoreConfig: index_spill must be >= 0 MB or null, got {self.index_spill}")
        if self.index_read_workers < 0:
            raise ValueError(f"StoreConfig: index_read_workers must be >= 0, got {self.index_read_workers}")
        self.joint_names = tuple(self.joint_names) if self.joint_names is not None else None
        self.cameras = tuple(self.cameras) if self.cameras is not None else None
        if self.writer not in ("thread", "process"):
            raise ValueError(f"StoreConfig: writer must be 'thread' or 'process', got {self.writer!r}")
        if self.max_staged_bytes_per_robot < 1:
            raise ValueError(f"StoreConfig: max_staged_bytes_per_robot must be >= 1, "
                             f"got {self.max_staged_bytes_per_robot}")
        if self.commit_batch < 1:
            raise ValueError(f"StoreConfig: commit_batch must be >= 1, got {self.commit_batch}")
        if self.commit_linger_s < 0:
            raise ValueError(f"StoreConfig: commit_linger_s must be >= 0, got {self.commit_linger_s}")
        if not 0 <= self.commit_nice <= 19:
            raise ValueError(f"StoreConfig: commit_nice must be in 0..19, got {self.commit_nice}")
        if any(v is not None and v <= 0 for v in (self.fps, self.image_height, self.image_width)):
            raise ValueError(f"StoreConfig: fps and image size must be > 0, got fps={self.fps}, "
                             f"image={self.image_height}x{self.image_width}")
        if self.joint_names is not None and not self.joint_names:
            raise ValueError("StoreConfig: joint_names must name at least one joint")


MATMUL_PRECISIONS = ("highest", "high", "medium")


class Parallelism(StrEnum):
    """How the ranks of a learner under ``torchrun`` share the model."""

    ddp = "ddp"  # every rank holds the whole model, its gradients and optimiser state (robot_rl.learner.ddp)
    # each rank holds 1/N of them and gathers a layer's weights while it computes (torch's FSDP2,
    # robot_rl.learner.fsdp): for a model that does not fit one device with its optimiser state
    fsdp = "fsdp"


@dataclass
class FamilyBalanceConfig:
    """Each task family an equal share of every batch (``robot_rl.learner.family_balance``), whatever
    each family's share of the stored steps."""

    enabled: bool = True


@dataclass
class TrainerConfig:
    """The update loop: batch mixing, optimiser, publishing and checkpoint cadence.

    The algorithm that makes each update is chosen beside it (``LearnerConfig.algorithm``).
    """

    batch_size: int = 32
    lr: float = 1e-4
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    # A batch whose loss or gradient is NaN/inf is skipped (nothing changes); this many in a row stop
    # training with an error: the stored data or the learning rate is broken, and going on changes nothing.
    max_nonfinite_batches: int = 20
    # Publish and checkpoint an exponential moving average of the weights with this decay
    # (robot_rl.learner.averaging); None: the training weights themselves.
    ema_decay: float | None = None
    # Share of each batch drawn from each stream (RLPD-style; renormalised over the non-empty
    # ones). Demonstration-heavy on purpose: a few dozen online successes drawn at RLPD's 50 %
    # are memorised within minutes and cost success (BENCHMARKS.md, "Which data helps"); their
    # share grows as they accumulate.
    online_ratio: float = 0.2
    intervention_ratio: float = 0.1
    demonstration_ratio: float = 0.7
    # Task families (pick, push, place, read from the instructions) in equal shares of each batch.
    family_balance: FamilyBalanceConfig = field(default_factory=FamilyBalanceConfig)
    min_steps_to_train: int = 64  # wait (idle, not blocking ingest) until the store holds this many steps
    max_updates: int | None = None  # None: train until stopped
    publish_every_updates: int = 50  # publish weights to the robots after this many updates ...
    publish_every_s: float = 30.0  # ... or this long after the last publish, whichever comes first
    # Weights on the wire: float32, float16 or bfloat16; "auto": the policy's own float type (a bf16
    # VLA travels in bf16, a float32 policy loses nothing).
    transfer_dtype: str = "auto"
    checkpoint_dir: str = "outputs/learner/checkpoints"
    checkpoint_every_updates: int = 500
    keep_checkpoints: int = 3  # older checkpoints are deleted
    seed: int = 0  # the algorithm's and the sampler's random generators
    device: str = "auto"  # "auto": CUDA when present, else CPU
    # Float32 matrix products on CUDA (torch.set_float32_matmul_precision): "high" runs them on
    # TF32 tensor cores (10-bit mantissa inputs, float32 sums), which a VLA's update is dominated
    # by; "highest" keeps full float32 products. The CPU is always full float32.
    matmul_precision: str = "high"
    # Under torchrun: ddp (the model whole on every rank) or fsdp (sharded over the ranks); one process ignores it.
    parallel: Parallelism = Parallelism.ddp
    # Discount, success/failure reward, shaping and takeover penalty the batches are scored with.
    rewards: RewardConfig = field(default_factory=RewardConfig)
    # TensorBoard event files. None: "<parent of checkpoint_dir>/tensorboard"; "" turns file logging off.
    log_dir: str | None = None
    log_every_updates: int = 10
    wandb_project: str | None = None  # also log to Weights & Biases (needs the wandb package); None = off
    # Nice value added to the training thread (and the intra-op threads it starts): > 0 where
    # robots share the CPU, so training takes only the cycles their control loops leave.
    thread_nice: int = 0

    def __post_init__(self) -> None:
        self.parallel = Parallelism(self.parallel)
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"TrainerConfig: matmul_precision must be one of {MATMUL_PRECISIONS}, "
                             f"got {self.matmul_precision!r}")
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

    @property
    def tensorboard_dir(self) -> Path | None:
        """Where the learning metrics go (None: file logging is off)."""
        if self.log_dir == "":
            return None
        return Path(self.log_dir) if self.log_dir is not None else Path(self.checkpoint_dir).parent / "tensorboard"


@dataclass
class ServiceConfig:
    """Where the learner listens and whom it lets in."""

    router_endpoint: str = "tcp://127.0.0.1:5555"  # segments in, acks and weight chunks out
    pub_endpoint: str = "tcp://127.0.0.1:5556"  # new-weights announcements
    server_id: str = "learner"
    # CURVE: the learner's NAME.key_secret (``robot-rl keys``) and a directory of the robots' public
    # *.key files allowed in (NAME.key may only speak as robot NAME); both or neither, required off loopback.
    secret_key: str | None = None
    robot_keys_dir: str | None = None
    allow_insecure: bool = False  # serve a non-loopback address without CURVE
    heartbeat_interval_s: float = 1.0
    peer_timeout_s: float = 15.0
    status_every_s: float = 10.0  # log a one-line status this often
    # Published versions kept fetchable besides pinned ones: what the fleet console can pin a robot or
    # roll the fleet back to. Each is held in memory at its published size (FlowVLA ~7 MB, SmolVLA ~0.9 GB).
    keep_weight_versions: int = 8
    # What one sender (a robot's CURVE key, else a connection) may cost: message rate, refused messages
    # before it is ignored for a cool-off, sessions per robot and in all (robot_rl.bridges.zmq.server).
    peer_limits: PeerLimits = field(default_factory=PeerLimits)


@dataclass
class ConsoleConfig:
    """The fleet console the learner serves (``robot_rl.learner.console``): a web page of every robot,
    every published version and the learning curve, updated live. Read-only unless a token is set."""

    enabled: bool = True
    # Loopback by default: the page shows the fleet to whoever reaches it. Off loopback only with
    # tls_cert and tls_key (or keep it here and tunnel: ssh -L 8765:127.0.0.1:8765 LEARNER_HOST).
    host: str = "127.0.0.1"
    port: int = 8765  # 0: any free port; a port in use falls back to a free one (the address is printed)
    # Controls (pause/resume training, pin a robot to a version, roll the fleet back) need the token in
    # this file (``robot-rl keys`` writes KEYS/console.token); None: the console is read-only.
    token_file: str | None = None
    tls_cert: str | None = None  # PEM certificate and key: serve https
    tls_key: str | None = None
    refresh_s: float = 1.0  # how often an open page gets the fleet's state

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"learner.console.port must be 0..65535, got {self.port}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("learner.console: https needs both tls_cert and tls_key")
        if not self.refresh_s > 0:
            raise ValueError(f"learner.console.refresh_s must be > 0, got {self.refresh_s}")


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

    # What the run calls this learner: each preset (configs/learner/NAME.yaml) sets its own name, so
    # hgdagger, which is bc on corrections and demonstrations, is not reported as bc; "" = the algorithm's.
    name: str = ""
    store: StoreConfig = field(default_factory=StoreConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # The learning algorithm's own config, chosen by the group learner/algorithm (bc | rwr | awr | rl,
    # robot_rl.learner.algorithms.config). Typed Any so the node can hold any algorithm's dataclass.
    algorithm: Any = field(default_factory=WeightedBCConfig)  # plain weighted behaviour cloning
    service: ServiceConfig = field(default_factory=ServiceConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    # The per-task success detector (robot_rl.learner.detector): learns from operators' verdicts and judges
    # the episodes nobody judged before they are stored (robot_rl.learner.judging; docs/success_detector.md).
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    # Initial weights: a checkpoint dir of the configured policy (FlowVLA or LeRobot layout); None: the policy group's
    # (``policy.path``, else a new model of ``policy.model``). ``robot-rl run`` sets its BC start here.
    init_checkpoint: str | None = None
    # Also serve chunks (serve.* settings) to robots with edge.inference_runner=remote, from a copy of
    # the published weights on the training device that takes each new version in place (robot-rl run
    # turns it on for its own robots with edge.inference_runner=remote).
    serve_policy: bool = False

    def __post_init__(self) -> None:
        if self.algorithm is None:
            raise ValueError(f"learner.algorithm: no algorithm chosen; choose one with learner/algorithm=NAME "
                             f"({' | '.join(ALGORITHMS.names())})")
        algorithm = ALGORITHMS.name_of(self.algorithm)  # no registered algorithm: fails here, not at the first update
        self.name = self.name or algorithm
