"""A learner and N simulated edge nodes on one machine, on loopback: what ``robot-rl run`` and
``bench learning`` start.

Every robot runs the edge runtime a real robot runs (``robot_rl.edge.runtime.EdgeRuntime``: node,
learner link streaming segments as the episode runs, local recorder) against the real learner
service over real sockets, so what works here works across machines. The robots run on threads of
this process (``robots: thread``, quick to start: tests) or each in a process of its own
(``robots: process``, ``robot_rl.app.robot_process``: the learner keeps its interpreter's lock to
itself, as on a machine of its own).

With ``edge.inference_runner=remote`` the robots run no policy of their own: each asks the
learner's policy server (``learner.serve_policy``, ``robot_rl.learner.serving``) for its chunks,
as a robot PC without a GPU asks the learner's GPU box, and the serving copy takes every
published version in place, so no robot downloads weights.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from robot_rl.app.config import LocalRunConfig, RobotPlacement, Seeds
from robot_rl.app.robot_process import RobotJob, RobotProcesses
from robot_rl.app.sim_edge import EpisodeCallback, OperatorFactory, RobotFactory, run_robot
from robot_rl.app.training_threads import ThreadChoice, most_threads
from robot_rl.bridges.zmq.client import ClientConfig
from robot_rl.core.errors import ConfigError
from robot_rl.edge.remote_runner import RemoteInferenceConfig
from robot_rl.learner.checkpoint_pointer import latest_checkpoint
from robot_rl.learner.config import LearnerConfig
from robot_rl.learner.metrics import VersionStats
from robot_rl.learner.service import LearnerService
from robot_rl.learner.serving import PolicyServer, serve_from_learner
from robot_rl.learner.serving_config import ServeConfig
from robot_rl.policies.trainable import TrainablePolicy

log = logging.getLogger(__name__)


@dataclass
class LocalRunResult:
    episodes: int
    steps: int
    successes: int
    updates: int
    weights_version: int
    robot_versions: dict[str, int]
    store: dict[str, int]
    per_version: dict[int, VersionStats] = field(default_factory=dict)  # stored episodes' outcomes by weights
    checkpoint: Path | None = None  # the learner's final checkpoint (None when it did not train)
    updates_with_robots: int | None = None  # updates made while robots acted (the rest: min_updates)
    family_shares: dict[str, float] = field(default_factory=dict)  # each task family's share of the samples trained on
    # The chunks the learner's policy server answered each robot (None: the robots ran their own copies).
    served_chunks: dict[str, int] | None = None
    stopped_early: bool = False  # ended by a stop request (the run's Ctrl-C) before its episodes or budget


@dataclass(frozen=True)
class SimRobotFactory:
    """Robots for ``run_local``: one MuJoCo SO-101 (robot_rl.hardware.sim) each; picklable, so a robot
    process can build its own.

    Robot ``i`` resets episode ``e`` with seed ``seed_base + stride * i + e`` (``Seeds.robots``,
    ``Seeds.stride``), so robots never repeat each other's scenes and a run is reproducible scene
    by scene. ``families`` (None: the sim draws one per seed) rotate over the episodes.
    """

    sim_config: Any = None  # robot_rl.hardware.sim.SimConfig; None: its defaults
    families: tuple[str, ...] | None = None
    seed_base: int = 0
    stride: int = Seeds.stride

    def __call__(self, index: int) -> tuple[Any, Any, Callable[[int], str]]:
        from robot_rl.hardware.sim import SimConfig, SimSO101  # MuJoCo: the sim extra

        seed = self.seed_base + self.stride * index
        sim = SimSO101(dataclasses.replace(self.sim_config or SimConfig(), seed=seed))
        sim.connect()
        families = self.families

        def reset(episode: int) -> str:
            family = families[episode % len(families)] if families else None
            return sim.reset(seed=seed + episode, family=family)

        return sim, sim, reset


def make_sim_robot_factory(sim_config: Any = None, families: Sequence[str] | None = None,
                           seed_base: int = 0, stride: int = Seeds.stride) -> SimRobotFactory:
    """``SimRobotFactory`` for these settings (see there)."""
    return SimRobotFactory(sim_config, tuple(families) if families else None, int(seed_base), int(stride))


def sim_robot_factory(index: int) -> tuple[Any, Any, Callable[[int], str]]:
    """One default MuJoCo SO-101 per robot, seeded by its index."""
    return make_sim_robot_factory()(index)


def run_local(
    learner_config: LearnerConfig,
    policy: TrainablePolicy,
    run: LocalRunConfig,
    robot_factory: RobotFactory = sim_robot_factory,
    *,
    resume: bool = False,
    train: bool = True,
    operator_factory: OperatorFactory | None = None,
    on_episode: EpisodeCallback | None = None,
    on_start: Callable[[LearnerService], None] | None = None,
    on_robots_done: Callable[[], None] | None = None,
    serve: ServeConfig | None = None,
    stop_requested: threading.Event | None = None,
) -> LocalRunResult:
    """Start the learner, run every robot's episodes (``run.robots``: on threads or in processes),
    stop, and summarise.

    ``stop_requested`` (set by the run's Ctrl-C): every robot ends the episode it is in and starts no
    other, the learner writes their episodes and its checkpoint, and it does not train on after them
    (``run.min_updates``), or stops doing so.

    ``serve``: where and how the learner serves chunks when ``learner_config.serve_policy`` (None:
    ``ServeConfig``'s defaults); robots with ``edge.inference_runner=remote`` ask it.

    ``operator_factory`` gives each robot a (simulated) operator who may take over;
    ``on_episode`` sees every finished episode (progress displays, learning curves);
    ``on_start`` gets the running service just before the robots' first episodes (to watch its
    trainer and store; robot processes have imported and built their robots by then);
    ``on_robots_done`` is called once the robots have finished (a progress display of theirs ends),
    before the learner writes out their episodes and trains on.
    """
    limit = learner_config.trainer.max_updates
    if run.until_trained and (not train or limit is None):
        raise ValueError("LocalRunConfig.until_trained needs training on and trainer.max_updates set")
    if run.edge.inference_runner == "remote" and not learner_config.serve_policy:
        raise ConfigError("edge.inference_runner=remote: the robots ask the learner for their chunks, "
                          "so it must serve them (learner.serve_policy=true)")
    learner, serving = start_learner(learner_config, policy, resume=resume, train=train, serve=serve)
    served = serving if run.edge.inference_runner == "remote" else None
    versions: dict[str, int] = {}
    started = [time.monotonic()]  # reset when the robots start: the budget is robot time

    def trained() -> bool:
        if stop_requested is not None and stop_requested.is_set():
            return True
        if run.time_budget_s is not None and time.monotonic() - started[0] >= run.time_budget_s:
            return True
        return run.until_trained and limit is not None and learner.trainer.step >= limit

    def robots_starting() -> None:
        started[0] = time.monotonic()
        if on_start is not None:
            on_start(learner)

    try:
        if run.robots is RobotPlacement.process:
            results, errors = _robots_in_processes(learner, served, policy, run, robot_factory, operator_factory,
                                                   on_episode, versions, trained, robots_starting)
        else:
            robots_starting()
            results, errors = _robots_on_threads(learner, served, policy, run, robot_factory, operator_factory,
                                                 on_episode, versions, trained)
        if on_robots_done is not None:
            on_robots_done()
        write_out(learner, timeout_s=120.0)
        updates_with_robots = learner.trainer.step
        stop = stop_requested or threading.Event()
        if train and run.min_updates and not errors and not stop.is_set():
            train_on_after_robots(learner, run.min_updates, stop)
        stopped_early = stop.is_set()
    finally:
        if serving is not None:
            serving.close()
        learner.stop(checkpoint=train)
    result = collect_result(learner, results, errors, versions, trained=train)
    result.updates_with_robots = updates_with_robots
    result.stopped_early = stopped_early
    result.served_chunks = dict(served.stats.chunks_by_robot) if served is not None else None
    return result


def start_learner(learner_config: LearnerConfig, policy: TrainablePolicy, *, resume: bool, train: bool,
                  serve: ServeConfig | None) -> tuple[LearnerService, PolicyServer | None]:
    """The running learner, and its policy server when ``learner_config.serve_policy`` (built before the
    learner starts, so every version it publishes reaches the serving copy)."""
    learner = LearnerService(learner_config, copy.deepcopy(policy), resume=resume, train=train)
    serving: PolicyServer | None = None
    try:
        serving = serve_from_learner(learner, serve or ServeConfig()) if learner_config.serve_policy else None
        learner.start()
    except BaseException:
        if serving is not None:
            serving.close()
        learner.stop(checkpoint=False)
        raise
    return learner, serving


def write_out(learner: LearnerService, timeout_s: float, poll_s: float = 0.5) -> bool:
    """The robots are done: wait (at most ``timeout_s``) until the dataset writer has written every
    episode they sent, with a bar of the episodes left (a writer behind the robots takes minutes)."""
    deadline = time.monotonic() + timeout_s
    waiting = learner.store.stats()["episodes_to_write"]
    if waiting == 0:
        return learner.store.flush(timeout_s)
    with tqdm(total=waiting, desc="writing the robots' episodes to the dataset", unit="ep") as bar:
        while not learner.store.flush(poll_s):
            bar.update(max(0, waiting - learner.store.stats()["episodes_to_write"] - bar.n))
            if time.monotonic() >= deadline:
                log.warning("the dataset writer still has %d episodes after %.0f s; they stay staged and are "
                            "written at the next start", learner.store.stats()["episodes_to_write"], timeout_s)
                return False
        bar.update(waiting - bar.n)
    return True


def train_on_after_robots(learner: LearnerService, updates: int, stop: threading.Event, poll_s: float = 0.5
                          ) -> None:
    """Let the trainer go on with the stored episodes until it has made ``updates`` updates
    (``LocalRunConfig.min_updates``), on the cores the robots held, as many threads as train fastest
    (``ThreadChoice``), showing its progress;
    returns early if it stops by itself (``trainer.max_updates``, or a crash, which its thread
    has logged), or once ``stop`` is set."""
    trainer = learner.trainer
    if trainer.step >= updates:
        return
    if not trainer.ready():  # nothing more will arrive: waiting would never end
        log.warning("robots done, but the learner's streams hold too little data to train on; stopping at "
                    "update %d", trainer.step)
        return
    log.info("robots done at update %d; training on the stored episodes to update %d", trainer.step, updates)
    cores, threads, choice = len(os.sched_getaffinity(0)), 0, ThreadChoice()
    with tqdm(total=updates, initial=trainer.step, desc="training on (robots done)", unit="upd") as bar:
        while trainer.step < updates and not stop.is_set():
            most = most_threads(cores, learner.store.stats()["episodes_to_write"])
            wanted = choice.threads(time.monotonic(), trainer.step, most)
            if wanted != threads:
                trainer.set_threads(threads := wanted)
            ended = trainer.wait(poll_s)
            bar.update(min(trainer.step, updates) - bar.n)
            if ended:
                log.warning("the trainer stopped at update %d before min_updates %d", trainer.step, updates)
                return


def _robots_on_threads(learner: LearnerService, serving: PolicyServer | None, policy: TrainablePolicy,
                       run: LocalRunConfig,
                       robot_factory: RobotFactory, operator_factory: OperatorFactory | None,
                       on_episode: EpisodeCallback | None, versions: dict[str, int], stop: Callable[[], bool]
                       ) -> tuple[list[tuple[int, int, int]], list[BaseException]]:
    results: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def robot_thread(index: int) -> None:
        try:
            results.append(_run_robot(index, learner, policy, run, robot_factory, versions, stop,
                                      operator_factory, on_episode, served=robot_inference(index, serving)))
        except BaseException as exc:  # reported after join
            log.exception("robot %d failed", index)
            errors.append(exc)

    threads = [threading.Thread(target=robot_thread, args=(i,), name=f"robot-{i}") for i in range(run.num_robots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def _robots_in_processes(learner: LearnerService, serving: PolicyServer | None, policy: TrainablePolicy,
                         run: LocalRunConfig,
                         robot_factory: RobotFactory, operator_factory: OperatorFactory | None,
                         on_episode: EpisodeCallback | None, versions: dict[str, int],
                         stop: Callable[[], bool], starting: Callable[[], None]
                         ) -> tuple[list[tuple[int, int, int]], list[BaseException]]:
    """Each robot in a child process (``robot_process``); all start their first episode together,
    once every child has imported and built its robot (``starting`` is called then)."""
    start_dir = None
    if serving is None:  # a served robot loads no weights
        start_dir = Path(run.spool_dir) / "start_policy"  # the weights every robot starts from
        policy.save_pretrained(start_dir)
    jobs = [RobotJob(i, robot_client(i, learner, policy, run), None if start_dir is None else str(start_dir), run,
                     robot_factory, operator_factory, policy_options=policy.loading_options(),
                     served=robot_inference(i, serving)) for i in range(run.num_robots)]
    robots = RobotProcesses(jobs, on_episode, versions)
    try:
        robots.start()
        starting()
        robots.go()
        robots.run_until_done(stop)
    finally:
        robots.close()
    return robots.results, robots.errors


def collect_result(learner: LearnerService, results: list[tuple[int, int, int]], errors: list[BaseException],
                   versions: dict[str, int], *, trained: bool) -> LocalRunResult:
    """Raise the first robot failure, else sum the robots' (episodes, steps, successes) with the learner's state."""
    if errors:
        raise RuntimeError(f"{len(errors)} robot(s) failed; first error: {errors[0]}") from errors[0]
    return LocalRunResult(
        episodes=sum(r[0] for r in results), steps=sum(r[1] for r in results), successes=sum(r[2] for r in results),
        updates=learner.trainer.step, weights_version=learner.trainer.version, robot_versions=versions,
        store=learner.store.stats(), per_version=learner.store.outcomes.per_version(),
        family_shares=learner.trainer.family_samples.shares(),
        checkpoint=latest_checkpoint(learner.config.trainer.checkpoint_dir) if trained else None)


def robot_id_of(index: int) -> str:
    return f"sim-{index}"


def robot_client(index: int, learner: LearnerService, policy: TrainablePolicy, run: LocalRunConfig) -> ClientConfig:
    """Robot ``index``'s link to ``learner``: its id, the learner's endpoints, its own spool."""
    robot_id = robot_id_of(index)
    return ClientConfig(robot_id=robot_id, router_endpoint=learner.router_endpoint,
                        pub_endpoint=learner.pub_endpoint, spool_dir=str(Path(run.spool_dir) / robot_id),
                        config_hash=policy.config_hash(), policy_version=0)


def robot_inference(index: int, serving: PolicyServer | None) -> RemoteInferenceConfig | None:
    """Where robot ``index`` asks for its chunks: the learner's policy server, at the address it bound
    (``serve.endpoint``, on loopback as the learner's link; None: the robot runs its own copy)."""
    return None if serving is None else RemoteInferenceConfig(serving.endpoint, robot_id_of(index))


def _run_robot(index: int, learner: LearnerService, policy: TrainablePolicy, run: LocalRunConfig,
               robot_factory: RobotFactory, versions: dict[str, int],
               stop: Callable[[], bool], operator_factory: OperatorFactory | None = None,
               on_episode: EpisodeCallback | None = None,
               served: RemoteInferenceConfig | None = None) -> tuple[int, int, int]:
    return run_robot(index, robot_client(index, learner, policy, run), policy, run, robot_factory, versions, stop,
                     operator_factory, on_episode, served=served)
