"""The replay store's dataset writer: in the learner's process, or in a process of its own.

Why a process of its own: in ``robot-rl run`` the trainer, the robots and the transport share
one Python process and so one GIL, and LeRobot's writer is Python-heavy (decode the staged
JPEGs, write PNGs, embed them into parquet, image statistics, ``resume`` and ``finalize``). In
3-minute runs of the same command the trainer made 4.0 updates/s with the writer in its
thread, 4.8 with it in its own process, and 5.4 with no writing until the end (BENCHMARKS.md
"store"). In its own process the writer still costs CPU, but not the GIL the trainer needs.

Both writers take an episode as its staged segments, the very frames that came over the wire
(``robot_rl.bridges.zmq``), decode them with the wire's own validating codec, and report the dataset
index and the outcome columns the store tracks. Between the processes only bytes travel:
msgpack messages over a pipe, never pickled objects.

A writer process that dies is not restarted in the same run: what it may have left torn is
rolled back by the next start (``repair_interrupted_write``), and until then episodes stay
staged (still trained on, never lost) rather than risk two writers' idea of the dataset's
episode count disagreeing.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import msgpack
import numpy as np

from robot_rl.bridges.zmq.protocol import Segment, decode_message
from robot_rl.bridges.zmq.segments import decode_segment
from robot_rl.core.heap import map_big_blocks
from robot_rl.core.parent_watch import exit_when_parent_dies
from robot_rl.core.priority import lower_own_priority
from robot_rl.core.types import EpisodeVerdict, Step
from robot_rl.data.frame_storage import FrameStorageConfig
from robot_rl.data.recorder import EpisodeRecorder

log = logging.getLogger(__name__)

WRITERS = ("thread", "process")
START_TIMEOUT_S = 120.0  # a cold child imports numpy, the wire codec and, at its first write, LeRobot
POLL_S = 1.0  # how often a waiting parent checks that the child is still alive
OUTCOME_COLUMNS = ("success", "is_intervention", "policy_version", "success_source", "success_confidence")


class EpisodeWriteError(RuntimeError):
    """An episode or a finalize the writer could not complete; the episodes stay staged."""


@dataclass(frozen=True)
class WrittenEpisode:
    """Where an episode went in the dataset and what the store's outcome tracker needs of it."""

    index: int
    outcome: dict[str, np.ndarray]  # OUTCOME_COLUMNS, one value per step


@dataclass(frozen=True)
class RecorderSpec:
    """What a writer needs to open the store's dataset: plain local settings, the only thing
    ``spawn`` pickles on its way to the child (episodes travel as msgpack)."""

    root: str
    fps: int
    joint_names: tuple[str, ...]
    cameras: dict[str, tuple[int, int]]
    repo_id: str
    frames: FrameStorageConfig = field(default_factory=FrameStorageConfig)

    def open(self) -> EpisodeRecorder:
        return EpisodeRecorder(Path(self.root), self.fps, self.joint_names, self.cameras, repo_id=self.repo_id,
                               frames=self.frames)


def _decode_staged(frames: Sequence[bytes]) -> list[Step]:
    message = decode_message(frames)
    if not isinstance(message, Segment):  # the store stages nothing but segments
        raise EpisodeWriteError(f"a staged record holds a {message.TYPE!r} message, not a segment")
    return decode_segment(message)


def write_staged(recorder: EpisodeRecorder, robot_id: str, episode_id: int, segments: Sequence[Sequence[bytes]],
                 verdict: EpisodeVerdict | None = None) -> WrittenEpisode:
    """Decode one episode's staged segments and save it into ``recorder`` without finalizing; ``verdict``
    (the learner's success detector's, on an episode nobody judged) replaces its last step's.

    Segment by segment: a segment's frames are decoded while the one before is being written, so the
    writer holds a segment of camera frames, not the episode (a minute of two 640x480 cameras is 3.3 GB)."""
    outcome: dict[str, list] = {name: [] for name in OUTCOME_COLUMNS}

    def recorded(step: Step) -> Step:
        for name in OUTCOME_COLUMNS:
            outcome[name].append(getattr(step, name))
        return step

    def steps() -> Iterator[Step]:
        held: Step | None = None  # one step behind: the last one takes the verdict
        for frames in segments:
            for step in _decode_staged(frames):
                if held is not None:
                    yield recorded(held)
                held = step
        if held is not None:
            if verdict is not None:
                verdict.apply([held])
            yield recorded(held)

    stream = steps()
    first = next(stream, None)
    if first is None:
        raise EpisodeWriteError(f"episode {episode_id} of robot {robot_id} has no steps to write")
    index = recorder.write_steps(first.instruction, first.scene_seed if first.scene_seed >= 0 else None,
                                 itertools.chain([first], stream), finalize=False)
    return WrittenEpisode(index, {name: np.array(values) for name, values in outcome.items()})


