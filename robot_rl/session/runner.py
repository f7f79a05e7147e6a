"""Wire an edge session from the configuration: robot, policy, teleop hook, keys, and the edge runtime.

Both commands, ``robot-rl session`` (an operator at the keys, a leader arm or a gamepad) and
``robot-rl edge`` (unattended: no teleop, no keys, verdicts from the task or the learner's success
detector), build the robot from
``robot=`` (the sim, a LeRobot robot, a ROS 2 arm) and run it through the one edge runtime
(``robot_rl.edge.runtime.EdgeRuntime``: node, learner link, local recorder) the main job's robots
run through too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.app.policies import load_policy
from robot_rl.bridges.zmq.client import ClientConfig
from robot_rl.calibration.latency import default_latency_path, read_latency_calibration
from robot_rl.core.clock import Clock, VirtualClock, WallClock
from robot_rl.core.errors import ConfigError
from robot_rl.core.layout import RecordedLayout
from robot_rl.core.registry import ROBOTS, TELEOPS, VIEWERS
from robot_rl.data.recorder import EpisodeRecorder
from robot_rl.data.validation import check_dataset
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.process_runner import spawn_policy
from robot_rl.edge.remote_runner import RemoteInferenceConfig, RemotePolicy
from robot_rl.edge.runtime import EdgeRuntime
from robot_rl.hardware.sim.config import SimConfig
from robot_rl.hardware.teleop import TakeoverBlender, TeleopIntervention
from robot_rl.hardware.teleop.base import NoTeleopConfig
from robot_rl.hardware.teleop.keys import NoKeys, ScriptedKeys, TerminalKeys
from robot_rl.policies.hold import HoldPolicyConfig
from robot_rl.session.config import SessionConfig
from robot_rl.session.loop import OperatorSession
from robot_rl.session.scenes import SceneDraw
from robot_rl.session.status import StatusLine

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)

LINK_CONNECT_S = 5.0  # at the start, how long to wait for the learner's hello before recording without it


def check_policy_choice(cfg: RobotRLConfig) -> None:
    """A real arm runs only weights someone named: ``policy.path``, or a policy without weights
    (``policy=hold``). The fallbacks the sim jobs use (the BC checkpoint, the shipped one) were
    trained in the sim, on its cameras and its physics; on a real arm they would move it without
    anyone having chosen them."""
    if isinstance(cfg.robot, SimConfig) or not hasattr(cfg.policy, "path") or cfg.policy.path:
        return
    raise ConfigError("policy.path is not set: a real robot runs only a checkpoint you name "
                      "(policy.path=outputs/bc_policy), or policy=hold for a dry run without a model")


def run_session(cfg: RobotRLConfig) -> int:
    """Run ``cfg.session`` on ``cfg.robot``; stream to ``cfg.link.learner`` if set. Returns the exit code."""
    check_policy_choice(cfg)
    session_cfg, teleop_cfg = cfg.session, cfg.teleop
    simulated = isinstance(cfg.robot, SimConfig)
    robot = ROBOTS.build(cfg.robot)
    if getattr(cfg.robot, "undistort", None):
        from robot_rl.calibration.camera import UndistortingRobot  # OpenCV: the calibration extra

        robot = UndistortingRobot(robot, dict(cfg.robot.undistort))
    if cfg.edge.fps != robot.fps:
        raise ConfigError(f"edge.fps={cfg.edge.fps} but the robot runs at {robot.fps} fps; set edge.fps={robot.fps}")
    clock = WallClock() if session_cfg.realtime or not simulated else VirtualClock()
    robot_name = str(getattr(robot, "name", "robot"))
    # The learner's link, checked (addresses, keys) before anything moves; the hello says what
    # this robot records, so the learner needs no robot settings.
    client = None
    if cfg.link.learner:
        layout = RecordedLayout.of_robot(robot)
        client = dataclasses.replace(cfg.link.client_config(robot_name, cfg.output_dir),
                                     features=layout.to_document())
        if not teaches(cfg):
            log.warning("policy=hold without teleop: a dry run, the link's settings checked but nothing sent to %s",
                        cfg.link.learner)
            client = None
    edge_cfg = with_latency_calibration(cfg.edge, cfg.output_dir, robot_name)

    with contextlib.ExitStack() as stack:
        robot.connect()
        stack.callback(robot.disconnect)
        policy = build_policy(cfg, clock, robot_name)
        if hasattr(policy, "close"):  # a policy process, if the node never gets to own it
            stack.callback(policy.close)
        check_policy_fits(policy, robot)
        scenes = SceneDraw.for_sim(session_cfg.seed, cfg.task_families) if simulated else SceneDraw(None)
        warm_up(policy, robot, session_cfg.instruction)
        teleop = TELEOPS.build(teleop_cfg, robot)
        teleop.connect()
        stack.callback(teleop.disconnect)
        blender = TakeoverBlender(robot.fps, teleop_cfg.blend_time_s, teleop_cfg.max_step_per_tick)
        hook = TeleopIntervention(teleop, blender)
        client = _with_config_hash(client, policy) if client is not None else None
        view = VIEWERS.build(cfg.viewer, robot_id=cfg.link.robot_id or robot_name, joint_names=tuple(robot.joint_names))
        runtime = EdgeRuntime(robot, policy, clock, edge_cfg, robot_id=client.robot_id if client else robot_name,
                              client=client,
                              recorder=_recorder(session_cfg, robot), task=robot if simulated else None,
                              intervention=hook, view=view)
        stack.callback(runtime.close, session_cfg.final_ack_timeout_s)
        hook.bind(runtime.node)
        if hasattr(robot, "set_plan_source"):  # ROS 2: send the rest of the plan as a trajectory
            robot.set_plan_source(lambda: [] if hook.intervening else [q.action for q in runtime.node.queue.pending()])
        runtime.start(LINK_CONNECT_S)
        keys = _key_source(session_cfg)
        stack.callback(keys.close)
        session = OperatorSession(
            session_cfg, robot, runtime, hook, keys, clock,
            status=StatusLine(sys.stderr, session_cfg.status_interval_s), scenes=scenes,
            log_path=session_cfg.log_path,
        )
        result = session.run()
    return result.exit_code


def teaches(cfg: RobotRLConfig) -> bool:
    """Whether this robot's steps can teach the learner anything. An arm held still (``policy=hold``)
    with no teleop to take over acts by neither a model nor a person: a dry run of the robot, its
    cameras and the local recorder, whose link settings (addresses, keys) are checked but which
    streams nothing and fetches no weights (a learner would train on still arms; it also admits only
    robots that run its model's config hash, which a policy without weights has none of)."""
    return not (isinstance(cfg.policy, HoldPolicyConfig) and isinstance(cfg.teleop, NoTeleopConfig))


def build_policy(cfg: RobotRLConfig, clock: Clock, robot_name: str) -> Any:
    """The configured policy. On the wall clock (``edge.inference_runner`` auto or process) a policy
    that computes is built in a process of its own, which then also loads published weights: nothing
    of inference or of a swap shares the control loop's interpreter. A virtual clock keeps it here,
    where the virtual runner's timing is exact. ``remote``: the policy server at ``link.policy_server``."""
    runner = cfg.edge.inference_runner
    if runner == "remote":
        return RemotePolicy(RemoteInferenceConfig.from_link(cfg.link, robot_name))
    computes = not isinstance(cfg.policy, HoldPolicyConfig)  # holding the arm costs nothing worth a process
    if runner == "process" or (runner == "auto" and not clock.is_virtual and computes):
        return spawn_policy(functools.partial(load_policy, cfg))
    return load_policy(cfg)


def check_policy_fits(policy: Any, robot: Any) -> None:
    """The policy reads cameras the robot has and drives as many joints as it has; one line if not."""
    cameras = tuple(getattr(policy, "cameras", ()))  # a trainable policy's (FlowVLA, LeRobot); hold reads none
    missing = [c for c in cameras if c not in robot.camera_names]
    if missing:
        raise ConfigError(f"the policy reads cameras {list(cameras)} but robot {robot.name!r} has "
                          f"{list(robot.camera_names)}: add {missing} to robot.cameras")
    action_dim = getattr(policy, "action_dim", len(robot.joint_names))
    if action_dim != len(robot.joint_names):
        raise ConfigError(f"the policy drives {action_dim} joints but robot {robot.name!r} has "
                          f"{len(robot.joint_names)} {list(robot.joint_names)}")
    bind_joints = getattr(policy, "bind_joints", None)  # a trainable policy's; hold has no joints of its own
    if bind_joints is not None:
        bind_joints(robot.joint_names)  # a LeRobot checkpoint's joint_names: states and actions matched by name


def warm_up(policy: Any, robot: Any, instruction: str) -> float:
    """One inference on the robot's real observation before tick 0 (nothing is sent to the arm):
    loads the instruction encoder, allocates the model's buffers and compiles its kernels, so the
    first chunk of the session costs what every later one does and the delay estimator never
    sees a cold start. Returns the warm-up's seconds."""
    started = time.perf_counter()
    observation = robot.get_observation()
    policy.predict_chunk(observation["images"], observation["state"], instruction or "warm up")
    seconds = time.perf_counter() - started
    log.info("policy warmed up in %.2f s (one inference before the first tick)", seconds)
    return seconds


def with_latency_calibration(edge: EdgeConfig, output_dir: str, robot_name: str) -> EdgeConfig:
    """``edge`` with the delay prior and command lag ``robot-rl calibrate latency`` measured for
    this robot, read from ``edge.latency_calibration`` (default: the file that command writes for it)."""
    path = Path(edge.latency_calibration) if edge.latency_calibration else default_latency_path(output_dir, robot_name)
    if not path.exists():
        if edge.latency_calibration:
            raise ConfigError(f"edge.latency_calibration={path} does not exist; run `robot-rl calibrate latency`")
        return edge
    prior, lag = read_latency_calibration(path)
    log.info("delay prior %d ticks, command lag %d ticks from %s (robot-rl calibrate latency)", prior, lag, path)
    return dataclasses.replace(edge, delay_prior_ticks=prior, command_lag_ticks=lag)


def _recorder(config: SessionConfig, robot: Any) -> EpisodeRecorder:
    check_dataset(config.dataset_root)  # a damaged file of the robot's dataset is one line naming it
    layout = RecordedLayout.of_robot(robot)
    return EpisodeRecorder(
        Path(config.dataset_root), layout.fps, layout.joint_names, layout.camera_shapes,
        repo_id=config.repo_id, robot_type=getattr(robot, "name", "robot"), frames=config.frames,
    )


def _key_source(config: SessionConfig) -> Any:
    mode = config.keys
    if mode == "auto":
        mode = "terminal" if sys.stdin.isatty() else ("script" if config.key_script else "none")
    if mode == "terminal":
        return TerminalKeys()
    if mode == "script":
        return ScriptedKeys(config.key_script)
    return NoKeys()


def _with_config_hash(client: ClientConfig, policy: Any) -> ClientConfig:
    """The policy's config hash goes in the hello, so a learner that trains another model refuses the
    robot, and the session says so in one line."""
    config_hash = policy.config_hash() if hasattr(policy, "config_hash") else ""  # "": a policy without weights
    return dataclasses.replace(client, config_hash=config_hash) if config_hash else client
