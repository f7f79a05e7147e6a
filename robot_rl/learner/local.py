"""A learner and N simulated edge nodes in one process, on loopback: what ``robot-rl run`` starts.

Every robot runs the real edge runtime (``EdgeNode`` + ``EdgeStreamer``) against the
real learner service over real sockets; only the process boundary is missing, so what
works here works across machines.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridges.zmq.client import ClientConfig
from bridges.zmq.segments import ImageEncoding
from policies.flow_vla import FlowVLA
from robot_rl.core.clock import WallClock
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.node import EdgeNode
from robot_rl.edge.streaming import EdgeStreamer
from robot_rl.learner.checkpoint import latest_checkpoint
from robot_rl.learner.config import LearnerConfig
from robot_rl.learner.metrics import VersionStats
from robot_rl.learner.service import LearnerService

log = logging.getLogger(__name__)

# (robot index) -> (robot, task or None, reset(episode) -> instruction)
RobotFactory = Callable[[int], tuple[Any, Any, Callable[[int], str]]]
# (robot index, robot) -> an intervention hook with bind(node) and begin_episode(episode),
# e.g. hardware.teleop.TeleopIntervention around the scripted operator
OperatorFactory = Callable[[int, Any], Any]
# Called on the robot's thread after each episode: (robot_id, episode, policy version in use)
EpisodeCallback = Callable[[str, Any, int], None]


@dataclass
class LocalRunConfig:
    num_robots: int = 4
    episodes_per_robot: int = 3
    max_steps: int = 300
    segment_steps: int = 15
    spool_dir: str = "outputs/run/spool"
    image_format: str = "jpeg"
    edge: EdgeConfig = field(default_factory=EdgeConfig)
    # Robots keep starting episodes (at most episodes_per_robot) only until the trainer has
    # done trainer.max_updates: a run sized by its training budget rather than by episodes.
    until_trained: bool = False
    # Robots start no new episode after this many seconds of wall time (None: no limit).
    time_budget_s: float | None = None


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


def make_sim_robot_factory(sim_config: Any = None, families: Sequence[str] | None = None,
                           seed_base: int = 0) -> RobotFactory:
    """Robots for ``run_local``: one MuJoCo SO-101 (hardware.sim) each.

    Robot ``i`` resets episode ``e`` with seed ``seed_base + 100_000 * i + e``, so robots never
    repeat each other's scenes and a run is reproducible scene by scene. ``families`` (None:
    the sim draws one per seed) rotate over the episodes.
    """
    from hardware.sim import SimConfig, SimSO101

    base = sim_config or SimConfig()

    def factory(index: int) -> tuple[Any, Any, Callable[[int], str]]:
        sim = SimSO101(dataclasses.replace(base, seed=seed_base + 100_000 * index))
        sim.connect()

        def reset(episode: int) -> str:
            family = families[episode % len(families)] if families else None
            return sim.reset(seed=seed_base + 100_000 * index + episode, family=family)

        return sim, sim, reset

    return factory


def sim_robot_factory(index: int) -> tuple[Any, Any, Callable[[int], str]]:
    """One default MuJoCo SO-101 per robot, seeded by its index."""
    return make_sim_robot_factory()(index)


def run_local(
    learner_config: LearnerConfig,
    policy: FlowVLA,
    run: LocalRunConfig,
    robot_factory: RobotFactory = sim_robot_factory,
    *,
    resume: bool = False,
    train: bool = True,
    operator_factory: OperatorFactory | None = None,
    on_episode: EpisodeCallback | None = None,
    on_start: Callable[[LearnerService], None] | None = None,
) -> LocalRunResult:
    """Start the learner, run every robot's episodes on its own thread, stop, and summarise.

    ``operator_factory`` gives each robot a (simulated) operator who may take over;
    ``on_episode`` sees every finished episode (progress displays, learning curves);
    ``on_start`` gets the running service (to watch its trainer and store).
    """
    learner = LearnerService(learner_config, copy.deepcopy(policy), resume=resume, train=train).start()
    if on_start is not None:
        on_start(learner)
    results: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []
    versions: dict[str, int] = {}

    limit = learner_config.trainer.max_updates
    if run.until_trained and (not train or limit is None):
        raise ValueError("LocalRunConfig.until_trained needs training on and trainer.max_updates set")

    started = time.monotonic()

    def trained() -> bool:
        if run.time_budget_s is not None and time.monotonic() - started >= run.time_budget_s:
            return True
        return run.until_trained and learner.trainer.step >= limit

    def robot_thread(index: int) -> None:
        try:
            results.append(_run_robot(index, learner, policy, run, robot_factory, versions, trained,
                                      operator_factory, on_episode))
        except BaseException as exc:  # reported after join
            log.exception("robot %d failed", index)
            errors.append(exc)

    threads = [threading.Thread(target=robot_thread, args=(i,), name=f"robot-{i}") for i in range(run.num_robots)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        learner.store.flush(120)
    finally:
        learner.stop(checkpoint=train)
    return collect_result(learner, results, errors, versions, trained=train)


def collect_result(learner: LearnerService, results: list[tuple[int, int, int]], errors: list[BaseException],
                   versions: dict[str, int], *, trained: bool) -> LocalRunResult:
    """Raise the first robot failure, else sum the robots' (episodes, steps, successes) with the learner's state."""
    if errors:
        raise RuntimeError(f"{len(errors)} robot(s) failed; first error: {errors[0]}") from errors[0]
    return LocalRunResult(
        episodes=sum(r[0] for r in results), steps=sum(r[1] for r in results), successes=sum(r[2] for r in results),
        updates=learner.trainer.step, weights_version=learner.trainer.version, robot_versions=versions,
        store=learner.store.stats(), per_version=learner.store.outcomes.per_version(),
        checkpoint=latest_checkpoint(learner.config.trainer.checkpoint_dir) if trained else None)


def _run_robot(index: int, learner: LearnerService, policy: FlowVLA, run: LocalRunConfig,
               robot_factory: RobotFactory, versions: dict[str, int],
               stop: Callable[[], bool], operator_factory: OperatorFactory | None = None,
               on_episode: EpisodeCallback | None = None) -> tuple[int, int, int]:
    robot_id = f"sim-{index}"
    client = ClientConfig(robot_id=robot_id, router_endpoint=learner.router_endpoint,
                          pub_endpoint=learner.pub_endpoint, spool_dir=str(Path(run.spool_dir) / robot_id),
                          config_hash=policy.config_hash(), policy_version=0)
    parts = robot_factory(index)
    operator = operator_factory(index, parts[0]) if operator_factory is not None else None
    try:
        return run_edge(client, policy, run, parts, versions, stop, operator=operator, on_episode=on_episode)
    finally:
        # On this thread, which made its GL context: left to the garbage collector at exit,
        # EGL prints EGL_NOT_INITIALIZED tracebacks after the results.
        parts[0].disconnect()


def run_edge(client: ClientConfig, policy: FlowVLA, run: LocalRunConfig,
             robot_parts: tuple[Any, Any, Callable[[int], str]],
             versions: dict[str, int] | None = None,
             stop: Callable[[], bool] | None = None,
             operator: Any = None,
             on_episode: EpisodeCallback | None = None) -> tuple[int, int, int]:
    """One edge node: run ``run.episodes_per_robot`` episodes streaming to the learner in ``client``.

    ``stop`` (checked before each episode) ends the run early. Returns (episodes, steps,
    successes). Used by ``run_local`` and by ``robot-rl edge``.
    """
    robot, task, reset = robot_parts
    robot_id = client.robot_id
    own_policy = copy.deepcopy(policy)
    streamer = EdgeStreamer(client, own_policy, segment_steps=run.segment_steps,
                            image_encoding=ImageEncoding(run.image_format))
    node = EdgeNode(robot, own_policy, WallClock(), run.edge, task=task, robot_id=robot_id, policy_version=0,
                    intervention=operator)
    if operator is not None:
        operator.bind(node)
    streamer.attach(node).start()
    episodes = steps = successes = 0
    try:
        if not streamer.link.wait_connected(10.0):
            log.warning("%s: learner not reachable yet; running anyway, segments wait in the spool", robot_id)
        for episode in range(run.episodes_per_robot):
            if stop is not None and stop():
                break
            instruction = reset(episode)
            if operator is not None:
                operator.begin_episode(episode)
            result = node.run_episode(run.max_steps, instruction, episode_id=episode)
            if on_episode is not None:
                on_episode(robot_id, result, node.policy_version)
            episodes += 1
            steps += result.num_steps
            successes += int(result.success)
            log.info("%s episode %d: %d steps, success=%s, policy v%d, late ticks so far %d", robot_id, episode,
                     result.num_steps, result.success, node.policy_version, node.stats.late_ticks)
        if not streamer.link.flush(30.0):
            log.warning("%s: not everything acked yet; the rest stays in the spool for next time", robot_id)
    finally:
        if versions is not None:
            versions[robot_id] = node.policy_version
        streamer.stop()
        node.close()
    return episodes, steps, successes
