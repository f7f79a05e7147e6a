"""Each benchmark's own settings (``robot-rl bench NAME bench.KEY=VALUE``), in Hydra's ``bench`` group.

``robot-rl bench NAME`` composes the configuration with ``bench=NAME`` (``--quick``: the preset
``configs/bench/NAME_quick.yaml``, a smoke run that is not for BENCHMARKS.md), so a benchmark's
settings are typed and checked like every other: ``bench.arms=[rwr,awr]``, ``bench.swaps=20``.
The rest of the configuration (``edge.*``, ``learner.*`` ...) applies as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from robot_rl.bench.serve_config import ServeBenchConfig

BENCHMARKS_GROUP = "bench"
SYNTHETIC_EPISODE_STEPS = 300  # bench transport's and store's episodes: 10 s at 30 Hz


@dataclass
class SimBenchConfig:
    """``bench sim``: rendering, physics, the scripted expert, recording demonstrations."""

    episodes: int = 20  # expert episodes per task family
    demo_episodes: int = 40  # demonstrations recorded each way (one process; the sim in a child)


@dataclass
class AsyncBenchConfig:
    """``bench async``: sync vs async_naive vs async_rollforward under simulated inference latency."""

    episodes: int = 30  # per mode and latency (seeds.eval onwards)
    reaction_episodes: int = 12  # reaction-latency episodes (seeds.reaction onwards)
    realtime_episodes: int = 2  # wall-clock episodes per mode (seeds.realtime onwards)
    # Which cells: modes and variants (null: every one, robot_rl.bench.async_control.MODES and VARIANTS)
    # and simulated inference latencies.
    modes: list[str] | None = None
    latencies_ms: list[int] = field(default_factory=lambda: [0, 100, 200, 400])


@dataclass
class TransportBenchConfig:
    """``bench transport``: ingest steps/s and weight hot-swap latency, ZeroMQ against LeRobot's gRPC."""

    robots: list[int] = field(default_factory=lambda: [1, 4, 16])  # edge processes streaming at once
    sizes_mb: list[int] = field(default_factory=lambda: [10, 100, 1000])  # whole models swapped
    # A LoRA-style row: adapter_mb published on a frozen base of adapter_base_mb that never travels. 0: no row.
    adapter_mb: float = 10.0
    adapter_base_mb: float = 1000.0
    # Where the swapping edge runs inference and loads weights, side by side; the first is the "swap" rows.
    runners: list[str] = field(default_factory=lambda: ["process", "thread"])
    fanout_robots: list[int] = field(default_factory=lambda: [1, 4, 16])  # edge processes fetching each version
    fanout_mb: float = 10.0
    ingest_window_s: float = 6.0  # the store indexes every step in memory: keep it short
    swaps: int = 10
    swap_gap_s: float = 1.0  # between two publishes (the edge keeps ticking)
    swap_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.runners or any(r not in ("process", "thread") for r in self.runners):
            raise ValueError(f"bench transport: runners must be process and/or thread, got {self.runners}")


@dataclass
class RealtimeBenchConfig:
    """``bench realtime``: tick lateness of edge nodes on the wall clock beside a learner that trains."""

    duration_s: float = 600.0  # per runner, from the learner's first trained weights
    robots: int = 2  # edge processes
    swap_every_s: float = 10.0  # the learner publishes new weights this often (trainer.publish_every_s)
    # Where each edge runs inference and loads weights; one soak per entry, one after the other.
    runners: list[str] = field(default_factory=lambda: ["process", "thread"])
    # How each edge's control loop is scheduled, one soak per entry and runner: "realtime" (the edge's
    # defaults: SCHED_FIFO where permitted, the interpreter lock handed over every 1 ms), "normal"
    # (edge.realtime_priority=0 edge.switch_interval_ms=0: Linux's and Python's defaults).
    scheduling: list[str] = field(default_factory=lambda: ["realtime"])

    def __post_init__(self) -> None:
        if not self.runners or any(r not in ("process", "thread") for r in self.runners):
            raise ValueError(f"bench realtime: runners must be process and/or thread, got {self.runners}")
        if not self.scheduling or any(s not in ("realtime", "normal") for s in self.scheduling):
            raise ValueError(f"bench realtime: scheduling must be realtime and/or normal, got {self.scheduling}")
        if self.duration_s <= 0 or self.robots < 1 or self.swap_every_s <= 0:
            raise ValueError("bench realtime: duration_s and swap_every_s must be > 0, robots >= 1")