class ThreadEpisodeWriter:
    """Writes in the calling thread (tools, tests, and a learner that has the CPU to itself)."""

    def __init__(self, spec: RecorderSpec, nice: int = 0) -> None:
        self.recorder = spec.open()  # nice: the store's writer thread lowers its own priority

    @property
    def num_episodes(self) -> int:
        return self.recorder.num_episodes

    def write(self, robot_id: str, episode_id: int, segments: Sequence[Sequence[bytes]],
              verdict: EpisodeVerdict | None = None) -> WrittenEpisode:
        return write_staged(self.recorder, robot_id, episode_id, segments, verdict)

    def finalize(self) -> None:
        self.recorder.close()

    def close(self) -> None:
        self.recorder.close()


class ProcessEpisodeWriter:
    """Writes in a child process (started at the first write) so that it never holds the learner's GIL.

    The parent opens the dataset first (layout check, roll-back of a torn write, episode count):
    the store reads the dataset at start-up before any episode is written.
    """

    def __init__(self, spec: RecorderSpec, nice: int = 0) -> None:
        self.spec = spec
        self.nice = nice
        self._num_episodes = spec.open().num_episodes
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None  # set and cleared with _process
        self._dead: str | None = None  # why the child is gone, once it is
        self._lock = threading.Lock()  # one request at a time on the pipe

    @property
    def num_episodes(self) -> int:
        return self._num_episodes

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def write(self, robot_id: str, episode_id: int, segments: Sequence[Sequence[bytes]],
              verdict: EpisodeVerdict | None = None) -> WrittenEpisode:
        reply = self._request({"op": "write", "robot_id": robot_id, "episode_id": int(episode_id),
                               "segments": [[bytes(f) for f in frames] for frames in segments],
                               "verdict": None if verdict is None else [verdict.success, verdict.source,
                                                                        verdict.confidence]})
        return WrittenEpisode(int(reply["index"]), {
            name: np.asarray(reply["outcome"][name]) for name in OUTCOME_COLUMNS})

    def finalize(self) -> None:
        self._request({"op": "finalize"})

    def close(self) -> None:
        """Finalize and stop the child; waits for it (it may be finishing a batch)."""
        with self._lock:
            if self._process is None or self._conn is None:
                return
            process, conn = self._process, self._conn
            self._process = self._conn = None
        try:
            if self._dead is None:
                conn.send_bytes(msgpack.packb({"op": "stop"}))
                self._dead = "stopped"
                if not self._wait_reply(conn, process).get("ok"):
                    log.error("the dataset writer process could not finalize at stop; the batch stays staged")
        except EpisodeWriteError as exc:
            log.error("%s", exc)
        finally:
            conn.close()
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()

    # -- internals -----------------------------------------------------------------

    def _request(self, message: dict) -> dict:
        with self._lock:
            process, conn = self._ensure_started()
            try:
                conn.send_bytes(msgpack.packb(message, use_bin_type=True))
            except (BrokenPipeError, OSError) as exc:
                raise self._died(process, f"the pipe broke ({exc})") from exc
            reply = self._wait_reply(conn, process)
        self._num_episodes = int(reply.get("num_episodes", self._num_episodes))
        if not reply["ok"]:
            raise EpisodeWriteError(reply["error"])
        return reply

    def _ensure_started(self) -> tuple[BaseProcess, Connection]:
        if self._dead is not None:
            raise EpisodeWriteError(f"the dataset writer process is gone ({self._dead}); episodes stay staged "
                                    "and are written at the next start")
        if self._process is None or self._conn is None:
            context = multiprocessing.get_context("spawn")  # never fork a process full of threads
            parent_conn, child_conn = context.Pipe()
            process = context.Process(target=_serve, args=(child_conn, self.spec, self.nice),
                                      name="store-writer", daemon=True)
            process.start()
            child_conn.close()  # the parent keeps one end only, so a dead child reads as EOF
            self._process, self._conn = process, parent_conn
            ready = self._wait_reply(parent_conn, process, timeout_s=START_TIMEOUT_S)
            if not ready["ok"]:
                raise self._died(process, f"it could not open the dataset: {ready['error']}")
            log.info("dataset writer process %d started for %s", process.pid, self.spec.root)
        return self._process, self._conn

    def _wait_reply(self, conn: Connection, process: BaseProcess, timeout_s: float | None = None) -> dict:
        waited = 0.0
        while True:
            try:
                if conn.poll(POLL_S):
                    return msgpack.unpackb(conn.recv_bytes(), raw=False)
            except (EOFError, OSError) as exc:
                raise self._died(process, f"its pipe closed ({type(exc).__name__})") from exc
            if not process.is_alive():
                raise self._died(process, f"it exited with code {process.exitcode}")
            waited += POLL_S
            if timeout_s is not None and waited >= timeout_s:
                raise self._died(process, f"no answer within {timeout_s:.0f} s")

    def _died(self, process: BaseProcess, why: str) -> EpisodeWriteError:
        self._dead = why
        if process.is_alive():
            process.kill()
        log.error("the dataset writer process %s: %s; episodes stay staged until the next start", process.pid, why)
        return EpisodeWriteError(f"the dataset writer process is gone ({why}); episodes stay staged")


