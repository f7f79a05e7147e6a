"""Settings of the application layer's jobs: the main job, demonstrations, behaviour cloning,
evaluation, the sim demo, and the scene ranges they draw from.

Paths default to places under the root ``output_dir`` (an interpolation Hydra resolves).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.viewer_config import NoViewerConfig
from robot_rl.hardware.sim.wording import WORDINGS
from robot_rl.hardware.teleop.scripted import ScriptedOperatorConfig
from robot_rl.replay.joint_mapping import JointMapping


@dataclass
class Seeds:
    """Where each job draws its sim scenes from (a scene is a seed): disjoint ranges, so that no
    job is scored on scenes another one trained on, and every run is reproducible scene by scene.

    ``demos``, ``robots`` and ``heldout`` are shifted by the root ``seed``; ``stride`` separates
    task families (demonstrations) and robots (the main job) inside a range.
    """

    demos: int = 0  # demonstrations: family f, episode i -> seed + demos + stride * f + i
    bc_eval: int = 1_000_000  # train-bc's closed-loop check of the trained start
    eval: int = 2_000_000  # robot-rl eval; bench async's scenes
    reaction: int = 3_000_000  # bench async's reaction test
    realtime: int = 4_000_000  # bench async's wall-clock cells
    robots: int = 5_000_000  # main job and bench learning: robot r, episode e -> seed + robots + stride * r + e
    heldout: int = 9_000_000  # the held-out check of the main job and bench learning: seed + heldout + i
    stride: int = 100_000

    def __post_init__(self) -> None:
        if self.stride < 1:
            raise ValueError(f"seeds.stride must be >= 1, got {self.stride}")


class VerdictMode(StrEnum):
    """Who judges the main job's simulated episodes."""

    task = "task"  # the sim's ground truth, at every tick: a success ends the episode
    # As on an unattended real arm: the scripted operator judges each robot's first episodes, then the
    # learner's success detector, the operator asked only when it is unsure (robot_rl.app.unattended_verdicts).
    detector = "detector"


class RobotPlacement(StrEnum):
    """Where the main job's simulated robots run beside the learner."""

    process = "process"  # each in a process of its own: the learner keeps its interpreter lock
    thread = "thread"  # on threads of the learner's process: starts faster (tests)


