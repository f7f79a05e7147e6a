"""`robot-rl bench soak`: a learner fed camera-size frames for a long time, with its memory over time.

Why: the learner keeps what it trains on in memory, and robots send 640x480 frames, two cameras at
30 Hz: 3.6 GB a robot-minute at the size they arrive. What must hold is that the learner's memory
stops growing once the sampling index reaches its budget (``learner.store.index_memory``), whatever
the fleet and the hours, that no step is lost, that the store's writer keeps up, and that training
is about as fast as with small frames (the index keeps the policy's input size; the frames it let
go are read back from its spill on disk, or decoded from the dataset on worker processes, while an
update runs).

What runs: ``robots`` robot threads each send an episode of ``episode_s`` seconds after another, as
the wire segments an edge sends (JPEG frames, ``SEGMENT_STEPS`` steps each) at ``fps`` in real time,
straight to the learner's ``ReplayStore`` (its decode threads, staging, dataset writer process and
sampling index, as the service runs them), while the learner's ``Trainer`` trains the configured
policy (the learner command's, ``learner_policy``) on it. The frames are a moving gradient with
sensor noise, so JPEG and the video encoder have real work; an operator takes over a third of the
time, so a learner that trains on corrections only (hgdagger) trains too. Every ``sample_every_s`` the RSS of
each learner process (the main one, the dataset writer, the index's frame readers), the updates
done and the writer's backlog are recorded, and the CPU each process used over the window; after
the window the robots send what the store held back, the writer stores what is queued
(``writer_drain_s``) and the index's frames are measured against its budget; then the trainer
trains alone for ``trainer_alone_s``, nothing arriving (``updates_per_s_trainer_alone``: what it
does without ingest's CPU, reading back what left the index). Then the same learner
runs ``small_duration_s`` on ``small_image`` frames for ``updates_per_s_small``: the two rates side
by side.

Growth after warm-up: the learner's processes together, their mean RSS over the last five minutes
minus their mean over the five from ``warmup_s`` (``GROWTH_WINDOW_S``: the main process's RSS swings
by up to ~200 MB within a minute as batches and segments come and go, so one sample, or one minute's
mean, measures the swing). The bench's index budget is small (``index_memory_mb``) so that it is reached within
the warm-up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

from robot_rl.app.policies import learner_policy
from robot_rl.bench.config import SoakBenchConfig
from robot_rl.bench.progress import timed_run
from robot_rl.bench.transport import JOINTS, SEGMENT_STEPS
from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment
from robot_rl.core.types import Step
from robot_rl.learner.store import ReplayStore
from robot_rl.learner.trainer import Trainer

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # lerobot's writer would print a bar per episode
CAMERAS = ("front", "wrist")
SENSOR_NOISE = 2.0  # grey levels: a webcam's read noise in good light
# An operator takes over for the last TAKEOVER_STEPS of every TAKEOVER_EVERY ticks, so every stream a
# learner preset samples (online, or corrections only) holds data.
TAKEOVER_EVERY, TAKEOVER_STEPS = 90, 30
DRAIN_TIMEOUT_S = 600.0  # after the window, for the writer to store what is queued
RESEND_S = 0.5  # how often a held-back robot sends its waiting segments again (after the window)


def robot_segments(robot: int, height: int, width: int, steps: int) -> list[Any]:
    """One episode of robot ``robot`` as the wire segments its edge sends (JPEG frames), for episode 0."""
    rng = np.random.default_rng(robot)
    rows = np.arange(height, dtype=np.float32)[:, None, None]
    cols = np.arange(width, dtype=np.float32)[None, :, None]
    episode = []
    for tick in range(steps):
        images = {}
        for k, cam in enumerate(CAMERAS):
            scene = (rows * 0.3 + cols * 0.2 + 2.0 * tick + 40 * k + np.array([0, 60, 120])) % 256
            images[cam] = np.clip(scene + rng.normal(0, SENSOR_NOISE, scene.shape), 0, 255).astype(np.uint8)
        state = np.full(len(JOINTS), np.sin(tick / 30 + robot), dtype=np.float32)
        human = tick % TAKEOVER_EVERY >= TAKEOVER_EVERY - TAKEOVER_STEPS
        episode.append(Step(tick=tick, time_s=tick / 30, state=state, action=state + 0.01, images=images,
                            instruction="push the cube", is_intervention=human, done=tick == steps - 1,
                            chunk_id=-1 if human else tick // 10))
    chunks = [episode[i:i + SEGMENT_STEPS] for i in range(0, steps, SEGMENT_STEPS)]
    return [encode_segment(f"soak-{robot}", 0, seq, chunk, episode_done=chunk[-1].done,
                           image_encoding=ImageEncoding("jpeg")) for seq, chunk in enumerate(chunks)]


class Robot(threading.Thread):
    """Sends its episode again and again (a new episode id each time) at ``fps`` in real time. A segment
    the store refuses (held back: its writer behind) is sent again a segment later, as an edge's spool
    re-sends it; the steps of what is never stored by the end are the lost ones."""

    def __init__(self, store: ReplayStore, segments: list[Any], fps: int, stop: threading.Event) -> None:
        super().__init__(name=f"soak-{segments[0].robot_id}", daemon=True)
        self.store, self.segments, self.fps, self.stop = store, segments, fps, stop
        self.sent_steps = 0  # steps handed to the store (stored, or refused and never taken)
        self.refused = 0
        self.failure: str | None = None

    def run(self) -> None:
        try:
            pending = self._stream()
            # After the window, what the store held back is sent again, as an edge's spool drains once
            # the learner takes its segments again.
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while pending and time.monotonic() < deadline:
                time.sleep(RESEND_S)
                pending = self._deliver(pending)
        except Exception as exc:  # noqa: BLE001 - reported in the bench's result, not lost in a thread
            self.failure = f"{type(exc).__name__}: {exc}"

    def _stream(self) -> list[Any]:
        """Episodes in real time until ``stop``; returns the segments the store has not taken yet."""
        started = time.monotonic()
        due_steps = 0
        episode = 0
        pending: list[Any] = []
        while True:
            for segment in self.segments:
                due_steps += segment.num_steps
                wait = started + due_steps / self.fps - time.monotonic()
                if self.stop.wait(max(0.0, wait)):
                    return pending
                pending.append(dataclasses.replace(segment, episode_id=episode))
                self.sent_steps += segment.num_steps
                pending = self._deliver(pending)
            episode += 1

    def _deliver(self, pending: list[Any]) -> list[Any]:
        from robot_rl.bridges.zmq.codec import BusyError

        left = []
        for segment in pending:
            try:
                self.store.ingest(segment)
            except BusyError:
                self.refused += 1
                left.append(segment)
        return left


def learner_pids(store: ReplayStore) -> dict[str, list[int]]:
    writer = getattr(store.writer, "pid", None)
    return {"main": [os.getpid()], "writer": [writer] if writer else [],
            "readers": store.frame_reader.worker_pids()}


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):  # a process that has just ended holds nothing
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


def learner_run(cfg: RobotRLConfig, bench: SoakBenchConfig, root: Path, image: tuple[int, int], duration_s: float,
                progress: Any) -> dict[str, Any]:
    """The store and trainer fed by the robots for ``duration_s``: RSS per process, updates, backlog, losses."""
    height, width = image
    store_config = dataclasses.replace(cfg.learner.store, root=str(root / "store"), fps=bench.fps, joint_names=JOINTS,
                                       cameras=CAMERAS, image_height=height, image_width=width,
                                       index_memory=bench.index_memory_mb)
    trainer_config = dataclasses.replace(cfg.learner.trainer, checkpoint_dir=str(root / "checkpoints"), log_dir="",
                                         checkpoint_every_updates=10**9, max_updates=None)
    policy = learner_policy(cfg)
    episode_steps = int(bench.episode_s * bench.fps)
    segments = [robot_segments(r, height, width, episode_steps) for r in range(bench.robots)]
    stop = threading.Event()
    series: dict[str, list[list[float]]] = {"main": [], "writer": [], "readers": []}
    updates: list[list[float]] = []
    backlog: list[list[float]] = []
    with ReplayStore(store_config, train_cameras=policy.cameras, input_frames=policy.input_frames) as store:
        trainer = Trainer(policy, store.index, trainer_config, cfg.learner.algorithm)
        store.writer.finalize()  # start the writer's process (imports, dataset open) before the clock runs
        robots = [Robot(store, s, bench.fps, stop) for s in segments]
        cpu_before = {name: cpu_seconds(ids) for name, ids in learner_pids(store).items()}
        started = time.monotonic()
        for robot in robots:
            robot.start()
        trainer.start()
        next_report = 0.0
        while (now := time.monotonic() - started) < duration_s:
            pids = learner_pids(store)
            for name, ids in pids.items():
                series[name].append([round(now, 1), round(rss_mb(ids), 1)])
            updates.append([round(now, 1), trainer.step])
            waiting = store.writer_backlog()
            backlog.append([round(now, 1), waiting.episodes, round(waiting.staged_bytes / 2**20, 1)])
            if now >= next_report:
                next_report += 60.0
                progress(f"{width}x{height} {now:5.0f} s: RSS main {series['main'][-1][1]:.0f} MB, writer "
                         f"{series['writer'][-1][1]:.0f} MB, readers {series['readers'][-1][1]:.0f} MB; index frames "
                         f"{store.index.frame_bytes / 2**20:.0f} MB (episodes let go: {store.index.entries_spilled} "
                         f"to the spill, {store.index.entries_on_disk} to the dataset); "
                         f"{trainer.step} updates; writer backlog {waiting.episodes} episodes")
            stop.wait(bench.sample_every_s)
        stop.set()
        cpu_s = {name: round(cpu_seconds(ids) - cpu_before[name], 1) for name, ids in learner_pids(store).items()}
        for robot in robots:
            robot.join()
        drain_started = time.monotonic()
        drained = store.flush(DRAIN_TIMEOUT_S)  # every episode in the dataset: the index's budget then holds
        drain_s = time.monotonic() - drain_started
        # Nothing arrives any more: what the trainer does alone, reading back what left the index.
        alone = [[0.0, trainer.step]]
        time.sleep(bench.trainer_alone_s)
        alone.append([bench.trainer_alone_s, trainer.step])
        trainer.stop()
        stored = sum(store.index.counts().values()) + store.index.held_steps()
        streamed = sum(r.sent_steps for r in robots)
        result: dict[str, Any] = {
                  "image": [height, width], "duration_s": duration_s, "rss_mb": series, "updates": updates,
                  "writer_backlog": backlog, "index_frame_mb": round(store.index.frame_bytes / 2**20, 3),
                  "index_memory_budget_mb": round((store.index.memory_budget or 0) / 2**20, 3),
                  "writer_drain_s": round(drain_s, 1) if drained else None, "cpu_s": cpu_s,
                  "updates_per_s_trainer_alone": rate_after(alone, 0.0),
                  "entries_on_disk": store.index.entries_on_disk, "entries_spilled": store.index.entries_spilled,
                  "spill_mb": round(store.frame_spill.bytes / 2**20, 1) if store.frame_spill is not None else 0.0,
                  "steps_streamed": streamed, "steps_stored": stored, "lost_steps": streamed - stored,
                  "segments_refused": sum(r.refused for r in robots),
                  "robot_failures": [r.failure for r in robots if r.failure], "trainer_failure": trainer.failure}
    result["updates_per_s"] = rate_after(updates, min(bench.warmup_s, duration_s / 3))
    return result


def cpu_seconds(pids: list[int]) -> float:
    """CPU time the processes have used so far (user and system, seconds)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def rate_after(points: list[list[float]], since_s: float) -> float:
    """Slope of a [time, count] series from ``since_s`` to its last point (per second)."""
    later = [p for p in points if p[0] >= since_s]
    if len(later) < 2 or later[-1][0] <= later[0][0]:
        return 0.0
    return round((later[-1][1] - later[0][1]) / (later[-1][0] - later[0][0]), 3)


