"""A simulated robot's edge node in a process of its own, for ``run_local``'s ``robots: process``.

Why: on threads of the learner's process the robots' control loops, the operator and the
transport share one GIL with the trainer, whose every update also needs it between PyTorch ops.
A robot in its own process is what a deployment has anyway (an edge node reaches its learner
through its sockets only), and it leaves the learner's interpreter to the learner
(BENCHMARKS.md "learning": updates per second with robots on threads and in
processes).

The child gets a ``RobotJob`` (``spawn`` pickles it once, between our own processes: it holds
only local settings and the factories that build the robot and its operator) and answers over a
pipe with msgpack messages, never pickled objects:

- ``ready`` once its policy, robot and operator are built; it then waits for the go signal, so
  every robot's first episode starts at once, after the slow imports;
- ``episode`` after each episode: the counts a progress line and a learning curve need;
- ``done`` with its totals and the weights version it ended on, or ``error`` with a message.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from robot_rl.app.sim_edge import run_robot
from robot_rl.core.ctrl_c import ctrl_c_left_to_the_parent
from robot_rl.edge.remote_runner import RemoteInferenceConfig
from robot_rl.policies.loading import load_trainable

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # a cold child on a busy 2-core machine imports PyTorch, MuJoCo and the text encoder
STOP_POLL_S = 0.5  # how often the parent re-evaluates ``stop`` for the children


class RobotProcessError(RuntimeError):
    """A robot process failed or exited before it reported its totals."""


@dataclass(frozen=True)
class EpisodeSummary:
    """What the parent learns of a child's episode (the episode itself travels to the learner)."""

    robot_id: str
    episode_id: int
    num_steps: int
    success: bool
    intervention_steps: int
    stall_steps: int
    verdict_source: str  # who judged it as stored (``Episode.verdict_source``)
    verdict_success: bool  # the verdict stored, which may differ from ``success`` (what the sim says)
    asked: bool  # the operator was asked: the success detector was unsure


@dataclass(frozen=True)
class RobotJob:
    """Everything a child needs to run one edge node; picklable (``spawn`` sends it)."""

    index: int
    client: Any  # robot_rl.bridges.zmq.client.ClientConfig
    policy_dir: str | None  # the starting weights, saved by the parent (each robot loads its own copy); None: served
    run: Any  # robot_rl.app.local_run.LocalRunConfig
    robot_factory: Any  # robot_rl.app.sim_edge.RobotFactory, a picklable one (e.g. SimRobotFactory)
    operator_factory: Any = None  # robot_rl.app.sim_edge.OperatorFactory or None
    torch_threads: int = 1  # one inference at a time per robot: more threads only wait on each other
    # The policy's ``loading_options()``: what the saved weights do not say (a LeRobot policy's camera_map,
    # joint_names and tokenizer), so the robot's copy reads its cameras, joints and prompt as the parent's would.
    policy_options: dict[str, Any] = field(default_factory=dict)
    # The policy server the robot asks for its chunks instead (edge.inference_runner=remote): it loads no weights.
    served: RemoteInferenceConfig | None = None


