"""`robot-rl bench faults`: the fault suite. Nothing acked lost, nothing poisoned, nobody impersonated,
always restartable, measured on loopback in bounded time.

One run, on a learner in a process of its own (CURVE on loopback, training behaviour cloning, a
store on disk) with ``bench.robots`` edges streaming synthetic episodes whose state encodes
(robot, episode, tick):

1. **fuzz**: an authenticated intruder sends ``bench.fuzz_messages`` malformed messages in 21
   classes (``fault_fuzz.py``) on the learner's ROUTER while the edges stream, probing every 250
   that a valid request is still answered; then ``bench.impersonation_tries`` rounds of attempts to
   speak as a robot (hello as it, segments labelled as it, a guessed routing id).
2. **kills**: ``bench.kills`` times, the learner is killed with SIGKILL mid-stream and restarted on
   the same disk; each restart is timed from process start to serving (``restart_s``), and the
   learner's peak memory is read before each kill (VmHWM).
3. **files**: a checkpoint with 4 KB of NaN bytes and a truncated one must be refused on resume;
   a spool with a garbled record must keep every other record; a spool whose write fails half way
   (a full disk) must keep every record written before and after it.

Then every edge flushes, the learner stops cleanly, and the store is read back: ``lost_steps``
(submitted, never stored), ``duplicated_steps``, ``poisoned_rows`` (fuzz-marked or non-finite rows
stored), ``impersonations_admitted`` (attempts answered with an ack or hello_ok, plus stored rows
marked as the intruder's). ``passed`` is true when all of them are zero where they should be.
Not run here: an edge killed mid-episode and a network cut (``tests/test_learner_crash.py`` and
``tests/test_stream_edge.py`` cover them).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from robot_rl.bench.configs import FaultsBenchConfig
from robot_rl.bench.progress import timed_run
from robot_rl.bench.transport import CAMERAS, IMAGE, synthetic_frames

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)

JOINTS = tuple(f"joint{i}" for i in range(6))
FPS = 30
SEGMENT_STEPS = 10
READY_TIMEOUT_S = 180.0  # a cold learner imports torch and LeRobot and reads its store


# ============================================================== the learner, in a process of its own


def _learner_main(root: str, router: str, pub: str, ready: str) -> None:
    """Serve until SIGTERM (then stop cleanly); write ``ready`` once serving."""
    from robot_rl.core.parent_watch import exit_when_parent_dies

    exit_when_parent_dies("the bench's learner")
    logging.basicConfig(level=logging.INFO, filename=f"{root}/learner.log",
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    import torch

    from robot_rl.bench.transport import ballast_policy
    from robot_rl.learner.config import LearnerConfig, ServiceConfig, StoreConfig, TrainerConfig
    from robot_rl.learner.service import LearnerService

    torch.set_num_threads(1)
    config = LearnerConfig(
        store=StoreConfig(root=f"{root}/store", episode_timeout_s=2.0, commit_linger_s=0.0),
        trainer=TrainerConfig(device="cpu", log_dir="", checkpoint_dir=f"{root}/ckpt", batch_size=8,
                              min_steps_to_train=32, publish_every_s=2.0, checkpoint_every_updates=10**9,
                              online_ratio=1.0, intervention_ratio=0.0, demonstration_ratio=0.0, thread_nice=10),
        service=ServiceConfig(router_endpoint=router, pub_endpoint=pub, heartbeat_interval_s=0.5,
                              secret_key=f"{root}/keys/learner.key_secret", robot_keys_dir=f"{root}/keys/robots"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with LearnerService(config, ballast_policy(0.0), train=True) as service:
        service.start()
        Path(ready).write_text(str(os.getpid()))
        stop.wait()
        service.stop()


class LearnerProcess:
    """Start, kill and restart the learner on one disk; the time each start took to serve."""

    def __init__(self, root: Path, router: str, pub: str) -> None:
        self.root, self.router, self.pub = root, router, pub
        self._ctx = mp.get_context("spawn")
        self.process: Any = None
        self.restart_s: list[float] = []
        self.peak_rss_mb = 0.0

    def start(self) -> float:
        ready = self.root / f"ready-{len(self.restart_s)}"
        started = time.monotonic()
        # Not a daemon: the learner starts a dataset-writer process of its own (and ends with the bench:
        # parent_watch, and run_suite kills it on the way out).
        self.process = self._ctx.Process(target=_learner_main, name="bench-learner",
                                         args=(str(self.root), self.router, self.pub, str(ready)))
        self.process.start()
        while not ready.exists():
            if not self.process.is_alive():
                raise RuntimeError(f"bench faults: the learner exited ({self.process.exitcode}); "
                                   f"see {self.root / 'learner.log'}")
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise TimeoutError(f"bench faults: the learner was not serving within {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        took = time.monotonic() - started
        self.restart_s.append(took)
        return took

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def kill(self) -> None:
        self._note_rss()
        self.process.kill()
        self.process.join(30)

    def stop(self) -> int | None:
        self._note_rss()
        self.process.terminate()  # SIGTERM: a clean stop, every closed episode written
        self.process.join(600)
        return self.process.exitcode

    def _note_rss(self) -> None:
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return
        peak = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), "0")
        self.peak_rss_mb = max(self.peak_rss_mb, int(peak) / 1024)


# ============================================================== edges: synthetic episodes, (robot, episode, tick)


class Edge:
    """A robot streaming episodes of ``episode_steps`` at 30 fps from a thread; remembers every step submitted."""

    def __init__(self, index: int, root: Path, router: str, pub: str, episode_steps: int, config_hash: str) -> None:
        from robot_rl.bridges.zmq.client import ClientConfig
        from robot_rl.bridges.zmq.keys import ClientCurve
        from robot_rl.bridges.zmq.segments import ImageEncoding
        from robot_rl.bridges.zmq.streaming import StreamingClient

        self.index = index
        self.robot_id = f"robot-{index}"
        features = {"fps": FPS, "joint_names": list(JOINTS), "cameras": {c: [IMAGE, IMAGE] for c in CAMERAS}}
        curve = ClientCurve.from_files(root / "keys" / "robots" / f"{self.robot_id}.key_secret",
                                       root / "keys" / "learner.key")
        config = ClientConfig(robot_id=self.robot_id, router_endpoint=router, pub_endpoint=pub, curve=curve,
                              spool_dir=root / "spool" / self.robot_id, features=features, heartbeat_interval_s=0.5,
                              config_hash=config_hash,
                              ack_timeout_s=2.0, server_timeout_s=3.0, hello_retry_s=0.2)
        self.link = StreamingClient(config, image_encoding=ImageEncoding("jpeg")).start()
        self.episode_steps = episode_steps
        self.submitted: set[tuple[int, int, int]] = set()
        self._frames = synthetic_frames(30, index)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"bench-edge-{index}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from robot_rl.core.types import Step

        episode = 0
        while not self._stop.is_set():
            episode += 1
            for start in range(0, self.episode_steps, SEGMENT_STEPS):
                ticks = range(start, min(start + SEGMENT_STEPS, self.episode_steps))
                steps = [Step(tick=t, time_s=t / FPS, state=np.array([self.index, episode, t, 0, 0, 0], np.float32),
                              action=np.zeros(6, np.float32), images=self._frames[t % len(self._frames)],
                              done=t == self.episode_steps - 1, reward=float(t == self.episode_steps - 1))
                         for t in ticks]
                while not self.link.submit_steps(episode, steps, episode_done=steps[-1].done):
                    time.sleep(0.05)  # the queue is full (learner away a long time): the steps wait here
                self.submitted |= {(self.index, episode, t) for t in ticks}
                self._stop.wait(len(steps) / FPS)
                if self._stop.is_set() and start + SEGMENT_STEPS >= self.episode_steps:
                    return
            if self._stop.is_set():
                return

    def finish(self, timeout_s: float) -> bool:
        """Stop after the current episode, wait until every step is acked."""
        self._stop.set()
        self._thread.join(60)
        flushed = self.link.flush(timeout_s)
        self.link.stop()
        return flushed


# ============================================================== the suite


def stored_rows(store_root: Path) -> tuple[list[tuple[int, int, int]], int, int]:
    """(robot, episode, tick) of every stored step (dataset and staged), the non-finite rows, and the
    segments a cleanly stopped learner left staged (its dataset writer failed: they are written now)."""
    from robot_rl.bridges.zmq.spool import Spool
    from robot_rl.learner.config import StoreConfig
    from robot_rl.learner.store import ReplayStore

    with Spool(store_root / "staging") as staging:
        left_staged = len(staging)
    with ReplayStore(StoreConfig(root=str(store_root), background_commit=False), train_cameras=CAMERAS) as store:
        if not store.index.num_entries:
            return [], 0, left_staged
        states, actions = store.index.states_and_actions()
    finite = np.isfinite(states).all(axis=1) & np.isfinite(actions.reshape(len(actions), -1)).all(axis=1)
    rows = [(int(row[0]), int(row[1]), int(row[2])) for row in np.nan_to_num(states)]
    return rows, int((~finite).sum()), left_staged


def _free_endpoint() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def _attack(ctx: Any, root: Path, router: str, config_hash: str, cfg: FaultsBenchConfig,
            alive: Callable[[], bool], progress: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, int]]:
    """The intruder's part: malformed messages, then attempts to speak as robot-0."""
    from robot_rl.bench.fault_fuzz import RouterFuzzer, fuzz_router, impersonation_attempts
    from robot_rl.bridges.zmq.keys import ClientCurve, apply_client_curve

    curve = ClientCurve.from_files(root / "keys" / "robots" / "intruder.key_secret", root / "keys" / "learner.key")
    fuzzer = RouterFuzzer(ctx, router, lambda s: apply_client_curve(s, curve), "intruder", config_hash)
    progress(f"fuzz: {cfg.fuzz_messages} malformed messages while {cfg.robots} robots stream")
    try:
        fuzz = fuzz_router(fuzzer, cfg.fuzz_messages, IMAGE, CAMERAS, cfg.seed, alive)
    finally:
        fuzzer.close()
    progress(f"impersonation: {cfg.impersonation_tries} rounds of speaking as robot-0")
    impersonation = impersonation_attempts(ctx, router, lambda s: apply_client_curve(s, curve), "intruder",
                                           "robot-0", IMAGE, CAMERAS, cfg.impersonation_tries, config_hash)
    return fuzz, impersonation