# RSS swings by up to ~200 MB within a minute while camera-size segments are decoded and a batch is in
# flight (the learner's main process, 2 robots at 640x480): one minute's mean still carries a swing as
# big as the 10 %-of-budget target, five minutes' do not.
GROWTH_WINDOW_S = 300.0


def growth_after(series: dict[str, list[list[float]]], since_s: float, window_s: float = GROWTH_WINDOW_S) -> float:
    """The learner's processes together: their mean RSS over the last ``window_s`` minus their mean over
    the ``window_s`` from ``since_s`` (MB); each window at most a third of that span, so they never meet."""
    times = [t for t, _ in series["main"]]
    totals = [sum(series[name][i][1] for name in series if i < len(series[name])) for i in range(len(times))]
    later = [(t, total) for t, total in zip(times, totals, strict=True) if t >= since_s]
    if len(later) < 2:
        return 0.0
    window_s = min(window_s, (later[-1][0] - later[0][0]) / 3)
    first = [total for t, total in later if t <= later[0][0] + window_s]
    last = [total for t, total in later if t >= later[-1][0] - window_s]
    return round(float(np.mean(last) - np.mean(first)), 1)


def run_soak_bench(cfg: RobotRLConfig, progress: Any = print) -> dict[str, Any]:
    bench: SoakBenchConfig = cfg.bench
    height, width = bench.image
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        progress(f"{bench.robots} robots x {len(CAMERAS)} cameras at {width}x{height}, {bench.fps} Hz, "
                 f"{bench.duration_s:.0f} s, training")
        big = learner_run(cfg, bench, Path(tmp) / "camera", (height, width), bench.duration_s, progress)
        progress(f"the same learner on {bench.small_image}x{bench.small_image} frames, {bench.small_duration_s:.0f} s")
        small = learner_run(cfg, bench, Path(tmp) / "small", (bench.small_image, bench.small_image),
                            bench.small_duration_s, progress)
    warmup = min(bench.warmup_s, bench.duration_s / 3)
    report = {
        "config": dataclasses.asdict(bench),
        "rss_mb": big["rss_mb"],
        "rss_growth_mb_after_warmup": growth_after(big["rss_mb"], warmup),
        "warmup_s": warmup,
        "index_memory_budget_mb": big["index_memory_budget_mb"],
        "index_frame_mb_at_end": big["index_frame_mb"],
        "writer_drain_s": big["writer_drain_s"],
        "episodes_read_back_from_disk": big["entries_on_disk"],
        "episodes_in_spill": big["entries_spilled"],
        "spill_mb_at_end": big["spill_mb"],
        "steps_streamed": big["steps_streamed"],
        # What robots in real time would have sent: fewer streamed means ingest held them back.
        "steps_expected": int(bench.robots * bench.fps * bench.duration_s),
        "steps_stored": big["steps_stored"],
        "lost_steps": big["lost_steps"] + small["lost_steps"],
        "segments_refused": big["segments_refused"],
        "updates_per_s": big["updates_per_s"],
        "updates_per_s_small": small["updates_per_s"],
        "updates_per_s_trainer_alone": big["updates_per_s_trainer_alone"],
        "updates_per_s_trainer_alone_small": small["updates_per_s_trainer_alone"],
        # Cores each learner process used while the robots streamed (CPU seconds / window).
        "cores_used": {name: round(seconds / bench.duration_s, 2) for name, seconds in big["cpu_s"].items()},
        "cores_used_small": {name: round(seconds / bench.small_duration_s, 2)
                             for name, seconds in small["cpu_s"].items()},
        "writer_backlog_max": max((b[1] for b in big["writer_backlog"]), default=0),
        "writer_staged_mb_max": max((b[2] for b in big["writer_backlog"]), default=0.0),
        "writer_backlog": big["writer_backlog"],
        "updates": big["updates"],
        "failures": [f for f in (*big["robot_failures"], big["trainer_failure"], *small["robot_failures"],
                                 small["trainer_failure"]) if f],
    }
    report["updates_ratio"] = ratio(report["updates_per_s"], report["updates_per_s_small"])
    report["updates_ratio_trainer_alone"] = ratio(report["updates_per_s_trainer_alone"],
                                                  report["updates_per_s_trainer_alone_small"])
    return report


