"""A live Rerun view of one edge node: cameras, measured and commanded joints, the plan it executes
and the next one it splices in, takeovers and weight versions.

The control thread only enqueues (``on_step``, ``on_plan``: a bounded queue, never a wait); a
logging thread turns each item into Rerun calls, which copy and encode images (milliseconds at
640x480) and would otherwise take that time out of a 33 ms tick. When the viewer or the disk
falls behind, the newest items are dropped and counted (``dropped``), never the robot's time.

Entities follow LeRobot's viewer (``lerobot.utils.rerun_visualization``) under one prefix per
robot, so several robots share one recording:

- ``ROBOT/observation.images.CAMERA``: each camera frame (JPEG unless ``compress_images`` is off);
- ``ROBOT/observation.state`` and ``ROBOT/action``: measured and commanded joints, one series each
  (named by joint);
- ``ROBOT/intervention`` (1 while a human drives) and ``ROBOT/policy_version``;
- ``ROBOT/plan/executing``, ``ROBOT/plan/next`` and ``ROBOT/plan/rolled_state``: at every splice, the
  plan the queue was executing and the new chunk, one line per joint, x in ticks from the splice
  (the new chunk starts at its roll-forward offset, where its rolled-forward start state is drawn).

Timelines: ``tick`` (the node's control ticks since it started, across episodes), ``episode``
and ``time`` (the step's clock, seconds).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from robot_rl.core.errors import ConfigError
from robot_rl.core.types import Step
from robot_rl.edge.viewer_config import NoViewerConfig, RerunMode, RerunViewerConfig

if TYPE_CHECKING:
    from robot_rl.edge.node import EdgeNode, PlanUpdate

log = logging.getLogger(__name__)

APP_ID = "robot_rl"
PLAN_COLOURS = ((140, 140, 140), (30, 120, 230))  # the plan being executed (grey), the next one (blue)
CLOSE_TIMEOUT_S = 10.0  # at the end, how long the logging thread may take to write what is queued


def no_view(config: NoViewerConfig, **_: Any) -> None:
    """``viewer=none``: nothing to log to."""
    return None


@dataclass(frozen=True)
class _Logged:
    index: int  # the node's tick count when it happened
    item: Step | PlanUpdate


def import_rerun() -> Any:
    """rerun-sdk, or a ConfigError saying how to get it (it comes with LeRobot's viz extra)."""
    try:
        import rerun as rr
    except ImportError as exc:
        raise ConfigError("viewer=rerun needs rerun-sdk: pip install 'robot-rl[edge]' (LeRobot's viz extra), "
                          "or run without viewer=rerun") from exc
    return rr


def open_recording(config: RerunViewerConfig, name: str) -> Any:
    """A Rerun recording stream going where ``config`` says (``name``: the ``.rrd`` file's stem in
    save mode). Streams with the same ``config.recording`` appear as one recording in the viewer."""
    rr = import_rerun()
    recording = rr.RecordingStream(APP_ID, recording_id=config.recording or str(uuid.uuid4()))
    if config.mode is RerunMode.save:
        directory = Path(config.dir)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.rrd"
        recording.save(path)
        log.info("Rerun: writing %s (open it with: rerun %s)", path, path)
    elif config.mode is RerunMode.spawn:
        # The viewer executable sits beside this interpreter (a venv that is not activated is not on PATH).
        beside = Path(sys.executable).with_name("rerun")
        try:
            rr.spawn(port=_port(config.url), memory_limit=config.memory_limit, recording=recording,
                     executable_path=str(beside) if beside.exists() else None)
        except RuntimeError as exc:
            raise ConfigError(f"viewer.mode=spawn could not start the Rerun viewer ({str(exc).splitlines()[0]}); "
                              f"on a machine without a display use viewer.mode=serve or viewer.mode=save") from exc
    elif config.mode is RerunMode.serve:
        url = rr.serve_grpc(grpc_port=_port(config.url), recording=recording)
        rr.serve_web_viewer(web_port=config.web_port, open_browser=False, connect_to=url)
        log.info("Rerun: serving %s; web viewer at http://HOST:%d", url, config.web_port)
    else:
        recording.connect_grpc(config.url)
    return recording


def start_viewer(config: Any, recording: str) -> tuple[Any, Any]:
    """For a run whose robots log from processes of their own: start the viewer (spawn) or the server
    (serve) here, once, and return (the config the robots log with, what to keep until the run
    ends). Anything but Rerun is handed back unchanged."""
    if not isinstance(config, RerunViewerConfig):
        return config, None
    robots = config.for_robots(recording)
    if config.mode not in (RerunMode.spawn, RerunMode.serve):
        return robots, None
    hub = open_recording(replace(config, recording=robots.recording), "run")
    return robots, hub


def _port(url: str) -> int:
    """The port of ``rerun+http://HOST:PORT/proxy``."""
    try:
        return int(url.rsplit(":", 1)[1].split("/", 1)[0])
    except (IndexError, ValueError) as exc:
        raise ValueError(f"viewer.url {url!r} has no port; write it as rerun+http://HOST:PORT/proxy") from exc


class RerunView:
    """``VIEWERS.build(config, robot_id=..., joint_names=...)``, then ``attach(node)``; ``close()`` at the end."""

    def __init__(self, config: RerunViewerConfig, *, robot_id: str, joint_names: tuple[str, ...]) -> None:
        self._rr = import_rerun()
        self.config = config
        self.robot_id = robot_id
        self.joint_names = tuple(joint_names)
        self.dropped = 0  # steps and plans the logging thread could not keep up with
        self._recording = open_recording(config, robot_id)
        self._queue: queue.Queue[_Logged | None] = queue.Queue(maxsize=config.queue_size)
        self._ticks = 0
        self._episode = -1
        self._log_static()
        self._thread = threading.Thread(target=self._run, name=f"rerun-{robot_id}", daemon=True)
        self._thread.start()

    def attach(self, node: EdgeNode) -> RerunView:
        """Log every step ``node`` records (beside its existing sink) and every plan it splices in."""
        previous = node.step_sink
        self._ticks = node.stats.ticks

        def sink(step: Step) -> None:
            if previous is not None:
                previous(step)
            self.on_step(step)

        node.step_sink = sink
        node.plan_sink = self.on_plan
        return self

    # ------------------------------------------------------------ control thread: enqueue only

    def on_step(self, step: Step) -> None:
        self._put(_Logged(self._ticks, step))
        self._ticks += 1

    def on_plan(self, update: PlanUpdate) -> None:
        self._put(_Logged(update.tick_index, update))

    def _put(self, item: _Logged) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    # ------------------------------------------------------------ logging thread

    def close(self) -> None:
        """Write what is queued (bounded by ``CLOSE_TIMEOUT_S``), then close the recording."""
        try:
            self._queue.put(None, timeout=CLOSE_TIMEOUT_S)
        except queue.Full:
            log.warning("Rerun view of %s: the logging thread is stuck; closing without the rest", self.robot_id)
        self._thread.join(CLOSE_TIMEOUT_S)
        if self.dropped:
            log.warning("Rerun view of %s: %d steps/plans dropped (the viewer could not keep up; "
                        "viewer.queue_size, or viewer.compress_images=false on a slow CPU)", self.robot_id,
                        self.dropped)
        self._recording.flush()
        self._recording.disconnect()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._log(item)
            except Exception:  # a viewer problem must never reach the robot
                log.exception("Rerun view of %s: logging failed; continuing", self.robot_id)

    def _log_static(self) -> None:
        rr, rec, names = self._rr, self._recording, list(self.joint_names)
        for entity in ("observation.state", "action"):
            rec.log(self._path(entity), rr.SeriesLines(names=names), static=True)

    def _path(self, entity: str) -> str:
        return f"{self.robot_id}/{entity}"

    def _log(self, logged: _Logged) -> None:
        rec = self._recording
        rec.set_time("tick", sequence=logged.index)
        if isinstance(logged.item, Step):
            self._log_step(logged.item)
        else:
            self._log_plan(logged.item)

    def _log_step(self, step: Step) -> None:
        rr, rec = self._rr, self._recording
        if step.tick == 0:
            self._episode += 1
        rec.set_time("episode", sequence=max(self._episode, 0))
        rec.set_time("time", duration=float(step.time_s))
        for camera, image in step.images.items():
            frame = rr.Image(np.asarray(image))
            rec.log(self._path(f"observation.images.{camera}"), frame.compress() if self.config.compress_images
                    else frame)
        rec.log(self._path("observation.state"), rr.Scalars(np.asarray(step.state, dtype=np.float64)))
        rec.log(self._path("action"), rr.Scalars(np.asarray(step.action, dtype=np.float64)))
        rec.log(self._path("intervention"), rr.Scalars(float(step.is_intervention)))
        rec.log(self._path("policy_version"), rr.Scalars(float(step.policy_version)))

    def _log_plan(self, update: PlanUpdate) -> None:
        rr, rec, names = self._rr, self._recording, list(self.joint_names)
        for entity, actions, start, colour in (("plan/executing", update.executing, 0, PLAN_COLOURS[0]),
                                               ("plan/next", update.chunk, update.start_offset, PLAN_COLOURS[1])):
            lines = _joint_lines(actions, start)
            rec.log(self._path(entity), rr.LineStrips2D(lines, labels=names[:len(lines)], colors=colour))
        if update.rolled_state is not None:
            rolled = np.asarray(update.rolled_state, dtype=np.float32)
            points = np.stack([np.full(len(rolled), float(update.start_offset)), rolled], axis=1)
            rec.log(self._path("plan/rolled_state"), rr.Points2D(points, radii=0.5))


def _joint_lines(actions: np.ndarray, start: int) -> list[np.ndarray]:
    """One (tick from the splice, joint value) line per joint; an empty plan gives none."""
    actions = np.asarray(actions, dtype=np.float32).reshape(len(actions), -1) if len(actions) else actions
    if not len(actions):
        return []
    ticks = np.arange(start, start + len(actions), dtype=np.float32)
    return [np.stack([ticks, actions[:, j]], axis=1) for j in range(actions.shape[1])]