def _stream_attack_and_kill(cfg: FaultsBenchConfig, root: Path, learner: LearnerProcess,
                            progress: Callable[[str], None]) -> dict[str, Any]:
    """Robots stream while the intruder attacks and the learner is killed and restarted; then they
    flush and the learner stops cleanly."""
    import zmq

    from robot_rl.bench.transport import ballast_policy

    progress(f"learner starting (CURVE on loopback, {cfg.robots} robots, intruder key listed)")
    learner.start()
    config_hash = ballast_policy(0.0).config_hash()  # the learner's: a robot with another one is refused
    edges = [Edge(i, root, learner.router, learner.pub, cfg.episode_steps, config_hash) for i in range(cfg.robots)]
    deadline = time.monotonic() + 60
    while not all(edge.link.connected for edge in edges):  # the first hello gives the store its layout
        if time.monotonic() > deadline:
            raise TimeoutError("bench faults: the robots did not connect within 60 s")
        time.sleep(0.05)
    ctx = zmq.Context()
    try:
        fuzz, impersonation = _attack(ctx, root, learner.router, config_hash, cfg, learner.alive, progress)
    finally:
        ctx.term()
    for kill in range(cfg.kills):
        time.sleep(cfg.seconds_between_kills)
        progress(f"kill -9 {kill + 1}/{cfg.kills} of the learner mid-stream, then restart")
        learner.kill()
        time.sleep(0.5)
        learner.start()
    progress("every robot finishes its episode and waits for its acks")
    flushed = all(edge.finish(cfg.flush_timeout_s) for edge in edges)
    exit_code = learner.stop()
    # What the learner said it refused: the fuzzing reached its decoder and checks, not only its socket.
    fuzz["refusals_logged"] = sum(line.count(" refused ") for line in (root / "learner.log").read_text().splitlines())
    return {"fuzz": fuzz, "impersonation": impersonation, "flushed": flushed, "exit_code": exit_code,
            "submitted": set().union(*(edge.submitted for edge in edges))}


