"""`robot-rl bench faults`: the fault suite. Nothing acked lost, nothing poisoned, nobody impersonated,
always restartable, measured on loopback in bounded time.

One run, on a learner in a process of its own (CURVE on loopback, training behaviour cloning, a
store on disk) with ``bench.robots`` edges streaming synthetic episodes whose state encodes
(robot, episode, tick):

1. **fuzz**: authenticated intruders send ``bench.fuzz_messages`` malformed messages in 21
   classes (``fault_fuzz.py``) on the learner's ROUTER while the edges stream, probing every 250
   that a valid request is still answered, each key fewer than the learner ignores a sender for;
   then ``bench.impersonation_tries`` rounds of attempts to speak as a robot (hello as it, segments
   labelled as it, a guessed routing id); then one key sends garbage past that bound and must be
   ignored; then ``bench.fuzz_messages`` malformed inputs in 7 classes on the weights socket
   (``fault_pub.py``), checking every 1,000 that a robot's subscription still gets announcements.
2. **kills**: ``bench.kills`` times, the learner is killed with SIGKILL mid-stream and restarted on
   the same disk; each restart is timed from process start to serving (``restart_s``), and the
   learner's peak memory is read before each kill (VmHWM).
5. **files**: a checkpoint with 4 KB of NaN bytes and a truncated one must be refused on resume;
   a spool with a garbled record must keep every other record; a spool whose write fails half way
   (a full disk) must keep every record written before and after it; a learner whose staging log
   hits a full disk (``fault_store.py``) acks nothing it could not stage, says so, keeps serving and
   stores everything once there is space again.

6. **peers** (``fault_peers.py``): segments a robot sends malformed are set aside and its clean ones
   stored (``refused_then_clean``); a flood of subscriptions on the weights socket grows the learner
   by a bounded amount (``subscription_flood``); ids a connection said hello under and left are
   forgotten after the peer timeout (``stale_ids``).

7. **a robot killed mid-episode** (``fault_crash.py``): the one edge runtime, in a process of its own,
   killed a few segments into an episode and started again: the learner and the robot's own dataset
   each hold all of that episode but at most one segment (``edge_kill_mid_episode``).
8. **corrupt files** (``fault_corrupt.py``): each damaged file a learner or an edge reads at start
   (dataset metadata, data and video files, FlowVLA and LeRobot checkpoints, a robot's own dataset)
   run through the real command: one line naming it and exit code 2 (``corrupt_files``).

3. **robot kills**: ``bench.edge_kills`` times a robot's process is killed with SIGKILL in the
   middle of an episode and started again on its spool (the learner stores the cut episode as
   truncated when the robot starts its next one).
4. **network cut**: for ``bench.network_cut_s`` every robot's connection is torn down and refused
   (``fault_network.py``); the robots keep recording into their spools and re-send afterwards.

Then every edge flushes, the learner stops cleanly, and the store is read back: ``lost_steps``
(made durable by a robot, never stored), ``duplicated_steps``, ``poisoned_rows`` (fuzz-marked or non-finite rows
stored), ``impersonations_admitted`` (attempts answered with an ack or hello_ok, plus stored rows
marked as the intruder's). ``passed`` is true when all of them are zero where they should be.
The robots are processes of their own (``fault_edge.py``), each logging what it submitted and
what its link made durable.
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

from robot_rl.bench.config import FaultsBenchConfig
from robot_rl.bench.fault_corrupt import corrupt_files, corrupt_files_passed
from robot_rl.bench.fault_crash import edge_kill_mid_episode, edge_kill_passed
from robot_rl.bench.fault_edge import FPS
from robot_rl.bench.fault_peers import peer_faults, peer_faults_passed
from robot_rl.bench.fault_stored import stored_rows
from robot_rl.bench.progress import timed_run
from robot_rl.bench.transport import CAMERAS, IMAGE
from robot_rl.bridges.zmq.admission import PeerLimits

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 180.0  # a cold learner imports torch and LeRobot and reads its store
LIMITS = PeerLimits()  # what the bench's learner holds each sender to (learner.service.peer_limits)
# Malformed messages from one intruder key: fewer than the learner ignores a sender for, so each reaches its checks.
MESSAGES_PER_KEY = LIMITS.max_refusals // 2
IGNORED_INTRUDER = "intruder-ignored"  # the key that goes on past the bound


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


# ============================================================== the suite


def _free_endpoint() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def _curve_of(root: Path, name: str) -> Callable[[Any], None]:
    from robot_rl.bridges.zmq.keys import ClientCurve, apply_client_curve

    curve = ClientCurve.from_files(root / "keys" / "robots" / f"{name}.key_secret", root / "keys" / "learner.key")
    return lambda sock: apply_client_curve(sock, curve)


def _attack(ctx: Any, root: Path, learner: LearnerProcess, config_hash: str, cfg: FaultsBenchConfig,
            progress: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, int]]:
    """The intruders' part: malformed messages on the ROUTER, attempts to speak as robot-0, a key that
    goes on past the learner's bound on refusals, malformed input on the PUB."""
    import zmq

    from robot_rl.bench.fault_fuzz import (
        RouterFuzzer,
        fuzz_router,
        ignored_after_garbage,
        impersonation_attempts,
        intruder_keys,
        intruder_name,
    )
    from robot_rl.bench.fault_pub import PubFuzzer, fuzz_pub
    from robot_rl.bridges.zmq.keys import load_public_key

    keys = intruder_keys(cfg.fuzz_messages, MESSAGES_PER_KEY)
    progress(f"fuzz: {cfg.fuzz_messages} malformed messages on the ROUTER from {keys} keys while {cfg.robots} "
             "robots stream")
    router = fuzz_router(lambda k: RouterFuzzer(ctx, learner.router, _curve_of(root, intruder_name(k)),
                                                intruder_name(k), config_hash),
                         cfg.fuzz_messages, MESSAGES_PER_KEY, IMAGE, CAMERAS, cfg.seed, learner.alive)
    progress(f"impersonation: {cfg.impersonation_tries} rounds of speaking as robot-0")
    impersonation = impersonation_attempts(ctx, learner.router, lambda k: _curve_of(root, intruder_name(k)), keys,
                                           "robot-0", IMAGE, CAMERAS, cfg.impersonation_tries, config_hash)
    progress(f"a key sending past {LIMITS.max_refusals} refused messages is ignored")
    garbage = RouterFuzzer(ctx, learner.router, _curve_of(root, IGNORED_INTRUDER), IGNORED_INTRUDER, config_hash)
    try:
        router["garbage_sender_ignored"] = ignored_after_garbage(garbage, LIMITS.max_refusals,
                                                                 root / "learner.log")
    finally:
        garbage.close()
    progress(f"fuzz: {cfg.fuzz_messages} malformed inputs on the weights socket (PUB)")
    watcher = ctx.socket(zmq.SUB)
    watcher.linger = 0
    _curve_of(root, "watcher")(watcher)
    watcher.setsockopt(zmq.SUBSCRIBE, b"")
    watcher.connect(learner.pub)
    try:
        pub = fuzz_pub(PubFuzzer(ctx, learner.pub, _curve_of(root, intruder_name(0)),
                                 load_public_key(root / "keys" / "learner.key"), cfg.seed),
                       watcher, cfg.fuzz_messages, learner.alive)
    finally:
        watcher.close(0)
    fuzz = {"messages": router["messages"] + pub["messages"], "crashes": router["crashes"] + pub["crashes"],
            "hangs": router["hangs"] + pub["hangs"], "router": router, "pub": pub}
    return fuzz, impersonation


