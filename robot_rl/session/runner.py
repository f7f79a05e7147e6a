"""Wire a session from the configuration: robot, policy, teleop hook, edge node, keys, recorder, learner."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.core.clock import VirtualClock, WallClock
from robot_rl.core.errors import ConfigError
from robot_rl.core.registry import ROBOTS, TELEOPS
from robot_rl.hardware.sim.config import SimConfig
from robot_rl.session.config import SessionConfig

if TYPE_CHECKING:
    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)

LINK_FLUSH_S = 10.0  # at the session's end, how long to wait for the learner to ack what was streamed


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
    from robot_rl.app.policies import load_policy
    from robot_rl.data.recorder import EpisodeRecorder
    from robot_rl.edge import EdgeNode
    from robot_rl.hardware.teleop import TakeoverBlender, TeleopIntervention
    from robot_rl.session.loop import OperatorSession
    from robot_rl.session.status import StatusLine

    check_policy_choice(cfg)
    session_cfg, teleop_cfg = cfg.session, cfg.teleop
    simulated = isinstance(cfg.robot, SimConfig)
    robot = ROBOTS.build(cfg.robot)
    if cfg.edge.fps != robot.fps:
        raise ConfigError(f"edge.fps={cfg.edge.fps} but the robot runs at {robot.fps} fps; set edge.fps={robot.fps}")
    clock = WallClock() if session_cfg.realtime or not simulated else VirtualClock()
    # The learner's link, checked (addresses, keys) before anything moves.
    client = cfg.link.client_config(str(getattr(robot, "name", "robot")), cfg.output_dir) if cfg.link.learner else None

    with contextlib.ExitStack() as stack:
        robot.connect()
        stack.callback(robot.disconnect)
        policy = load_policy(cfg)
        teleop = TELEOPS.build(teleop_cfg, robot)
        teleop.connect()
        stack.callback(teleop.disconnect)
        blender = TakeoverBlender(robot.fps, teleop_cfg.blend_time_s, teleop_cfg.max_step_per_tick)
        hook = TeleopIntervention(teleop, blender)
        node = EdgeNode(robot, policy, clock, cfg.edge, task=robot if simulated else None, intervention=hook,
                        robot_id=getattr(robot, "name", None))
        stack.callback(node.close)
        hook.bind(node)
        if hasattr(robot, "set_plan_source"):  # ROS 2: send the rest of the plan as a trajectory
            robot.set_plan_source(lambda: [] if hook.intervening else [q.action for q in node.queue.pending()])
        streamer = _start_streamer(client, policy, node, stack) if client is not None else None
        keys = _key_source(session_cfg)
        stack.callback(keys.close)
        # LeRobot's dataset writer takes seconds to import; pay that now, not while the
        # arm waits between the first two episodes.
        import lerobot.datasets.lerobot_dataset  # noqa: F401 - imported for its import time only

        recorder = EpisodeRecorder(
            Path(session_cfg.dataset_root), robot.fps, tuple(robot.joint_names), camera_shapes(robot),
            repo_id=session_cfg.repo_id, robot_type=getattr(robot, "name", "robot"),
        )
        session = OperatorSession(
            session_cfg, robot, node, hook, keys, recorder, clock,
            status=StatusLine(sys.stderr, session_cfg.status_interval_s), streamer=streamer,
            viewer=_viewer(session_cfg),
        )
        result = session.run()
    return result.exit_code


def camera_shapes(robot: Any) -> dict[str, tuple[int, int]]:
    """(H, W) of each camera, for the recorder."""
    shapes = getattr(robot, "camera_shapes", None)
    if shapes is not None:
        return dict(shapes)
    features = robot.observation_features
    return {cam: (int(features[cam][0]), int(features[cam][1])) for cam in robot.camera_names}


def _key_source(config: SessionConfig) -> Any:
    from robot_rl.hardware.teleop.keys import NoKeys, ScriptedKeys, TerminalKeys

    mode = config.keys
    if mode == "auto":
        mode = "terminal" if sys.stdin.isatty() else ("script" if config.key_script else "none")
    if mode == "terminal":
        return TerminalKeys()
    if mode == "script":
        return ScriptedKeys(config.key_script)
    return NoKeys()


def _start_streamer(client: ClientConfig, policy: Any, node: Any, stack: contextlib.ExitStack) -> Any:
    """Stream episodes to the learner (``link``); local recording happens regardless. The policy's
    config hash goes with them, so a learner that trains another model refuses them."""
    from robot_rl.edge.streaming import EdgeStreamer

    if hasattr(policy, "config_hash"):
        client = dataclasses.replace(client, config_hash=policy.config_hash())
    streamer = EdgeStreamer(client, policy if hasattr(policy, "parameters") else None).attach(node).start()

    def finish() -> None:
        # The last episode is written locally already; give the learner a bounded moment to ack it.
        if not streamer.link.flush(LINK_FLUSH_S):
            log.warning("not every segment reached the learner yet; the rest waits in %s for the next session",
                        client.spool_dir)
        streamer.stop()

    stack.callback(finish)
    return streamer


def _viewer(config: SessionConfig) -> Any:
    if not config.rerun:
        return None
    try:
        from robot_rl.session.viewer import RerunViewer
    except ImportError:
        log.warning("session.rerun=true but rerun-sdk is not installed (pip install rerun-sdk); no viewer")
        return None
    return RerunViewer()