class RobotProcesses:
    """Starts one child per job, relays their episodes to ``on_episode`` and collects their totals."""

    def __init__(self, jobs: list[RobotJob], on_episode: Callable[[str, EpisodeSummary, int], None] | None = None,
                 versions: dict[str, int] | None = None) -> None:
        self.jobs = jobs
        self._on_episode = on_episode
        self.versions = versions if versions is not None else {}
        self.results: list[tuple[int, int, int]] = []
        self.errors: list[BaseException] = []
        self._context = multiprocessing.get_context("spawn")  # never fork a process full of threads
        self._go = self._context.Event()
        self._stop = self._context.Event()
        self._processes: list[Any] = []
        self._readers: list[threading.Thread] = []
        self._ready = threading.Semaphore(0)
        self._lock = threading.Lock()

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start every child and return once all are ready (raises if one fails or is too slow)."""
        for job in self.jobs:
            parent_conn, child_conn = self._context.Pipe(duplex=False)
            process = self._context.Process(target=_child_main, args=(job, child_conn, self._go, self._stop),
                                            name=f"robot-{job.index}", daemon=True)
            try:
                with ctrl_c_left_to_the_parent():
                    process.start()
            except Exception as exc:  # a factory that does not pickle fails here, in the parent
                self.close()
                raise RobotProcessError(f"could not start robot {job.index} in a process: {exc} "
                                        "(its robot and operator factories must be picklable; "
                                        "or run the robots on threads: run.robots=thread)") from exc
            child_conn.close()  # only the child holds the sending end: its exit reads as EOF here
            reader = threading.Thread(target=self._read, args=(job, process, parent_conn),
                                      name=f"robot-{job.index}-reader", daemon=True)
            reader.start()
            self._processes.append(process)
            self._readers.append(reader)
        deadline = time.monotonic() + timeout_s
        for _ in self.jobs:
            if not self._ready.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                self.close()
                raise RobotProcessError(f"the robot processes were not ready within {timeout_s:.0f} s")
            if self.errors:
                self.close()
                raise self.errors[0]

    def go(self) -> None:
        """Let every ready robot start its first episode."""
        self._go.set()

    def run_until_done(self, stop: Callable[[], bool]) -> None:
        """Wait for every child; ``stop()`` (polled) tells them to start no new episode."""
        while any(r.is_alive() for r in self._readers):
            if stop():
                self._stop.set()
            for reader in self._readers:
                reader.join(STOP_POLL_S / max(len(self._readers), 1))

    def close(self, grace_s: float = 30.0) -> None:
        """Tell the children to stop and wait for them; kill any that do not exit in time."""
        self._stop.set()
        self._go.set()
        for process in self._processes:
            process.join(grace_s)
            if process.is_alive():
                log.warning("robot process %s did not exit within %.0f s; killing it", process.name, grace_s)
                process.kill()
                process.join(5.0)
        for reader in self._readers:
            reader.join(5.0)

    def _read(self, job: RobotJob, process, conn) -> None:
        robot_id = job.client.robot_id
        finished = False
        ready = False
        try:
            while True:
                try:
                    message = msgpack.unpackb(conn.recv_bytes(), raw=False)
                except (EOFError, OSError):
                    break
                kind = message.get("kind")
                if kind == "ready":
                    ready = True
                    self._ready.release()
                elif kind == "episode":
                    self._episode(robot_id, message)
                elif kind == "done":
                    with self._lock:
                        self.results.append(tuple(message["totals"]))
                        self.versions[robot_id] = int(message["version"])
                    finished = True
                elif kind == "error":
                    log.error("robot %s failed:\n%s", robot_id, message.get("traceback", ""))
                    self._fail(RobotProcessError(f"robot {robot_id}: {message['error']}"))
                    finished = True
        finally:
            conn.close()
            process.join(10.0)
            if not finished:
                self._fail(RobotProcessError(f"robot {robot_id}'s process exited (code {process.exitcode}) "
                                             "before it reported its totals"))
            if not ready:
                self._ready.release()  # ``start`` must not wait out its timeout for a child that is gone

    def _episode(self, robot_id: str, message: dict) -> None:
        version = int(message.pop("version"))
        message.pop("kind")
        summary = EpisodeSummary(robot_id=robot_id, **message)
        with self._lock:
            self.versions[robot_id] = version
        if self._on_episode is not None:
            try:
                self._on_episode(robot_id, summary, version)
            except Exception:  # a progress display must not lose the robot's totals
                log.exception("on_episode failed for %s", robot_id)

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            self.errors.append(error)


def _child_main(job: RobotJob, conn, go, stop) -> None:
    """The child: build the robot, report ready, wait for go, run the episodes, report totals."""
    logging.basicConfig(level=logging.WARNING, format=f"robot-{job.index} %(levelname)s %(name)s: %(message)s")

    def send(message: dict) -> None:
        conn.send_bytes(msgpack.packb(message, use_bin_type=True))

    try:
        torch.set_num_threads(job.torch_threads)
        policy = None if job.policy_dir is None else load_trainable(job.policy_dir, **job.policy_options)
        robot_id = job.client.robot_id
        versions: dict[str, int] = {}

        def on_episode(rid: str, episode, version: int) -> None:
            send({"kind": "episode", "episode_id": int(episode.episode_id), "num_steps": int(episode.num_steps),
                  "success": bool(episode.success), "intervention_steps": int(episode.intervention_steps),
                  "stall_steps": int(episode.stall_steps), "verdict_source": str(episode.verdict_source),
                  "verdict_success": bool(episode.verdict_success), "asked": bool(episode.asked),
                  "version": int(version)})

        def started() -> None:
            send({"kind": "ready"})
            go.wait()

        totals = run_robot(job.index, job.client, policy, job.run, job.robot_factory, versions, stop.is_set,
                           job.operator_factory, on_episode, on_ready=started, served=job.served)
        send({"kind": "done", "totals": list(totals), "version": versions.get(robot_id, 0)})
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent, which raises it
        with contextlib.suppress(OSError):
            send({"kind": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    finally:
        conn.close()