@dataclass
class FaultsBenchConfig:
    """``bench faults``: the fault suite (robot_rl/bench/faults.py says what each part does)."""

    robots: int = 2  # edges streaming through the fuzzing and the kills
    fuzz_messages: int = 12000  # malformed messages on each of the learner's sockets (ROUTER, PUB)
    impersonation_tries: int = 50  # rounds of three attempts to speak as robot-0
    kills: int = 5  # SIGKILLs of the learner mid-stream, each followed by a restart
    seconds_between_kills: float = 8.0  # the robots stream (and the trainer trains) between two kills
    edge_kills: int = 2  # SIGKILLs of a robot mid-episode, each followed by a restart on its spool
    network_cut_s: float = 30.0  # every robot's network down this long (0: no cut)
    episode_steps: int = 60  # 2 s episodes at 30 fps, 10-step segments
    flush_timeout_s: float = 300.0  # for the robots' last acks after the last restart
    max_restart_s: float = 10.0  # a restart slower than this fails the suite
    refused_segments: int = 8  # segments with a NaN reward a robot sends before its clean ones (refused_then_clean)
    flood_subscriptions: int = 40000  # subscriptions (of the longest topic taken) one peer sends on the weights socket
    max_flood_growth_mb: float = 50.0  # the learner's memory growth the flood may cause
    stale_hellos: int = 2000  # hellos under new ids from one connection, forgotten after the peer timeout
    # Damaged files run through the real learner and edge commands (names in bench/fault_corrupt.py's
    # VARIANTS, each a process start of ~15 s); empty: all of them.
    corrupt_variants: list[str] = field(default_factory=list)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.robots < 1 or self.fuzz_messages < 0 or self.kills < 0 or self.episode_steps < 10:
            raise ValueError("bench faults: robots >= 1, fuzz_messages and kills >= 0, episode_steps >= 10")
        if self.edge_kills < 0 or self.network_cut_s < 0:
            raise ValueError("bench faults: edge_kills and network_cut_s must be >= 0")
        if self.refused_segments < 0 or self.flood_subscriptions < 0 or self.stale_hellos < 0:
            raise ValueError("bench faults: refused_segments, flood_subscriptions and stale_hellos must be >= 0")
        if self.edge_kills and self.episode_steps < 40:
            raise ValueError("bench faults: killing a robot mid-episode needs episode_steps >= 40")


@dataclass
class StoreBenchConfig:
    """``bench store``: the learner's dataset writer, seconds per episode and the trainer it leaves."""

    episodes: int = 16
    batches: list[int] = field(default_factory=lambda: [1, 8])  # store.commit_batch settings, side by side
    writers: list[str] = field(default_factory=lambda: ["thread", "process"])  # store.writer, each with every batch
    episode_steps: int = SYNTHETIC_EPISODE_STEPS

    def __post_init__(self) -> None:
        if self.episodes < 1 or not self.batches or min(self.batches) < 1 or self.episode_steps < 1:
            raise ValueError(f"bench store: episodes, batches and episode_steps must be >= 1, got {self}")
        if not self.writers or any(w not in ("thread", "process") for w in self.writers):
            raise ValueError(f"bench store: writers must be thread and/or process, got {self.writers}")


def check_camera_image(image: list[int]) -> None:
    """``bench.image`` of the benches that store camera-size frames as video."""
    if len(image) != 2 or min(image) < 8 or any(v % 2 for v in image):
        raise ValueError(f"bench.image must be [height, width], even, >= 8 (video wants even sizes), got {image}")


@dataclass
class CamerasBenchConfig:
    """``bench cameras``: the store's writer fed real cameras' frames in real time, per image layout."""

    robots: int = 4
    image: list[int] = field(default_factory=lambda: [480, 640])  # height, width of both cameras
    layouts: list[str] = field(default_factory=lambda: ["video", "png"])  # learner.store.frames.images, side by side
    window_s: float = 120.0  # of robots in real time, per layout
    episode_s: float = 10.0  # each robot finishes an episode this often (300 steps at 30 Hz)
    commit_batch: int = 8  # episodes per dataset finalize, as learner.store.commit_batch
    drain_timeout_s: float = 300.0  # a sustained layout gets this long to write what is queued at the end
    small_image: int = 96  # the sim's frames, read back in each layout beside the camera size

    def __post_init__(self) -> None:
        if self.robots < 1 or self.commit_batch < 1 or self.small_image < 8:
            raise ValueError(f"bench cameras: robots and commit_batch must be >= 1, small_image >= 8, got {self}")
        check_camera_image(self.image)
        if not self.layouts or any(layout not in ("png", "video") for layout in self.layouts):
            raise ValueError(f"bench.layouts must be png and/or video, got {self.layouts}")
        if self.episode_s <= 0 or self.window_s < self.episode_s or self.drain_timeout_s < 0:
            raise ValueError(f"bench cameras: episode_s > 0 and window_s >= episode_s, got {self}")


