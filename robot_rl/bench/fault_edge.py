"""The fault suite's robots: each a process of its own (so it can be killed with SIGKILL), streaming
synthetic episodes whose state encodes (robot, episode, tick), and writing a progress log of what it
submitted and what its link made durable.

A segment is durable once the link has spooled it (fsynced): from then on a crash of either side
must not lose it. Segments are spooled in submission order, so the link's ``segments_spooled``
counter says which ones are. A step submitted but not yet durable when the edge is killed lives
only in the edge's memory; the suite counts those apart (``steps_unspooled_at_edge_kills``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

FPS = 30
SEGMENT_STEPS = 10
JOINTS = tuple(f"joint{i}" for i in range(6))


@dataclass(frozen=True)
class EdgeSpec:
    """What one edge process needs: who it is, where the learner is, where it writes."""

    index: int
    root: str  # the suite's directory: keys/, spool/<robot>/, edge-<robot>-<n>.jsonl
    router: str
    pub: str
    config_hash: str
    episode_steps: int
    first_episode: int  # a restarted robot numbers its episodes past the ones it made before

    @property
    def robot_id(self) -> str:
        return f"robot-{self.index}"


def edge_main(spec: EdgeSpec, log_path: str, stop: Any) -> None:
    """Stream episodes at 30 fps until ``stop`` is set, then finish the episode, flush and log ``flushed``."""
    from robot_rl.bench.transport import CAMERAS, IMAGE, synthetic_frames
    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.bridges.zmq.keys import ClientCurve
    from robot_rl.bridges.zmq.segments import ImageEncoding
    from robot_rl.bridges.zmq.streaming import StreamingClient
    from robot_rl.core.parent_watch import exit_when_parent_dies
    from robot_rl.core.types import Step

    exit_when_parent_dies(f"the bench's {spec.robot_id}")
    root = Path(spec.root)
    curve = ClientCurve.from_files(root / "keys" / "robots" / f"{spec.robot_id}.key_secret",
                                   root / "keys" / "learner.key")
    features = {"fps": FPS, "joint_names": list(JOINTS), "cameras": {c: [IMAGE, IMAGE] for c in CAMERAS}}
    config = ClientConfig(robot_id=spec.robot_id, router_endpoint=spec.router, pub_endpoint=spec.pub, curve=curve,
                          spool_dir=root / "spool" / spec.robot_id, features=features, heartbeat_interval_s=0.5,
                          config_hash=spec.config_hash, ack_timeout_s=2.0, server_timeout_s=3.0, hello_retry_s=0.2)
    frames = synthetic_frames(30, spec.index)
    out = open(log_path, "a", buffering=1)  # noqa: SIM115 - line-buffered progress log, lives with the process
    link = StreamingClient(config, image_encoding=ImageEncoding("jpeg")).start()
    if link.wait_connected(120.0):  # then stream regardless: a robot records whether or not the learner is there
        out.write(json.dumps({"kind": "connected"}) + "\n")
    waiting: list[tuple[int, dict]] = []  # (submission number, entry): submitted, not yet known durable

    def note_durable() -> None:
        spooled = int(link.stats().get("segments_spooled", 0))
        while waiting and waiting[0][0] < spooled:
            out.write(json.dumps({**waiting.pop(0)[1], "kind": "durable"}) + "\n")

    submitted, episode = 0, spec.first_episode
    while not stop.is_set():
        for start in range(0, spec.episode_steps, SEGMENT_STEPS):
            ticks = list(range(start, min(start + SEGMENT_STEPS, spec.episode_steps)))
            steps = [Step(tick=t, time_s=t / FPS, state=np.array([spec.index, episode, t, 0, 0, 0], np.float32),
                          action=np.zeros(6, np.float32), images=frames[t % len(frames)],
                          done=t == spec.episode_steps - 1, reward=float(t == spec.episode_steps - 1))
                     for t in ticks]
            entry = {"kind": "submitted", "robot": spec.index, "episode": episode, "ticks": ticks}
            out.write(json.dumps(entry) + "\n")
            while not link.submit_steps(episode, steps, episode_done=steps[-1].done):
                time.sleep(0.05)  # the queue is full (learner away a long time): the steps wait here
            waiting.append((submitted, entry))
            submitted += 1
            deadline = time.monotonic() + len(steps) / FPS
            while time.monotonic() < deadline:
                time.sleep(0.01)
                note_durable()
        episode += 1
    flushed = link.flush(300.0)
    note_durable()
    if flushed:
        out.write(json.dumps({"kind": "flushed"}) + "\n")
    link.stop()
    out.close()


@dataclass
class EdgeProgress:
    """(robot, episode, tick) triples an edge's log says were submitted and made durable."""

    submitted: set[tuple[int, int, int]]
    durable: set[tuple[int, int, int]]
    connected: bool
    flushed: bool


def read_progress(path: Path) -> EdgeProgress:
    """An edge's progress log; a torn last line (the edge was killed while writing it) is ignored."""
    progress = EdgeProgress(set(), set(), False, False)
    for line in (path.read_text() if path.exists() else "").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry["kind"] in ("connected", "flushed"):
            setattr(progress, entry["kind"], True)
            continue
        triples = {(entry["robot"], entry["episode"], t) for t in entry["ticks"]}
        (progress.submitted if entry["kind"] == "submitted" else progress.durable).update(triples)
    return progress


class EdgeProcess:
    """One robot: start it, SIGKILL it mid-episode and start it again on its spool, or finish it cleanly."""

    def __init__(self, spec: EdgeSpec) -> None:
        self.spec = spec
        self._ctx = mp.get_context("spawn")
        self._stop: Any = None
        self.process: Any = None
        self.logs: list[Path] = []  # one per incarnation
        self.kills = 0

    def start(self, first_episode: int | None = None) -> EdgeProcess:
        if first_episode is not None:
            self.spec = replace(self.spec, first_episode=first_episode)
        log = Path(self.spec.root) / f"edge-{self.spec.robot_id}-{len(self.logs)}.jsonl"
        self.logs.append(log)
        self._stop = self._ctx.Event()
        self.process = self._ctx.Process(target=edge_main, args=(self.spec, str(log), self._stop),
                                         name=f"bench-{self.spec.robot_id}", daemon=True)
        self.process.start()
        return self

    def progress(self) -> EdgeProgress:
        """Everything this robot's incarnations logged, together."""
        total = EdgeProgress(set(), set(), False, False)
        for log in self.logs:
            one = read_progress(log)
            total.submitted |= one.submitted
            total.durable |= one.durable
            total.connected, total.flushed = one.connected, one.flushed  # the last incarnation's
        return total

    def current_progress(self) -> EdgeProgress:
        return read_progress(self.logs[-1])

    def kill(self) -> EdgeProgress:
        """SIGKILL; what the killed incarnation had logged (submitted, durable)."""
        self.process.kill()
        self.process.join(30)
        self.kills += 1
        return self.current_progress()

    def finish(self, timeout_s: float) -> bool:
        """Stop after the current episode; True once every step it submitted is acked (``flushed``)."""
        self._stop.set()
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
            return False
        return self.process.exitcode == 0 and self.current_progress().flushed


def wait_mid_episode(edge: EdgeProcess, timeout_s: float) -> bool:
    """Wait until ``edge`` has submitted part of an episode (not at its start or its end)."""
    steps = edge.spec.episode_steps
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        submitted = len(edge.current_progress().submitted)
        if submitted > 0 and SEGMENT_STEPS <= submitted % steps <= steps - 2 * SEGMENT_STEPS:
            return True
        time.sleep(0.05)
    return False