@dataclass
class RunConfig:
    """The main job (``robot-rl run``): a learner, simulated SO-101 edge nodes and a scripted
    operator on loopback, CPU only."""

    dir: str = "${output_dir}/run"
    num_robots: int = 2
    episodes: int = 100  # per robot: 200 in all with two, unless the time budget ends them first
    time_budget_min: float | None = 12.0  # robots start no new episode after this; null = no limit
    # After the last episode the learner trains on what was stored until it has made this many
    # updates (null: it stops with the robots). The episodes fix the data, this the compute: a GPU
    # learner gets there while the robots act; on 2 CPU cores shared with them it makes ~2,000.
    min_updates: int | None = 4000
    max_episode_steps: int = 300  # 10 s per attempt at 30 Hz
    # The scripted operator who watches each robot and takes over when the policy goes wrong
    # (robot i's is seeded operator.seed + i); null = no operator.
    operator: ScriptedOperatorConfig | None = field(default_factory=ScriptedOperatorConfig)
    curve_window: int = 20  # rolling window of the learning-curve plot (episodes)
    # At the end, the start's and the final weights' success alone on this many unseen scenes
    # (paired, in a fresh process, ~1 min for 40); 0 = off. The task families rotate over them
    # (scored per family too): 40 per family over three families is 120.
    eval_episodes: int = 40
    # While the run goes, the newest published weights are scored alone on the first this-many of
    # those scenes (the families rotating) whenever the scorer is free (a child process at nice 19,
    # so the robots are not slowed); the learning curve and the fleet console show these points. 0 = off.
    heldout_scenes: int = 10
    # ... no more often than this many updates apart: points spread over the run (4,000 updates: 16),
    # and the scorer leaves the dataset writer, which shares its spare CPU, most of it.
    heldout_every_updates: int = 250
    # Nice value of the learner's training and dataset-writing threads: robots and learner share
    # this machine's CPUs, and a control tick must not wait for a gradient step.
    learner_nice: int = 10
    # PyTorch intra-op threads of the whole process (trainer and robots' policies); null = one per
    # core. One trains faster on a small CPU: a second thread waits for cores the robots hold.
    torch_threads: int | None = 1
    robots: RobotPlacement = RobotPlacement.process
    verdicts: VerdictMode = VerdictMode.task
    # With verdicts=detector: the episodes the operator judges first, over all robots (each robot its
    # share, rounded up). `bench detector` finds the detector >= 95 % accurate after 50.
    labelled_episodes: int = 50

    def __post_init__(self) -> None:
        self.verdicts = VerdictMode(self.verdicts)
        if self.labelled_episodes < 0:
            raise ValueError(f"run.labelled_episodes must be >= 0, got {self.labelled_episodes}")
        for name in ("num_robots", "episodes", "max_episode_steps", "curve_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"run.{name} must be >= 1, got {getattr(self, name)}")
        if self.heldout_every_updates < 1:
            raise ValueError(f"run.heldout_every_updates must be >= 1, got {self.heldout_every_updates}")
        if self.heldout_scenes < 0:
            raise ValueError(f"run.heldout_scenes must be >= 0 (0: no scores while running), got {self.heldout_scenes}")
        if self.eval_episodes < 0:
            raise ValueError(f"run.eval_episodes must be >= 0 (0: no held-out check), got {self.eval_episodes}")
        if self.min_updates is not None and self.min_updates < 0:
            raise ValueError(f"run.min_updates must be >= 0 or null (stop with the robots), got {self.min_updates}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"run.torch_threads must be >= 1 or null (PyTorch's default), got {self.torch_threads}")
        if not 0 <= self.learner_nice <= 19:
            raise ValueError(f"run.learner_nice must be in 0..19, got {self.learner_nice}")
        if self.time_budget_min is not None and self.time_budget_min <= 0:
            raise ValueError(f"run.time_budget_min must be > 0 or null, got {self.time_budget_min}")


@dataclass
class DemosConfig:
    """Scripted-expert demonstrations (``robot-rl record-demos``; train-bc and run record them if
    missing), for the root ``task_families``."""

    dir: str = "${output_dir}/demos"
    episodes: int = 240  # per task family
    # Demonstrator speed, a fraction of the expert's full rates (6 deg/tick, 12 mm/tick): slower,
    # smoother demonstrations are easier to imitate from images.
    expert_speed: float = 0.5
    # DART: Gaussian noise (degrees, each arm joint, each tick) on the commands the arm executes while
    # the expert travels between waypoints, its own commands recorded: demonstrations of coming back
    # from a cloned policy's small errors (``robot_rl.app.demos.expert_episode``). 0: off; at 2 the
    # three-family start scored worse (docs/history/benchmarks.md, "train-bc").
    noise_deg: float = 0.0
    # The sim and the expert in a child process while this one writes the dataset: the two cost
    # about the same per frame and overlap on two cores (240 demonstrations: 195 s against 335 s,
    # the same dataset frame for frame).
    sim_process: bool = True

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"demos.episodes must be >= 1, got {self.episodes}")
        if not 0 < self.expert_speed <= 1:
            raise ValueError(f"demos.expert_speed must be in (0, 1], got {self.expert_speed}")
        if not 0 <= self.noise_deg <= 10:
            raise ValueError(f"demos.noise_deg must be in [0, 10] degrees, got {self.noise_deg}")


@dataclass
class BCConfig:
    """Behaviour cloning of the policy from the demonstrations (``robot-rl train-bc``): the
    learner's starting point."""

    checkpoint_dir: str = "${output_dir}/bc_policy"
    steps: int = 4000
    batch_size: int = 32
    lr: float = 3.0e-4
    eval_episodes: int = 30  # closed-loop check in the sim after training (seeds.bc_eval onwards)
    # `robot-rl run` and `bench learning` start from the checkpoint that ships with robot_rl
    # (trained by `robot-rl train-bc` with these defaults) when checkpoint_dir holds none and the
    # configured model and task set match it; false = always train one.
    use_shipped: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0 or self.eval_episodes < 0:
            raise ValueError(f"bc: steps and batch_size must be >= 1, lr > 0, eval_episodes >= 0; got "
                             f"{self.steps}, {self.batch_size}, {self.lr}, {self.eval_episodes}")


@dataclass
class EvalConfig:
    """Closed-loop evaluation in the sim (``robot-rl eval``) of ``policy.path`` and, if given, a
    second checkpoint on the same scenes. Timing (mode, simulated latency) is the ``edge`` group's."""

    episodes: int = 20  # seeded scenes (seeds.eval onwards; families rotate over task_families)
    compare_path: str | None = None  # a second checkpoint (same policy type), on the same scenes
    dataset: str | None = None  # take the initial scenes from this dataset's episodes instead of seeds
    episode_indices: list[int] | None = None  # which dataset episodes; null = all
    max_episode_steps: int | None = None  # null = the robot's own limit
    out_dir: str = "${output_dir}/eval"
    mapping: JointMapping = field(default_factory=JointMapping)  # the dataset's joints -> sim joints
    # What the policy reads: trained | paraphrase | reordered | colour_words (robot_rl.hardware.sim.wording).
    wording: str = "trained"

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"eval.episodes must be >= 1, got {self.episodes}")
        if self.wording not in WORDINGS:
            raise ValueError(f"eval.wording must be one of {WORDINGS}, got {self.wording!r}")


@dataclass
class DemoSimConfig:
    """``robot-rl demo-sim``: the sim with the scripted expert, a table of successes per family."""

    episodes: int = 3  # per task family (every family of the sim)
    realtime: bool = False  # tick at fps on the wall clock (to watch along)

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"demo_sim.episodes must be >= 1, got {self.episodes}")