def ratio(big: float, small: float) -> float | None:
    return round(big / small, 3) if small else None


def plot_rss(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, points in report["rss_mb"].items():
        if points:
            ax.plot([t / 60 for t, _ in points], [mb for _, mb in points], label=name)
    ax.axvline(report["warmup_s"] / 60, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MB)")
    config = report["config"]
    ax.set_title(f"learner RSS: {config['robots']} robots x 2 cameras at {config['image'][1]}x{config['image'][0]}, "
                 f"index budget {report['index_memory_budget_mb']:.0f} MB", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(report: dict[str, Any]) -> None:
    table = Table(title="soak: the learner's memory, losses, writer and training rate")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [("RSS growth after warm-up (MB)", report["rss_growth_mb_after_warmup"]),
            ("index memory budget (MB)", report["index_memory_budget_mb"]),
            ("index frames at end, all stored (MB)", report["index_frame_mb_at_end"]),
            ("writer drain after the window (s)", report["writer_drain_s"]),
            ("episodes let go to the spill / the dataset",
             f"{report['episodes_in_spill']} / {report['episodes_read_back_from_disk']}"),
            ("spill at end (MB)", report["spill_mb_at_end"]),
            ("steps streamed (in real time)", f"{report['steps_streamed']} ({report['steps_expected']})"),
            ("lost steps", report["lost_steps"]),
            ("writer backlog max (episodes)", report["writer_backlog_max"]),
            ("writer staged max (MB)", report["writer_staged_mb_max"]),
            ("updates/s at camera size", report["updates_per_s"]),
            ("updates/s at small size", report["updates_per_s_small"]), ("ratio", report["updates_ratio"]),
            ("cores used at camera size (main / writer / readers)", "/".join(map(str, report["cores_used"].values()))),
            ("cores used at small size", "/".join(map(str, report["cores_used_small"].values()))),
            ("updates/s, trainer alone after (camera / small)",
             f"{report['updates_per_s_trainer_alone']} / {report['updates_per_s_trainer_alone_small']}"),
            ("ratio, trainer alone", report["updates_ratio_trainer_alone"])]
    for name, value in rows:
        table.add_row(name, str(value))
    Console(width=120).print(table)


def run_from_cli(cfg: RobotRLConfig, json_path: Path) -> dict:
    report = timed_run(lambda progress: run_soak_bench(cfg, progress=progress))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot_rss(report, json_path.with_suffix(".png")))
    print_table(report)
    return report
