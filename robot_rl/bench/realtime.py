"""`robot-rl bench realtime`: a wall-clock soak of edge nodes beside a learner that trains.

What a robot feels on a busy machine: ``bench.robots`` edge processes (a kinematic 6-joint arm
with two 96x96 cameras, 30 fps, the project's FlowVLA computing real chunks) stream every step to
a ``LearnerService`` that trains behaviour cloning on them and publishes new weights every
``bench.swap_every_s``, which every edge swaps in while it runs; every process logs at INFO to a
file. Every tick's lateness (start time minus its scheduled time) is recorded from the moment the
learner has published its first trained weights (so every measured tick runs under the full load). The soak runs once
per ``bench.runners`` entry, one after the other on the same machine: where inference and the
weights loader run ("process": the policy's own process, the default of a session on the wall
clock; "thread": threads of the control process, as before), and per ``bench.scheduling`` entry:
the control loop under SCHED_FIFO with the interpreter lock handed over every 1 ms (the edge's
defaults, "realtime") or under Linux's and Python's defaults ("normal").

Reported per runner: ``lateness_ms`` {p50, p99, max} over all ticks of all robots,
``ticks_over_5ms``, ``ticks_over_period`` (33 ms at 30 fps), ticks, the swaps made, the learner's
updates and the versions it published within the measured window, how many of the measured ticks
ran under ``SCHED_FIFO`` (``ticks_under_fifo``: the OS grants it only with CAP_SYS_NICE or an rtprio
limit, so "realtime" says what was asked and this what ran), and the store's episodes written and still waiting for the
dataset writer at the end (a waiting count that grows says the learner cannot keep up; stopping
writes them all, which can take minutes).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from robot_rl.bench.config import RealtimeBenchConfig
from robot_rl.bench.progress import timed_run
from robot_rl.bench.transport import CAMERAS, IMAGE, BenchArm, ballast_policy, stop_processes

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)

FPS = 30
EPISODE_TICKS = 300  # 10 s: an episode ends, its steps are committed, the next begins
OVER_MS = 5.0
FIRST_WEIGHTS_TIMEOUT_S = 300.0  # filling the store to min_steps_to_train takes seconds; a busy CI box, more


def _runs_under_fifo() -> bool:
    """Whether the calling thread runs under SCHED_FIFO now (what the OS granted, not what was asked)."""
    return hasattr(os, "SCHED_FIFO") and \
        os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0) == os.SCHED_FIFO


def _soak_edge(index: int, router: str, pub: str, workdir: str, runner: str, scheduling: str, start: Any,
               stop: Any, out: mp.Queue) -> None:
    """Edge process: episodes on the wall clock until ``stop`` is set; send the lateness of every
    tick between ``start`` (every edge is running) and ``stop``, the swaps made between them and how
    many of those ticks ran under SCHED_FIFO."""
    import torch

    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.bridges.zmq.segments import ImageEncoding
    from robot_rl.core.clock import WallClock
    from robot_rl.core.layout import RecordedLayout
    from robot_rl.edge.config import EdgeConfig
    from robot_rl.edge.learner_link import EdgeStreamer
    from robot_rl.edge.node import EdgeNode
    from robot_rl.edge.process_runner import spawn_policy

    logging.basicConfig(level=logging.INFO, filename=f"{workdir}/edge-{index}-{runner}.log",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    factory = functools.partial(ballast_policy, 0.0)
    policy = spawn_policy(factory) if runner == "process" else factory()
    robot_id = f"soak-{index}"
    arm = BenchArm()
    config = ClientConfig(robot_id=robot_id, router_endpoint=router, pub_endpoint=pub,
                          spool_dir=f"{workdir}/spool-{index}-{runner}", config_hash=policy.config_hash(),
                          heartbeat_interval_s=0.5, features=RecordedLayout.of_robot(arm).to_document())
    streamer = EdgeStreamer(config, policy, image_encoding=ImageEncoding())
    edge = EdgeConfig(fps=FPS, inference_runner=runner)
    if scheduling == "normal":  # Linux's and Python's defaults
        edge = dataclasses.replace(edge, realtime_priority=0, switch_interval_ms=0.0)
    node = EdgeNode(arm, policy, WallClock(), edge, robot_id=robot_id)
    streamer.attach(node).start()
    lateness: list[float] = []
    forward = node.step_sink
    assert forward is not None
    measuring = [False]  # from the first tick after every edge is running to the stop, as the parent says
    swaps = [0, 0]  # node.stats.swaps at the first and at the last measured tick
    fifo_ticks = [0]

    def sink(step: Any) -> None:  # control thread: a few counters
        if measuring[0]:
            if not lateness:
                swaps[0] = node.stats.swaps
            swaps[1] = node.stats.swaps
            fifo_ticks[0] += _runs_under_fifo()
            lateness.append(step.lateness_s)
        forward(step)

    def window() -> None:
        start.wait()
        measuring[0] = True
        stop.wait()
        measuring[0] = False

    node.step_sink = sink
    streamer.link.wait_connected(60)
    out.put(("ready", index, None))
    threading.Thread(target=window, daemon=True).start()
    try:
        episode = 0
        while not stop.is_set():
            node.run_episode(EPISODE_TICKS, "pick up the cube", episode_id=episode)
            episode += 1
    finally:
        streamer.stop()
        node.close()
    out.put(("done", index, {"lateness_s": np.asarray(lateness, dtype=np.float64).tolist(),
                             "swaps": swaps[1] - swaps[0], "ticks_under_fifo": fifo_ticks[0],
                             "version": node.policy_version}))


def soak(runner: str, cfg: RealtimeBenchConfig, workdir: Path, progress: Callable[[str], None],
         scheduling: str = "realtime") -> dict[str, Any]:
    from robot_rl.learner.config import LearnerConfig, ServiceConfig, StoreConfig, TrainerConfig

    workdir.mkdir(parents=True, exist_ok=True)
    policy = ballast_policy(0.0)
    config = LearnerConfig(
        store=StoreConfig(root=str(workdir / "store"), commit_nice=10),
        trainer=TrainerConfig(device="cpu", log_dir="", checkpoint_dir=str(workdir / "ckpt"), batch_size=16,
                              publish_every_updates=10**9, publish_every_s=cfg.swap_every_s,
                              checkpoint_every_updates=10**9, min_steps_to_train=64, thread_nice=10,
                              demonstration_ratio=0.0, intervention_ratio=0.0, online_ratio=1.0),
        service=ServiceConfig(router_endpoint="tcp://127.0.0.1:*", pub_endpoint="tcp://127.0.0.1:*",
                              status_every_s=10.0))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    learner_log = logging.FileHandler(workdir / "learner.log")  # the learner logs beside the robots, as in a run
    learner_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    project = logging.getLogger("robot_rl")
    level, propagate = project.level, project.propagate
    project.addHandler(learner_log)
    project.setLevel(logging.INFO)
    project.propagate = False  # to the file only: the console shows the bench's progress
    try:
        return _soak_with_learner(runner, scheduling, cfg, workdir, config, policy, ctx, out, progress)
    finally:
        project.removeHandler(learner_log)
        project.setLevel(level)
        project.propagate = propagate
        learner_log.close()


def _soak_with_learner(runner: str, scheduling: str, cfg: RealtimeBenchConfig, workdir: Path, config: Any,
                       policy: Any, ctx: Any, out: mp.Queue, progress: Callable[[str], None]) -> dict[str, Any]:
    from robot_rl.learner.service import LearnerService

    with LearnerService(config, policy, train=True) as learner:
        learner.start()
        start, stop = ctx.Event(), ctx.Event()
        edges = [ctx.Process(target=_soak_edge, args=(i, learner.router_endpoint, learner.pub_endpoint,
                                                       str(workdir), runner, scheduling, start, stop, out))
                 for i in range(cfg.robots)]
        for edge in edges:
            edge.start()
        results: dict[int, dict] = {}
        try:
            for _ in edges:
                _expect(out, "ready", 120.0 + 30.0 * cfg.robots, runner)
            _await_first_trained_weights(learner, FIRST_WEIGHTS_TIMEOUT_S, runner)
            start.set()
            progress(f"{runner}, {scheduling} scheduling: {cfg.robots} edges running; soaking for "
                     f"{cfg.duration_s:.0f} s")
            updates_before, version_before = learner.trainer.step, learner.trainer.version
            time.sleep(cfg.duration_s)
            updates = learner.trainer.step - updates_before
            published = learner.trainer.version - version_before
            store = learner.store.stats()
            stop.set()
            for _ in edges:
                index, body = _expect(out, "done", 120.0, runner)
                results[index] = body
        finally:
            stop_processes(stop, edges, 30)
    lateness_ms = np.concatenate([np.asarray(r["lateness_s"]) for r in results.values()]) * 1000.0
    period_ms = 1000.0 / FPS
    return {"runner": runner, "scheduling": scheduling, "robots": cfg.robots, "ticks": int(lateness_ms.size),
            "lateness_ms": {"p50": float(np.percentile(lateness_ms, 50)), "p99": float(np.percentile(lateness_ms, 99)),
                            "max": float(lateness_ms.max())},
            "ticks_over_5ms": int((lateness_ms > OVER_MS).sum()),
            "ticks_over_period": int((lateness_ms > period_ms).sum()),
            "ticks_under_fifo": int(sum(r["ticks_under_fifo"] for r in results.values())),
            "swaps": int(sum(r["swaps"] for r in results.values())), "learner_updates": int(updates),
            "versions_published": int(published),
            "episodes_stored": store["episodes_stored"], "episodes_to_write": store["episodes_to_write"],
            "duration_s": cfg.duration_s}


def _await_first_trained_weights(learner: Any, timeout_s: float, runner: str) -> None:
    """The measured window starts once the learner has trained on the stream and published: the
    ticks before it (the store filling up to ``min_steps_to_train``) carry none of the load being
    measured, and how long they take depends on how busy the machine is."""
    deadline = time.monotonic() + timeout_s
    while learner.trainer.version < 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"soak ({runner}): the learner published no trained weights within {timeout_s:.0f} s "
                               f"(updates so far: {learner.trainer.step}; store: {learner.store.stats()})")
        time.sleep(0.1)


def _expect(out: mp.Queue, kind: str, timeout_s: float, runner: str) -> tuple[int, Any]:
    try:
        got, index, body = out.get(timeout=timeout_s)
    except queue.Empty:
        raise TimeoutError(f"soak ({runner}): no {kind!r} from an edge within {timeout_s:.0f} s") from None
    if got != kind:
        raise RuntimeError(f"soak ({runner}): edge {index} sent {got!r}, expected {kind!r}")
    return index, body


def run_realtime_bench(cfg: RealtimeBenchConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    report: dict[str, Any] = {"by_runner": {},
                              "config": {"duration_s": cfg.duration_s, "robots": cfg.robots,
                                         "swap_every_s": cfg.swap_every_s, "runners": list(cfg.runners),
                                         "scheduling": list(cfg.scheduling),
                                         "fps": FPS, "cameras": f"{len(CAMERAS)} x {IMAGE}x{IMAGE}"}}
    with tempfile.TemporaryDirectory(prefix="bench-realtime-") as tmp:
        for runner in cfg.runners:
            for scheduling in cfg.scheduling:
                key = soak_key(runner, scheduling)
                progress(f"soak, inference and loader in a {runner}, {scheduling} scheduling: {cfg.robots} edges, "
                         f"{cfg.duration_s:.0f} s")
                report["by_runner"][key] = soak(runner, cfg, Path(tmp) / f"{runner}-{scheduling}", progress,
                                                scheduling)
    first = report["by_runner"][soak_key(cfg.runners[0], cfg.scheduling[0])]
    report.update({key: first[key] for key in ("lateness_ms", "ticks_over_5ms", "ticks_over_period", "runner")})
    return report


def soak_key(runner: str, scheduling: str) -> str:
    """A soak's row in the report: the runner, and how its loop was scheduled unless it is the default."""
    return runner if scheduling == "realtime" else f"{runner}, normal scheduling"