EpisodeWriter = ThreadEpisodeWriter | ProcessEpisodeWriter


def make_writer(kind: str, spec: RecorderSpec, nice: int = 0) -> EpisodeWriter:
    if kind not in WRITERS:
        raise ValueError(f"store writer must be one of {WRITERS}, got {kind!r}")
    return (ProcessEpisodeWriter if kind == "process" else ThreadEpisodeWriter)(spec, nice)


def _serve(conn, spec: RecorderSpec, nice: int) -> None:
    """The child: one request at a time, each answered with ``ok`` and the dataset's episode count.

    An operator's Ctrl-C reaches the whole process group: the child ignores it and lets the learner
    stop it (``close``: finalize, then stop), so the batch it is writing completes and no traceback
    of an interrupted write is printed. A learner that dies instead is noticed by ``exit_when_parent_dies``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # force: a spawned child re-imports the learner's main module, which may have set up INFO logging.
    logging.basicConfig(level=logging.WARNING, format="store-writer %(levelname)s %(name)s: %(message)s",
                        force=True)
    exit_when_parent_dies("the dataset writer")  # mid-write too: a restarted learner rolls the torn write back
    lower_own_priority(nice)
    map_big_blocks()  # it decodes every staged 640x480 frame
    try:
        recorder = spec.open()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send_bytes(msgpack.packb({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return
    conn.send_bytes(msgpack.packb({"ok": True, "num_episodes": recorder.num_episodes}))
    while True:
        try:
            request = msgpack.unpackb(conn.recv_bytes(), raw=False)
        except EOFError:
            # The learner died. No finalize: a restarted learner may already be opening the dataset;
            # it rolls back to the last finalize and writes the unfinalized episodes from staging.
            return
        op = request.get("op")
        try:
            if op == "write":
                said = request.get("verdict")
                verdict = None if said is None else EpisodeVerdict(bool(said[0]), str(said[1]), float(said[2]))
                written = write_staged(recorder, request["robot_id"], request["episode_id"], request["segments"],
                                       verdict)
                reply = {"ok": True, "index": written.index,
                         "outcome": {name: written.outcome[name].tolist() for name in OUTCOME_COLUMNS}}
            elif op in ("finalize", "stop"):
                recorder.close()
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": f"unknown request {op!r}"}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the parent as an error
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        reply["num_episodes"] = recorder.num_episodes
        try:
            conn.send_bytes(msgpack.packb(reply, use_bin_type=True))
        except OSError:  # the learner died while this request ran (BrokenPipeError): as above
            return
        if op == "stop":
            return