@dataclass
class ReplanBenchConfig:
    """``bench replan``: held-out success of given weights at re-planning floors, paired."""

    weights: list[str] = field(default_factory=list)  # weights directories; empty: the shipped BC start
    floors: list[int] = field(default_factory=lambda: [0, 10])  # edge.min_request_threshold values
    episodes: int = 80  # held-out scenes per weights and floor

    def __post_init__(self) -> None:
        if not self.floors or min(self.floors) < 0:
            raise ValueError(f"bench.floors must be integers >= 0, got {self.floors}")
        if self.episodes < 1:
            raise ValueError(f"bench.episodes must be >= 1, got {self.episodes}")


@dataclass
class PoliciesBenchConfig:
    """``bench policies``: each policy type's parameters, learner updates/s, edge inference ms and
    publish bytes, full fine-tuning beside LoRA; whether an edge swaps its published weights in and
    ``rl`` updates it."""

    types: list[str] = field(default_factory=lambda: ["flow_vla", "act", "act+lora", "diffusion", "smolvla",
                                                      "smolvla+lora", "pi0", "pi05"])
    # The VLAs' backbones: SmolVLA's SmolVLM2-500M and pi0/pi0.5's PaliGemma at their real architectures
    # (random weights; full pi0 trains 3.2 B parameters, ~55 GB with Adam: a GPU's job), or "tiny"
    # stand-ins for a smoke run.
    vla_size: str = "full"
    lora_rank: int = 16  # LeRobot's default rank
    batch_size: int = 8  # learner batch of the timed updates
    updates: int = 5
    inferences: int = 10
    edge_ticks: int = 30  # the edge runs this many ticks before the swap (a second at 30 fps), and on after it

    def __post_init__(self) -> None:
        if self.vla_size not in ("full", "tiny"):
            raise ValueError(f"bench.vla_size must be full or tiny, got {self.vla_size!r}")
        if min(self.lora_rank, self.batch_size, self.updates, self.inferences, self.edge_ticks) < 1:
            raise ValueError("bench.lora_rank, batch_size, updates, inferences and edge_ticks must be >= 1")


@dataclass(frozen=True)
class Arm:
    """One side of ``bench learning``: which learner preset, whether it trains, operator on/off, sync or async."""

    learner: str  # the ``learner=`` preset
    train: bool = True
    operator: bool = True
    sync: bool = False


ARMS: dict[str, Arm] = {
    "none": Arm("rwr", train=False),
    "rwr": Arm("rwr"),
    "awr": Arm("awr"),
    "rl": Arm("rl"),
    "hgdagger": Arm("hgdagger"),
    "rwr_no_intervention": Arm("rwr", operator=False),
    "rwr_sync": Arm("rwr", sync=True),
    "hgdagger_sync": Arm("hgdagger", sync=True),
}