def run_suite(cfg: FaultsBenchConfig, root: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    from robot_rl.bench.fault_files import file_faults
    from robot_rl.bench.fault_fuzz import INTRUDER_ROBOT, POISON_ROBOT
    from robot_rl.bridges.zmq.keys import generate_keypair

    generate_keypair(root / "keys", "learner")
    for name in [f"robot-{i}" for i in range(cfg.robots)] + ["intruder"]:
        generate_keypair(root / "keys" / "robots", name)
    # Fixed ports: a restarted learner serves where the robots look.
    learner = LearnerProcess(root, _free_endpoint(), _free_endpoint())
    try:
        run = _stream_attack_and_kill(cfg, root, learner, progress)
    finally:
        if learner.alive():
            learner.process.kill()
    files = file_faults(root / "files")
    rows, non_finite, left_staged = stored_rows(root / "store")
    submitted, stored = run["submitted"], set(rows)
    marked = {r for r in stored if r[0] in (int(POISON_ROBOT), int(INTRUDER_ROBOT))}
    fuzz, impersonation = run["fuzz"], run["impersonation"]
    report = {
        "kills": cfg.kills, "robots": cfg.robots, "steps_submitted": len(submitted), "steps_stored": len(rows),
        "lost_steps": len(submitted - stored), "duplicated_steps": len(rows) - len(stored),
        "poisoned_rows": non_finite + sum(r[0] == int(POISON_ROBOT) for r in marked)
        + len(stored - submitted - marked),
        "impersonations_admitted": impersonation["admitted"] + sum(r[0] == int(INTRUDER_ROBOT) for r in marked),
        "impersonation_attempts": impersonation["attempts"],
        "restart_s": [round(s, 2) for s in learner.restart_s[1:]], "first_start_s": round(learner.restart_s[0], 2),
        "restart_s_max": round(max(learner.restart_s[1:], default=0.0), 2), "peak_rss_mb": round(learner.peak_rss_mb),
        "fuzz": fuzz, "files": files, "edges_flushed": run["flushed"], "learner_exit_code": run["exit_code"],
        "segments_left_staged": left_staged,
    }
    report["passed"] = bool(
        report["kills"] >= cfg.kills and report["lost_steps"] == 0 and report["duplicated_steps"] == 0
        and report["poisoned_rows"] == 0 and report["impersonations_admitted"] == 0
        and report["restart_s_max"] <= cfg.max_restart_s and fuzz["crashes"] == 0 and fuzz["hangs"] == 0
        and fuzz["messages"] >= cfg.fuzz_messages and run["flushed"] and run["exit_code"] == 0
        and left_staged == 0 and all(files.values()))
    return report


def run_faults_bench(cfg: FaultsBenchConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        report = run_suite(cfg, Path(tmp), progress)
    report["config"] = {key: getattr(cfg, key) for key in cfg.__dataclass_fields__}
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Fault suite ({'PASSED' if report['passed'] else 'FAILED'})")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_column("must be", justify="right")
    fuzz = report["fuzz"]
    rows = [("learner kills (SIGKILL)", report["kills"], f">= {report['config']['kills']}"),
            ("steps submitted / stored", f"{report['steps_submitted']} / {report['steps_stored']}", "equal"),
            ("lost steps", report["lost_steps"], "0"), ("duplicated steps", report["duplicated_steps"], "0"),
            ("poisoned rows", report["poisoned_rows"], "0"),
            ("impersonations admitted", f"{report['impersonations_admitted']} of {report['impersonation_attempts']}",
             "0"),
            ("restart s (max)", report["restart_s_max"], f"<= {report['config']['max_restart_s']}"),
            ("learner peak RSS MB", report["peak_rss_mb"], ""),
            ("segments left staged at a clean stop", report["segments_left_staged"], "0"),
            ("fuzz messages / classes", f"{fuzz['messages']} / {fuzz['classes']}",
             f">= {report['config']['fuzz_messages']}"),
            ("fuzz crashes / hangs", f"{fuzz['crashes']} / {fuzz['hangs']}", "0 / 0"),
            *((f"file fault: {name}", "handled" if ok else "NOT HANDLED", "handled")
              for name, ok in report["files"].items())]
    for what, value, must in rows:
        table.add_row(what, str(value), must)
    Console().print(table)


def run_from_cli(cfg: RobotRLConfig) -> dict:
    logging.getLogger("robot_rl").setLevel(logging.WARNING)
    report = timed_run(lambda progress: run_faults_bench(cfg.bench, progress=progress))
    print_table(report)
    return report
