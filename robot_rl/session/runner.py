"""Wire a session from the composed config: robot, policy, teleop hook, edge node, keys, recorder, learner."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from robot_rl.hardware.teleop import TakeoverBlender, TeleopIntervention
from robot_rl.hardware.teleop.keys import NoKeys, ScriptedKeys, TerminalKeys
from robot_rl.config import ConfigError, to_dataclass
from robot_rl.core.clock import VirtualClock, WallClock
from robot_rl.data import EpisodeRecorder
from robot_rl.edge import EdgeConfig, EdgeNode
from robot_rl.session import factory
from robot_rl.session.config import SessionConfig, TeleopConfig
from robot_rl.session.loop import OperatorSession
from robot_rl.session.status import StatusLine

log = logging.getLogger(__name__)


def run_session(cfg: DictConfig, learner: str | None = None) -> int:
    session_cfg = to_dataclass(cfg.get("session"), SessionConfig)
    teleop_cfg = to_dataclass(cfg.get("teleop"), TeleopConfig)
    edge_cfg = to_dataclass(cfg.get("edge"), EdgeConfig)
    backend = factory.robot_backend(cfg)
    robot = factory.make_robot(cfg)
    simulated = backend == "sim"
    if edge_cfg.fps != robot.fps:
        raise ConfigError(f"edge.fps={edge_cfg.fps} but the robot runs at {robot.fps} fps; set edge.fps={robot.fps}")
    clock = WallClock() if session_cfg.realtime or not simulated else VirtualClock()

    with contextlib.ExitStack() as stack:
        robot.connect()
        stack.callback(robot.disconnect)
        policy = factory.make_policy(cfg, len(robot.joint_names))
        teleop = factory.make_teleop(teleop_cfg, robot)
        teleop.connect()
        stack.callback(teleop.disconnect)
        blender = TakeoverBlender(robot.fps, teleop_cfg.blend_time_s, teleop_cfg.max_step_per_tick)
        hook = TeleopIntervention(teleop, blender)
        node = EdgeNode(robot, policy, clock, edge_cfg, task=robot if simulated else None, intervention=hook,
                        robot_id=getattr(robot, "name", None))
        stack.callback(node.close)
        hook.bind(node)
        if hasattr(robot, "set_plan_source"):  # ROS 2: send the rest of the plan as a trajectory
            robot.set_plan_source(lambda: [] if hook.intervening else [q.action for q in node.queue.pending()])
        streamer = _start_streamer(learner, robot, policy, node, session_cfg, stack)
        keys = _key_source(session_cfg)
        stack.callback(keys.close)
        # LeRobot's dataset writer takes seconds to import; pay that now, not while the
        # arm waits between the first two episodes.
        import lerobot.datasets.lerobot_dataset  # noqa: F401

        recorder = EpisodeRecorder(
            Path(session_cfg.dataset_root), robot.fps, tuple(robot.joint_names), factory.camera_shapes(robot),
            repo_id=session_cfg.repo_id, robot_type=getattr(robot, "name", "robot"),
        )
        session = OperatorSession(
            session_cfg, robot, node, hook, keys, recorder, clock,
            status=StatusLine(sys.stderr, session_cfg.status_interval_s), streamer=streamer,
            viewer=_viewer(session_cfg),
        )
        log.info("session config:\n%s", OmegaConf.to_yaml(cfg))
        result = session.run()
    return result.exit_code


def _key_source(config: SessionConfig):
    mode = config.keys
    if mode == "auto":
        mode = "terminal" if sys.stdin.isatty() else ("script" if config.key_script else "none")
    if mode == "terminal":
        return TerminalKeys()
    if mode == "script":
        return ScriptedKeys(config.key_script)
    return NoKeys()


def _start_streamer(learner: str | None, robot, policy, node, config: SessionConfig, stack: contextlib.ExitStack):
    """Stream episodes to a learner at ``learner`` (tcp://host:port); local recording happens regardless."""
    if learner is None:
        return None
    try:
        from robot_rl.bridges.zmq.client import ClientConfig
        from robot_rl.edge.streaming import EdgeStreamer
    except ImportError as exc:
        raise ConfigError(f"learner streaming is not available yet in this install: {exc}") from exc
    host = urlparse(learner).hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ConfigError(
            f"learner {learner} is not on loopback: the session only streams to a local learner for now; "
            "use `robot-rl edge` with CURVE keys for a remote learner"
        )
    client = ClientConfig(
        robot_id=str(getattr(robot, "name", "robot")), router_endpoint=learner, pub_endpoint=None,
        spool_dir=Path(config.dataset_root) / "spool", allow_insecure=True,
    )
    streamer = EdgeStreamer(client, policy if hasattr(policy, "parameters") else None).attach(node).start()
    stack.callback(streamer.stop)
    return streamer


def _viewer(config: SessionConfig):
    if not config.rerun:
        return None
    try:
        from robot_rl.session.viewer import RerunViewer
    except ImportError:
        log.warning("session.rerun=true but rerun-sdk is not installed (pip install rerun-sdk); no viewer")
        return None
    return RerunViewer()
