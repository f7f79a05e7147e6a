"""One simulated robot of the main job: its robot and operator built, then its ``EdgeRuntime`` run for
``LocalRunConfig.episodes_per_robot`` episodes. ``run_local`` calls it on a thread of the learner's
process or in a robot process of its own (``robot_rl.app.robot_process``); either way the robot runs
the edge runtime a real robot runs (``robot_rl.edge.runtime``): streamed as it acts, recorded locally.
Its chunks come from its own copy of the policy, or from a policy server (``served``) as a robot
without a GPU gets them.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.app.unattended_verdicts import run_judged_episode
from robot_rl.bridges.zmq.client import ClientConfig
from robot_rl.bridges.zmq.segments import ImageEncoding
from robot_rl.core.clock import WallClock
from robot_rl.core.layout import RecordedLayout
from robot_rl.core.registry import VIEWERS
from robot_rl.data.recorder import EpisodeRecorder
from robot_rl.edge.remote_runner import RemoteInferenceConfig, RemotePolicy
from robot_rl.edge.runtime import EdgeRuntime
from robot_rl.policies.trainable import TrainablePolicy

if TYPE_CHECKING:
    from robot_rl.app.config import LocalRunConfig

log = logging.getLogger(__name__)

# (robot index) -> (robot, task or None, reset(episode) -> instruction)
RobotFactory = Callable[[int], tuple[Any, Any, Callable[[int], str]]]
# (robot index, robot) -> an intervention hook with bind(node) and begin_episode(episode),
# e.g. robot_rl.hardware.teleop.TeleopIntervention around the scripted operator
OperatorFactory = Callable[[int, Any], Any]
# Called on the robot's thread after each episode: (robot_id, episode, policy version in use)
EpisodeCallback = Callable[[str, Any, int], None]

LINK_CONNECT_S = 10.0  # at a robot's start, how long to wait for the learner's hello before running without it
FINAL_ACK_S = 30.0  # after its last episode, how long a robot waits for the learner's acks (the rest stays spooled)
# A simulated robot's local dataset is finalized every this many episodes (and at its end): re-opening
# a LeRobot dataset costs seconds, which a robot that records episode after episode should not pay
# each time; a crash loses at most these episodes locally, never on the learner (the spool has them).
RECORD_FINALIZE_EVERY = 20


def run_robot(index: int, client: ClientConfig, policy: TrainablePolicy | None, run: LocalRunConfig,
              robot_factory: RobotFactory, versions: dict[str, int],
              stop: Callable[[], bool], operator_factory: OperatorFactory | None = None,
              on_episode: EpisodeCallback | None = None,
              on_ready: Callable[[], None] | None = None,
              served: RemoteInferenceConfig | None = None) -> tuple[int, int, int]:
    """Build robot ``index`` and its operator, then ``run_edge`` (on a thread or in a robot process)."""
    parts = robot_factory(index)
    operator = operator_factory(index, parts[0]) if operator_factory is not None else None
    try:
        return run_edge(client, policy, run, parts, versions, stop, operator=operator, on_episode=on_episode,
                        on_ready=on_ready, served=served)
    finally:
        # On this thread, which made its GL context: left to the garbage collector at exit,
        # EGL prints EGL_NOT_INITIALIZED tracebacks after the results.
        parts[0].disconnect()


def run_edge(client: ClientConfig, policy: TrainablePolicy | None, run: LocalRunConfig,
             robot_parts: tuple[Any, Any, Callable[[int], str]],
             versions: dict[str, int] | None = None,
             stop: Callable[[], bool] | None = None,
             operator: Any = None,
             on_episode: EpisodeCallback | None = None,
             on_ready: Callable[[], None] | None = None,
             served: RemoteInferenceConfig | None = None) -> tuple[int, int, int]:
    """One simulated robot's ``EdgeRuntime``: run ``run.episodes_per_robot`` episodes streaming to the
    learner in ``client`` (and recording them in ``run.record_dir``, when set).

    The robot acts with its own copy of ``policy``, or, given ``served``, with the chunks of that
    policy server (``edge.inference_runner=remote``; ``policy`` is then not needed). ``stop``
    (checked before each episode) ends the run early; ``on_ready`` is called once the runtime is
    built and linked, before the first episode (it may block: a start barrier).
    Returns (episodes, steps, successes). Used by ``run_local``, on a thread or in a robot process.
    """
    if served is None and policy is None:
        raise ValueError("run_edge needs a policy to copy or a policy server to ask (served)")
    own_policy = RemotePolicy(served) if served is not None else copy.deepcopy(policy)
    try:
        return _run_episodes(client, own_policy, run, robot_parts, versions, stop, operator, on_episode, on_ready)
    finally:
        if isinstance(own_policy, RemotePolicy):
            own_policy.close()


def _run_episodes(client: ClientConfig, own_policy: Any, run: LocalRunConfig,
                  robot_parts: tuple[Any, Any, Callable[[int], str]], versions: dict[str, int] | None,
                  stop: Callable[[], bool] | None, operator: Any, on_episode: EpisodeCallback | None,
                  on_ready: Callable[[], None] | None) -> tuple[int, int, int]:
    robot, task, reset = robot_parts
    robot_id = client.robot_id
    own_policy.bind_joints(robot.joint_names)  # a LeRobot checkpoint's joint_names: its vectors matched by name
    recorder = None
    if run.record_dir is not None:
        layout = RecordedLayout.of_robot(robot)
        recorder = EpisodeRecorder(Path(run.record_dir) / robot_id, layout.fps, layout.joint_names,
                                   layout.camera_shapes, repo_id=f"local/{robot_id}",
                                   robot_type=str(getattr(robot, "name", "robot")),
                                   finalize_every=RECORD_FINALIZE_EVERY)
    judged_unattended = run.verdicts is not None  # then the task's ground truth goes to the operator only
    if judged_unattended and task is None:
        raise ValueError(f"{robot_id}: judging its episodes as an unattended arm's needs a robot whose task "
                         "knows the ground truth, for the operator who labels them (the sim's)")
    runtime = EdgeRuntime(robot, own_policy, WallClock(), run.edge, robot_id=robot_id, client=client,
                          recorder=recorder, task=None if judged_unattended else task, intervention=operator,
                          segment_steps=run.segment_steps,
                          image_encoding=ImageEncoding(run.image_format),
                          view=VIEWERS.build(run.viewer, robot_id=robot_id, joint_names=tuple(robot.joint_names)),
                          record_behind=True)
    if operator is not None:
        operator.bind(runtime.node)
    episodes = steps = successes = 0
    try:
        runtime.start(LINK_CONNECT_S)
        if on_ready is not None:
            on_ready()
        for episode in range(run.episodes_per_robot):
            if stop is not None and stop():
                break
            instruction = reset(episode)
            if operator is not None:
                operator.begin_episode(episode)
            seed = getattr(robot, "scene_seed", None)
            if judged_unattended:
                result = run_judged_episode(runtime, task.is_success, run.verdicts, run.max_steps, instruction,
                                            episode_id=episode, seed=seed)
            else:
                result = runtime.run_episode(run.max_steps, instruction, episode_id=episode, seed=seed)
            if on_episode is not None:
                on_episode(robot_id, result, runtime.policy_version)
            episodes += 1
            steps += result.num_steps
            successes += int(result.success)
            log.info("%s episode %d: %d steps, success=%s, policy v%d, late ticks so far %d", robot_id, episode,
                     result.num_steps, result.success, runtime.policy_version, runtime.node.stats.late_ticks)
    finally:
        if versions is not None:
            versions[robot_id] = runtime.policy_version
        runtime.close(ack_timeout_s=FINAL_ACK_S)
    return episodes, steps, successes
