"""Scripted-expert demonstrations with the sim in a child process and the writer in this one.

Why: a demonstration frame costs about as much in LeRobot's dataset writer (PNG encoding,
embedding the images into parquet, per-episode statistics) as in the sim (rendering two cameras,
the expert's inverse kinematics). In one process they take turns; with the sim in a child they
overlap: on two cores the 240 demonstrations of a first `make demo` took 195 s against 335 s
(10.7 against 18.4 ms a frame; BENCHMARKS.md, "sim").

The child runs the same attempts in the same seed order as a serial recording
(``app.demos.expert_attempts``) and sends each back over a pipe as a ``segment`` message with raw
images (``robot_rl.bridges.zmq.segments``: msgpack, lossless, never pickled); this process writes them with
the same ``store_demos``. So the dataset is the serial recording's, frame for frame
(tests/test_demo_process.py). The pipe holds at most one episode: the child simulates the next
while this process writes the last, and waits when it gets ahead.

Messages, child -> parent, each a msgpack map (an episode's segment follows its header as frames):
``layout`` (fps, joints, cameras) once the sim is built; ``episode`` (family, seed, success,
number of frames) per attempt; ``done``; or ``error`` with the child's traceback.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from robot_rl.app.demos import DemoSummary, expert_attempts, store_demos
from robot_rl.app.sim import demo_expert
from robot_rl.bridges.zmq.protocol import Segment, decode_message, encode_message
from robot_rl.bridges.zmq.segments import ImageEncoding, decode_segment, encode_segment
from robot_rl.core.layout import RecordedLayout
from robot_rl.core.types import Episode
from robot_rl.hardware.sim.config import SimConfig
from robot_rl.hardware.sim.robot import SimSO101


class DemoProcessError(RuntimeError):
    """The demonstration sim process failed or exited early; what was written stays finalized."""


@dataclass(frozen=True)
class DemoJob:
    """What the child needs to simulate the attempts; picklable (``spawn`` sends it once)."""

    robot: SimConfig
    expert_speed: float
    families: tuple[str, ...]
    episodes_per_family: int
    seed: int
    stride: int  # between the families' seed ranges
    noise_deg: float = 0.0  # DART's noise (``expert_episode``)


def record_demos_in_child(job: DemoJob, out_dir: str | Path, progress: bool = True) -> DemoSummary:
    """Record ``job``'s demonstrations into ``out_dir``: the sim in a child, the writer here."""
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold threads
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child_main, args=(job, sender), name="demo-sim", daemon=True)
    process.start()
    sender.close()  # only the child holds the sending end: its exit reads as EOF here
    try:
        layout = _receive_layout(receiver, process)
        attempts = _receive_attempts(receiver, process)
        return store_demos(attempts, layout, out_dir, job.families, job.episodes_per_family, progress)
    finally:
        if process.is_alive():
            process.terminate()  # e.g. the writer failed, or Ctrl-C: the child may be blocked sending
        process.join(10.0)
        receiver.close()


# ------------------------------------------------------------------ parent side


def _receive(receiver, process) -> dict[str, Any]:
    try:
        message = msgpack.unpackb(receiver.recv_bytes(), raw=False)
    except EOFError:
        process.join(5.0)
        raise DemoProcessError(f"the demonstration sim process exited (code {process.exitcode}) "
                               "before it finished; the episodes already written are kept") from None
    if not isinstance(message, dict) or "type" not in message:
        raise DemoProcessError(f"unexpected message from the demonstration sim process: {message!r:.200}")
    if message["type"] == "error":
        raise DemoProcessError(f"the demonstration sim process failed:\n{message.get('message', '')}")
    return message


def _receive_layout(receiver, process) -> RecordedLayout:
    message = _receive(receiver, process)
    if message["type"] != "layout":
        raise DemoProcessError(f"expected the sim's layout first, got {message['type']!r}")
    return RecordedLayout.from_document(message["layout"])


def _receive_attempts(receiver, process) -> Iterator[tuple[str, Episode]]:
    while True:
        message = _receive(receiver, process)
        if message["type"] == "done":
            return
        if message["type"] != "episode":
            raise DemoProcessError(f"unexpected message {message['type']!r} from the demonstration sim process")
        segment = decode_message([receiver.recv_bytes() for _ in range(int(message["frames"]))])
        if not isinstance(segment, Segment):
            raise DemoProcessError(f"expected an episode's segment, got {segment.TYPE!r}")
        steps = decode_segment(segment)
        episode = Episode(segment.robot_id, segment.episode_id, message["instruction"], task_family=message["family"],
                          steps=steps, success=bool(message["success"]), seed=int(message["seed"]))
        yield message["family"], episode


# ------------------------------------------------------------------ child side


def _child_main(job: DemoJob, sender) -> None:
    def send(message: dict[str, Any]) -> None:
        sender.send_bytes(msgpack.packb(message, use_bin_type=True))

    robot = None
    try:
        robot = SimSO101(job.robot)
        robot.connect()
        send({"type": "layout", "layout": RecordedLayout.of_robot(robot).to_document()})
        expert = demo_expert(robot, job.expert_speed)
        attempts = expert_attempts(robot, expert, job.families, job.episodes_per_family, job.seed, job.stride,
                                   job.noise_deg)
        for family, episode in attempts:
            _send_episode(send, sender, family, episode)
        send({"type": "done"})
    except BaseException:  # noqa: BLE001 - the parent reports it; a child's traceback is lost otherwise
        # If the pipe is broken, the parent has gone (it terminates us when it stops reading).
        with contextlib.suppress(BrokenPipeError, OSError):
            send({"type": "error", "message": traceback.format_exc()})
    finally:
        if robot is not None:
            robot.disconnect()
        sender.close()


def _send_episode(send, sender, family: str, episode: Episode) -> None:
    if episode.seed is None:  # expert_attempts seeds every attempt; the parent rebuilds the episode with it
        raise DemoProcessError(f"demonstration attempt {episode.episode_id} has no seed")
    segment = encode_segment(episode.robot_id, episode.episode_id, 0, episode.steps, episode_done=True,
                             image_encoding=ImageEncoding("raw"))
    frames = encode_message(segment)
    send({"type": "episode", "family": family, "seed": int(episode.seed), "success": bool(episode.success),
          "instruction": episode.instruction, "frames": len(frames)})
    for frame in frames:
        sender.send_bytes(frame)