def _stream_attack_and_kill(cfg: FaultsBenchConfig, root: Path, learner: LearnerProcess,
                            progress: Callable[[str], None]) -> dict[str, Any]:
    """Robots stream (through relays that can cut their network) while the intruder attacks, the
    learner is killed and restarted, a robot is killed mid-episode and restarted, and the network
    is cut; then they flush and the learner stops cleanly."""
    import zmq

    from robot_rl.bench.fault_edge import EdgeProcess, EdgeSpec
    from robot_rl.bench.fault_network import CuttableRelay
    from robot_rl.bench.transport import ballast_policy

    progress(f"learner starting (CURVE on loopback, {cfg.robots} robots, the intruders' keys listed)")
    learner.start()
    config_hash = ballast_policy(0.0).config_hash()  # the learner's: a robot with another one is refused
    relays = [CuttableRelay(learner.router), CuttableRelay(learner.pub)]
    edges = [EdgeProcess(EdgeSpec(i, str(root), relays[0].endpoint, relays[1].endpoint, config_hash,
                                  cfg.episode_steps, first_episode=1)).start() for i in range(cfg.robots)]
    try:
        _wait_connected(edges, 120.0)  # the first hello gives the store its layout
        ctx = zmq.Context()
        try:
            fuzz, impersonation = _attack(ctx, root, learner, config_hash, cfg, progress)
        finally:
            ctx.term()
        for kill in range(cfg.kills):
            time.sleep(cfg.seconds_between_kills)
            progress(f"kill -9 {kill + 1}/{cfg.kills} of the learner mid-stream, then restart")
            learner.kill()
            time.sleep(0.5)
            learner.start()
        unspooled = _kill_edges(cfg, edges, progress)
        cut = _cut_network(cfg, relays, edges, progress)
        progress("every robot finishes its episode and waits for its acks")
        flushed = all([edge.finish(cfg.flush_timeout_s) for edge in edges])
    finally:
        for edge in edges:
            if edge.process.is_alive():
                edge.process.kill()
        for relay in relays:
            relay.close()
    exit_code = learner.stop()
    # What the learner said it refused: the fuzzing reached its decoder and checks, not only its socket.
    fuzz["router"]["refusals_logged"] = sum(line.count(" refused ")
                                            for line in (root / "learner.log").read_text().splitlines())
    records = [edge.progress() for edge in edges]
    return {"fuzz": fuzz, "impersonation": impersonation, "flushed": flushed, "exit_code": exit_code,
            "submitted": set().union(*(r.submitted for r in records)),
            "durable": set().union(*(r.durable for r in records)),
            "edge_kills": sum(edge.kills for edge in edges), "steps_unspooled_at_edge_kills": unspooled,
            "network_cut": cut}