def fifo_label(under_fifo: int, ticks: int) -> str:
    """How many measured ticks SCHED_FIFO was granted for: "all", "none" or "k of n"."""
    return "all" if under_fifo == ticks else "none" if under_fifo == 0 else f"{under_fifo} of {ticks}"


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Tick lateness over a {report['config']['duration_s']:.0f} s wall-clock soak "
                        f"({report['config']['robots']} edges, learner training, swaps every "
                        f"{report['config']['swap_every_s']:.0f} s)")
    for col in ("runner", "SCHED_FIFO ticks", "ticks", "p50 ms", "p99 ms", "max ms", ">5ms", ">period", "swaps",
                "updates", "stored/waiting"):
        table.add_column(col, justify="right")
    for runner, row in report["by_runner"].items():
        late = row["lateness_ms"]
        table.add_row(runner, fifo_label(row["ticks_under_fifo"], row["ticks"]), str(row["ticks"]),
                      f"{late['p50']:.2f}", f"{late['p99']:.2f}", f"{late['max']:.1f}",
                      str(row["ticks_over_5ms"]), str(row["ticks_over_period"]), str(row["swaps"]),
                      str(row["learner_updates"]), f"{row['episodes_stored']} / {row['episodes_to_write']}")
    Console().print(table)


def run_from_cli(cfg: RobotRLConfig) -> dict:
    logging.getLogger("robot_rl").setLevel(logging.WARNING)
    report = timed_run(lambda progress: run_realtime_bench(cfg.bench, progress=progress))
    print_table(report)
    return report