@dataclass
class LocalRunConfig:
    """What ``run_local`` and ``run_edge`` are asked to do (built from ``RunConfig`` by the main job,
    by ``bench learning`` per arm, and by ``robot-rl edge``); the user-facing defaults are ``RunConfig``'s."""

    num_robots: int
    episodes_per_robot: int
    max_steps: int  # per episode
    spool_dir: str
    edge: EdgeConfig
    # Where the robots run: on threads of the learner's process (starts faster: tests, tools) or each
    # in its own process (robot_rl.app.robot_process; its robot and operator factories must pickle).
    robots: RobotPlacement = RobotPlacement.thread
    # Robots start no new episode after this many seconds of wall time (None: no limit).
    time_budget_s: float | None = None
    # Robots keep starting episodes (at most episodes_per_robot) only until the trainer has
    # done trainer.max_updates: a run sized by its training budget rather than by episodes.
    until_trained: bool = False
    # After the robots' last episode the learner trains on what they stored until it has made
    # this many updates (None: it stops with the robots). The episodes set the data, this the
    # compute: a GPU learner gets there while the robots act, a CPU one that shares its cores
    # with them falls behind, and the final weights should not depend on which one it was.
    min_updates: int | None = None
    segment_steps: int = 15  # steps per streamed segment: half a second at 30 Hz
    image_format: str = "jpeg"  # how camera frames travel to the learner
    viewer: Any = field(default_factory=NoViewerConfig)  # what every robot logs a live view to (viewer=)
    # Each robot also records its episodes into a LeRobotDataset v3 of its own, RECORD_DIR/ROBOT_ID, as
    # a real robot does (None: the learner's store is the only copy).
    record_dir: str | None = None
    # Each robot's episodes judged as an unattended arm's (robot_rl.app.unattended_verdicts.UnattendedVerdicts);
    # None: by the sim's task at every tick.
    verdicts: Any = None

    def __post_init__(self) -> None:
        self.robots = RobotPlacement(self.robots)
        if self.min_updates is not None and self.min_updates < 0:
            raise ValueError(f"LocalRunConfig.min_updates must be >= 0 or None, got {self.min_updates}")