@dataclass
class LearningBenchConfig:
    """``bench learning``: the algorithms side by side, and the async learner against a sync loop
    (the arms and the measures: ``robot_rl.bench.learning``)."""

    minutes_per_arm: float = 6.0  # wall-clock (robot) time of each arm
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    num_robots: int = 2
    window: int = 20  # episodes in the rolling success rate
    sync_collect_episodes: int = 4  # sync arms: episodes per collect phase (all robots)
    sync_updates: int = 50  # sync arms: updates per train phase
    eval_episodes: int = 40  # held-out scenes for each arm's final weights (0 = off)
    # Save each training arm's weights this often (robot time) and score every copy held-out
    # afterwards (0 = off; robot_rl.bench.timeline).
    heldout_every_s: float = 0.0
    timeline_episodes: int = 40  # held-out scenes per saved copy

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"bench.arms: unknown arm(s) {unknown or '(none given)'}; known: {list(ARMS)}")
        if self.minutes_per_arm <= 0 or self.heldout_every_s < 0:
            raise ValueError("bench.minutes_per_arm must be > 0 and bench.heldout_every_s >= 0")
        for name in ("num_robots", "window", "sync_collect_episodes", "sync_updates"):
            if getattr(self, name) < 1:
                raise ValueError(f"bench.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_episodes < 0 or self.timeline_episodes < 0:
            raise ValueError("bench.eval_episodes and bench.timeline_episodes must be >= 0")


@dataclass
class SoakBenchConfig:
    """``bench soak``: a training learner fed camera-size frames for long, its memory over time
    (robot_rl.bench.soak)."""

    robots: int = 2
    image: list[int] = field(default_factory=lambda: [480, 640])  # height, width of both cameras (the so101 preset's)
    fps: int = 30
    duration_s: float = 1800.0
    episode_s: float = 10.0  # each robot sends one episode after another, this long each
    # learner.store.index_memory of the run (MB): small enough to be reached within the warm-up, so
    # what follows shows the learner's memory staying put, not the index filling its budget.
    index_memory_mb: float = 256.0
    warmup_s: float = 300.0  # growth is measured from here to the end (a third of a shorter run)
    sample_every_s: float = 5.0  # RSS, updates and the writer's backlog
    small_image: int = 96  # the side-by-side run's frames (square), for updates_per_s_small
    small_duration_s: float = 300.0
    # After the robots stop and the writer has stored all: the trainer alone for this long (reading back
    # what left the index, nothing arriving), both runs: what the trainer does without ingest's CPU.
    trainer_alone_s: float = 120.0

    def __post_init__(self) -> None:
        if self.robots < 1 or self.fps < 1 or self.small_image < 8:
            raise ValueError(f"bench soak: robots and fps must be >= 1, small_image >= 8, got {self}")
        check_camera_image(self.image)
        if min(self.duration_s, self.small_duration_s, self.trainer_alone_s, self.episode_s, self.sample_every_s) <= 0:
            raise ValueError("bench soak: durations, trainer_alone_s, episode_s and sample_every_s must be > 0")
        if self.index_memory_mb <= 0 or self.warmup_s < 0:
            raise ValueError("bench soak: index_memory_mb must be > 0 and warmup_s >= 0")


@dataclass
class DetectorBenchConfig:
    """``bench detector``: the success detector's accuracy against the sim's ground truth per number of
    labelled episodes (its own settings are ``learner.detector``)."""

    labelled: list[int] = field(default_factory=lambda: [10, 25, 50, 100])  # labelled episodes per fit
    test_episodes: int = 60  # other scenes per family the detectors are judged on
    asked_after: int = 50  # asked_fraction is reported for the first fit with at least this many labelled
    failure_share: float = 0.5  # episodes recorded as a stopped or noisy expert (the rest: the expert)
    stop_ticks: list[int] = field(default_factory=lambda: [20, 120])  # a stopped expert's last own tick: [lo, hi]
    noise_deg: float = 10.0  # a noisy expert's command noise (std, degrees / gripper units)
    frame_stride: int = 10  # ticks between kept frames (the last ones are always kept)
    # A LeRobotDataset whose episodes carry who judged them (a learner's store, a robot's own dataset): its
    # operator- and task-judged episodes, per task in stored order, replace the sim's recorded ones (the
    # first max(labelled) teach, the rest are the test; robot_rl.bench.detector_logged). null: the sim.
    episodes_from: str | None = None
    # Then the main job twice, judged by the sim and by the detector (robot_rl.bench.detector_main_job):
    # ~1 hour on a 2-core CPU, so off unless asked for.
    main_job: bool = False
    main_job_learner: str = "rwr"  # the learner preset both main jobs train with (one that weighs outcomes)

    def __post_init__(self) -> None:
        if not self.labelled or min(self.labelled) < 4:
            raise ValueError(f"bench.labelled must be counts >= 4, got {self.labelled}")
        if self.test_episodes < 2 or self.frame_stride < 1:
            raise ValueError("bench.test_episodes must be >= 2 and bench.frame_stride >= 1")
        if not 0.0 < self.failure_share < 1.0:
            raise ValueError(f"bench.failure_share must be in (0, 1), got {self.failure_share}")
        if len(self.stop_ticks) != 2 or not 0 <= self.stop_ticks[0] <= self.stop_ticks[1]:
            raise ValueError(f"bench.stop_ticks must be [lo, hi] with 0 <= lo <= hi, got {self.stop_ticks}")


BENCHMARK_CONFIGS: dict[str, type] = {
    "sim": SimBenchConfig,
    "async": AsyncBenchConfig,
    "transport": TransportBenchConfig,
    "realtime": RealtimeBenchConfig,
    "faults": FaultsBenchConfig,
    "store": StoreBenchConfig,
    "cameras": CamerasBenchConfig,
    "replan": ReplanBenchConfig,
    "learning": LearningBenchConfig,
    "policies": PoliciesBenchConfig,
    "serve": ServeBenchConfig,
    "soak": SoakBenchConfig,
    "detector": DetectorBenchConfig,
}


def register() -> None:
    for name, node in BENCHMARK_CONFIGS.items():
        ConfigStore.instance().store(group=BENCHMARKS_GROUP, name=name, node=node)


register()