def _wait_connected(edges: list[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(edge.current_progress().connected for edge in edges):
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench faults: the robots did not connect within {timeout_s:.0f} s")
        if not all(edge.process.is_alive() for edge in edges):
            raise RuntimeError("bench faults: a robot's process exited before it connected")
        time.sleep(0.05)


def _kill_edges(cfg: FaultsBenchConfig, edges: list[Any], progress: Callable[[str], None]) -> int:
    """SIGKILL robots mid-episode and start them again on their spools; the steps that were
    submitted but not yet durable when each died (they lived only in its memory)."""
    from robot_rl.bench.fault_edge import wait_mid_episode

    unspooled = 0
    for kill in range(cfg.edge_kills):
        edge = edges[kill % len(edges)]
        if not wait_mid_episode(edge, 60.0):
            raise TimeoutError(f"bench faults: {edge.spec.robot_id} made no progress within 60 s")
        progress(f"kill -9 {kill + 1}/{cfg.edge_kills} of {edge.spec.robot_id} mid-episode, then restart on its spool")
        died = edge.kill()
        unspooled += len(died.submitted - died.durable)
        edge.start(first_episode=1000 * edge.kills + 1)
        _wait_connected([edge], 120.0)
    return unspooled


def _cut_network(cfg: FaultsBenchConfig, relays: list[Any], edges: list[Any],
                 progress: Callable[[str], None]) -> dict[str, Any]:
    """Cut every robot's network for ``bench.network_cut_s``; what they made durable meanwhile."""
    if cfg.network_cut_s <= 0:
        return {"seconds": 0.0, "steps_recorded_during_cut": 0, "connections_refused": 0}
    progress(f"network cut for {cfg.network_cut_s:.0f} s: the robots keep recording into their spools")
    before = sum(len(edge.progress().durable) for edge in edges)
    for relay in relays:
        relay.cut()
    time.sleep(cfg.network_cut_s)
    recorded = sum(len(edge.progress().durable) for edge in edges) - before
    for relay in relays:
        relay.restore()
    return {"seconds": cfg.network_cut_s, "steps_recorded_during_cut": recorded,
            "connections_refused": sum(relay.refused_while_cut for relay in relays)}


def run_suite(cfg: FaultsBenchConfig, root: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    from robot_rl.bench.fault_files import file_faults
    from robot_rl.bench.fault_fuzz import INTRUDER_ROBOT, POISON_ROBOT, intruder_keys, intruder_name
    from robot_rl.bridges.zmq.keys import generate_keypair

    generate_keypair(root / "keys", "learner")
    intruders = [intruder_name(k) for k in range(intruder_keys(cfg.fuzz_messages, MESSAGES_PER_KEY))]
    for name in [f"robot-{i}" for i in range(cfg.robots)] + intruders + [IGNORED_INTRUDER, "watcher"]:
        generate_keypair(root / "keys" / "robots", name)
    # Fixed ports: a restarted learner serves where the robots look.
    learner = LearnerProcess(root, _free_endpoint(), _free_endpoint())
    try:
        run = _stream_attack_and_kill(cfg, root, learner, progress)
    finally:
        if learner.alive():
            learner.process.kill()
    files = file_faults(root / "files")
    progress("peers: refused segments, a subscription flood, stale ids")
    peers = peer_faults(cfg)
    progress("a robot killed mid-episode, then started again")
    (root / "crash").mkdir()
    crash = edge_kill_mid_episode(root / "crash")
    corrupt = corrupt_files(root / "corrupt", list(cfg.corrupt_variants), progress)
    rows, non_finite, left_staged = stored_rows(root / "store")
    submitted, durable, stored = run["submitted"], run["durable"], set(rows)
    marked = {r for r in stored if r[0] in (int(POISON_ROBOT), int(INTRUDER_ROBOT))}
    fuzz, impersonation, cut = run["fuzz"], run["impersonation"], run["network_cut"]
    report = {
        "kills": cfg.kills, "edge_kills": run["edge_kills"], "robots": cfg.robots,
        "steps_submitted": len(submitted), "steps_durable": len(durable), "steps_stored": len(rows),
        # Durable (spooled) steps are the promise; steps still in a killed robot's memory are counted apart.
        "lost_steps": len(durable - stored), "duplicated_steps": len(rows) - len(stored),
        "steps_unspooled_at_edge_kills": run["steps_unspooled_at_edge_kills"],
        "poisoned_rows": non_finite + sum(r[0] == int(POISON_ROBOT) for r in marked)
        + len(stored - submitted - marked),
        "impersonations_admitted": impersonation["admitted"] + sum(r[0] == int(INTRUDER_ROBOT) for r in marked),
        "impersonation_attempts": impersonation["attempts"],
        "restart_s": [round(s, 2) for s in learner.restart_s[1:]], "first_start_s": round(learner.restart_s[0], 2),
        "restart_s_max": round(max(learner.restart_s[1:], default=0.0), 2), "peak_rss_mb": round(learner.peak_rss_mb),
        "fuzz": fuzz, "files": files, "network_cut": cut, "edges_flushed": run["flushed"],
        "learner_exit_code": run["exit_code"], "segments_left_staged": left_staged, **peers,
        "edge_kill_mid_episode": crash, "corrupt_files": corrupt,
    }
    # Through a cut the robots keep recording at (at least half) their rate: the link never holds them up.
    kept_recording = cut["steps_recorded_during_cut"] >= 0.5 * FPS * cut["seconds"] * cfg.robots
    report["passed"] = bool(
        report["kills"] >= cfg.kills and report["edge_kills"] >= cfg.edge_kills and report["lost_steps"] == 0
        and report["duplicated_steps"] == 0
        and report["poisoned_rows"] == 0 and report["impersonations_admitted"] == 0
        and report["restart_s_max"] <= cfg.max_restart_s and fuzz["crashes"] == 0 and fuzz["hangs"] == 0
        and fuzz["router"]["messages"] >= cfg.fuzz_messages and fuzz["pub"]["messages"] >= cfg.fuzz_messages
        and fuzz["router"]["garbage_sender_ignored"] and run["flushed"] and run["exit_code"] == 0
        and left_staged == 0 and all(files.values()) and kept_recording and peer_faults_passed(cfg, peers)
        and edge_kill_passed(crash) and corrupt_files_passed(corrupt))
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
    refused, flood, stale = report["refused_then_clean"], report["subscription_flood"], report["stale_ids"]
    crash, corrupt = report["edge_kill_mid_episode"], report["corrupt_files"]
    rows = [("learner kills (SIGKILL)", report["kills"], f">= {report['config']['kills']}"),
            ("robot kills (SIGKILL mid-episode)", report["edge_kills"], f">= {report['config']['edge_kills']}"),
            ("steps submitted / durable / stored",
             f"{report['steps_submitted']} / {report['steps_durable']} / {report['steps_stored']}", "durable stored"),
            ("steps only in a killed robot's memory", report["steps_unspooled_at_edge_kills"], ""),
            (f"steps recorded during a {report['network_cut']['seconds']:.0f} s network cut",
             report["network_cut"]["steps_recorded_during_cut"], ">= half the rate"),
            ("lost steps", report["lost_steps"], "0"), ("duplicated steps", report["duplicated_steps"], "0"),
            ("poisoned rows", report["poisoned_rows"], "0"),
            ("impersonations admitted", f"{report['impersonations_admitted']} of {report['impersonation_attempts']}",
             "0"),
            ("restart s (max)", report["restart_s_max"], f"<= {report['config']['max_restart_s']}"),
            ("learner peak RSS MB", report["peak_rss_mb"], ""),
            ("segments left staged at a clean stop", report["segments_left_staged"], "0"),
            ("fuzz ROUTER: messages / classes / keys",
             f"{fuzz['router']['messages']} / {fuzz['router']['classes']} / {fuzz['router']['keys']}",
             f">= {report['config']['fuzz_messages']}"),
            ("fuzz PUB: messages / classes", f"{fuzz['pub']['messages']} / {fuzz['pub']['classes']}",
             f">= {report['config']['fuzz_messages']}"),
            ("fuzz crashes / hangs", f"{fuzz['crashes']} / {fuzz['hangs']}", "0 / 0"),
            ("a key past the refusal bound ignored", "yes" if fuzz["router"]["garbage_sender_ignored"] else "NO",
             "yes"),
            *((f"file fault: {name}", "handled" if ok else "NOT HANDLED", "handled")
              for name, ok in report["files"].items()),
            ("malformed segments set aside / clean steps stored",
             f"{refused['refused']} / {refused['clean_stored']} of {refused['clean_steps']}",
             f"{report['config']['refused_segments']} / all"),
            (f"learner MB grown by {flood['subscriptions']} subscriptions", flood["rss_growth_mb"],
             f"<= {report['config']['max_flood_growth_mb']:g}"),
            (f"ids listed after the peer timeout ({stale['said_hello']} said hello)", stale["listed_after_timeout"],
             f"{stale['live_peers']} (the live robot)"),
            ("robot killed mid-episode: ticks recorded / at the learner / in its dataset",
             f"{crash['ticks_recorded']} / {crash['ticks_stored']} / {crash['local_ticks']}",
             f"each >= recorded - {crash['segment_ticks']}"),
            ("corrupt files: one line and exit 2", f"{corrupt['one_line_exit_2']} of {corrupt['variants']}", "all")]
    for what, value, must in rows:
        table.add_row(what, str(value), must)
    Console().print(table)


def run_from_cli(cfg: RobotRLConfig) -> dict:
    logging.getLogger("robot_rl").setLevel(logging.WARNING)
    report = timed_run(lambda progress: run_faults_bench(cfg.bench, progress=progress))
    print_table(report)
    return report
