"""`robot-rl bench cameras`: can the learner's store keep up with real cameras, and what does training read back?

Why: a lab's SO-101 streams two 640x480 cameras at 30 Hz: 60 frames/s per robot, 240 from four.
Stored as PNG inside the parquet (the layout the sim's 96x96 frames use) a 640x480 frame costs
~70 ms of a core, so the store would fall further behind every second; LeRobot's video encoding
(``learner.store.frames``, ``robot_rl.data.frame_storage``) is the alternative, at the price of
lossy frames and a decode when training reads them.

What runs, per image layout side by side: the store's own dataset writer in its own process (the
default ``learner.store.writer``) fed in real time, for ``window_s``, the episodes of ``robots``
robots: each robot finishes an ``episode_s`` episode every ``episode_s`` seconds (robots staggered
evenly), handed over as the staged wire segments the learner keeps (JPEG frames, as the edge sends
them). The frames are the sim's own scenes rendered at the camera size by the scripted expert,
plus sensor noise (σ = 2 levels, fresh per frame, as a real sensor's), so the encoder sees moving
arm, cube and table, not a synthetic pattern. A queue of finished episodes not yet written is
sampled every second: the writer kept up if at most about one episode per robot waits at the end
(and never twice that in the second half). After the window a writer that kept up drains its
queue; one that did not finishes the episode it is on. The writer process's CPU time per frame
says how many cores would keep up (``cores_needed``): the store's cost on a bigger learner machine.

Then the training read: whole episodes read back into arrays as the learner's sampling index does
(``load_episode_arrays``), frames/s and bytes on disk per frame, for the camera size and for the
sim's 96x96 (today's PNG-in-parquet store) in both layouts.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from robot_rl.bench.config import CamerasBenchConfig
from robot_rl.bench.cpu import process_cpu_seconds
from robot_rl.bench.progress import timed_run
from robot_rl.bench.transport import SEGMENT_STEPS

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # lerobot's writer would print a bar per episode
REPO_ID = "local/bench_cameras"
SENSOR_NOISE = 2.0  # grey levels: a webcam's read noise in good light
READ_BACK_EPISODES = 4


@dataclass
class Feed:
    """One robot's episode as the learner stages it: wire segments, JPEG frames."""

    segments: list[list[bytes]]
    steps: int
    frames: int


def rendered_episode(height: int, width: int, steps: int, seed: int) -> list[Any]:
    """The scripted expert's attempt at one scene, rendered at ``height`` x ``width``, as Steps
    (the last held until ``steps`` if it finishes sooner)."""
    from robot_rl.app.demos import expert_episode
    from robot_rl.app.sim import demo_expert
    from robot_rl.hardware.sim.config import SimConfig
    from robot_rl.hardware.sim.robot import SimSO101

    robot = SimSO101(SimConfig(image_height=height, image_width=width, max_episode_steps=steps))
    robot.connect()
    try:
        episode = expert_episode(robot, demo_expert(robot, 1.0), seed, None, 0)
    finally:
        robot.disconnect()
    while len(episode.steps) < steps:
        last = episode.steps[-1]
        episode.steps.append(type(last)(**{**last.__dict__, "tick": len(episode.steps)}))
    for step in episode.steps:
        step.done = step.tick == steps - 1
    return episode.steps


def robot_feed(steps: list[Any], robot: int) -> Feed:
    """``steps`` with this robot's own sensor noise, encoded as the edge sends them (JPEG)."""
    from robot_rl.bridges.zmq.protocol import encode_message
    from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment

    rng = np.random.default_rng(robot)
    noisy = []
    for step in steps:
        images = {cam: np.clip(img + rng.normal(0, SENSOR_NOISE, img.shape), 0, 255).astype(np.uint8)
                  for cam, img in step.images.items()}
        noisy.append(type(step)(**{**step.__dict__, "images": images}))
    chunks = [noisy[i:i + SEGMENT_STEPS] for i in range(0, len(noisy), SEGMENT_STEPS)]
    segments = [[bytes(f) for f in encode_message(encode_segment(f"cam-{robot}", 0, seq, chunk,
                                                                 episode_done=chunk[-1].done,
                                                                 image_encoding=ImageEncoding("jpeg")))]
                for seq, chunk in enumerate(chunks)]
    return Feed(segments, len(steps), len(steps) * len(steps[0].images))


def sustained_writing(layout: str, feeds: list[Feed], cfg: CamerasBenchConfig, root: Path,
                      cameras: dict[str, tuple[int, int]], progress: Any) -> dict[str, Any]:
    """Feed the store's writer process in real time for ``cfg.window_s``; sample its backlog."""
    from robot_rl.bench.transport import JOINTS
    from robot_rl.data.frame_storage import FrameStorageConfig
    from robot_rl.learner.store_writer import ProcessEpisodeWriter, RecorderSpec

    spec = RecorderSpec(str(root), 30, JOINTS, cameras, REPO_ID, FrameStorageConfig(images=layout))
    writer = ProcessEpisodeWriter(spec)
    writer.finalize()  # start the child (imports, dataset open) before the clock runs
    finished: queue.Queue = queue.Queue()
    written = {"episodes": 0, "frames": 0}
    busy_s = 0.0
    failed: list[BaseException] = []
    stop = threading.Event()

    def write_loop() -> None:
        nonlocal busy_s
        while not stop.is_set():
            try:
                robot, episode = finished.get(timeout=0.2)
            except queue.Empty:
                continue
            started = time.monotonic()
            try:
                writer.write(f"cam-{robot}", episode, feeds[robot].segments)
                written["episodes"] += 1
                written["frames"] += feeds[robot].frames
                if finished.empty() or written["episodes"] % cfg.commit_batch == 0:
                    writer.finalize()
            except Exception as exc:  # noqa: BLE001 - raised on the bench's thread: a failed write is no speed
                failed.append(exc)
                stop.set()
            busy_s += time.monotonic() - started

    thread = threading.Thread(target=write_loop, name="bench-cameras-writer", daemon=True)
    thread.start()
    due = sorted((k * cfg.episode_s + r * cfg.episode_s / len(feeds) + cfg.episode_s, r, k)
                 for r in range(len(feeds)) for k in range(int(cfg.window_s / cfg.episode_s) + 1))
    due = [d for d in due if d[0] <= cfg.window_s]
    cpu_before = process_cpu_seconds(writer.pid, children=True)
    started = time.monotonic()
    backlog: list[tuple[float, int]] = []
    handed = 0
    while (now := time.monotonic() - started) < cfg.window_s:
        while handed < len(due) and due[handed][0] <= now:
            finished.put((due[handed][1], due[handed][2]))
            handed += 1
        backlog.append((round(now, 2), handed - written["episodes"]))
        time.sleep(1.0)
    for _, robot, episode in due[handed:]:  # finished by the window's end, between two samples
        finished.put((robot, episode))
    handed = len(due)
    window_cpu = process_cpu_seconds(writer.pid, children=True) - cpu_before
    frames_in_window = written["frames"]
    at_end = handed - written["episodes"]
    half = [n for t, n in backlog if t >= cfg.window_s / 2]
    # Kept up: at most about an episode per robot waiting at the end, and never twice that lately.
    sustained = at_end <= len(feeds) and max(half, default=0) <= 2 * len(feeds)
    progress(f"{layout}: {written['episodes']} of {handed} episodes written in the window, backlog {at_end}")
    drain_s: float | None = None
    if sustained:
        drain_started = time.monotonic()
        while (written["episodes"] < handed and not failed
               and time.monotonic() - drain_started < cfg.drain_timeout_s):
            time.sleep(0.2)
        if written["episodes"] == handed:
            drain_s = round(time.monotonic() - drain_started, 2)
    stop.set()  # a layout that cannot keep up writes the episode it is on, not its queue
    thread.join()
    writer.close()
    if failed:
        raise RuntimeError(f"bench cameras: the {layout} writer failed: {failed[0]}") from failed[0]
    frames_per_s_needed = sum(feed.frames for feed in feeds) / cfg.episode_s
    return {"layout": layout, "robots": len(feeds), "frames_per_s_needed": round(frames_per_s_needed, 1),
            "episodes_finished": handed, "episodes_written": written["episodes"],
            "frames_written_per_s": round(written["frames"] / max(busy_s, 1e-9), 1),
            "writer_cores": round(window_cpu / cfg.window_s, 2),
            "cpu_ms_per_frame": round(1000 * window_cpu / max(frames_in_window, 1), 2),
            "cores_needed": round(frames_per_s_needed * window_cpu / max(frames_in_window, 1), 2),
            "backlog": backlog, "backlog_at_end": at_end,
            "sustained": sustained, "drain_s": drain_s}


def training_read(root: Path, episodes: int) -> dict[str, Any]:
    """Seconds to read ``episodes`` whole episodes back into arrays, as the sampling index does."""
    from robot_rl.data.reader import load_episode_arrays

    started = time.monotonic()
    loaded = load_episode_arrays(root, REPO_ID, episodes=list(range(episodes)))
    elapsed = time.monotonic() - started
    frames = sum(v.shape[0] for ep in loaded for k, v in ep.items() if k.startswith("images."))
    stored = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.suffix in (".parquet", ".mp4"))
    total_frames = _stored_frames(root)
    return {"frames": frames, "read_s": round(elapsed, 3), "frames_per_s": round(frames / max(elapsed, 1e-9), 1),
            "kb_per_frame": round(stored / 1024 / max(total_frames, 1), 2)}


def _stored_frames(root: Path) -> int:
    import json

    info = json.loads((root / "meta" / "info.json").read_text())
    cameras = sum(1 for key in info["features"] if key.startswith("observation.images."))
    return int(info["total_frames"]) * cameras


def small_frames_read(layout: str, cfg: CamerasBenchConfig, root: Path) -> dict[str, Any]:
    """The sim's 96x96 frames in ``layout``: written unpaced, then read back."""
    from robot_rl.bench.transport import JOINTS
    from robot_rl.data.frame_storage import FrameStorageConfig
    from robot_rl.learner.store_writer import RecorderSpec, ThreadEpisodeWriter

    size = cfg.small_image
    feed = robot_feed(rendered_episode(size, size, int(cfg.episode_s * 30), seed=1), robot=0)
    spec = RecorderSpec(str(root), 30, JOINTS, {"front": (size, size), "wrist": (size, size)}, REPO_ID,
                        FrameStorageConfig(images=layout))
    writer = ThreadEpisodeWriter(spec)
    started = time.monotonic()
    for episode in range(READ_BACK_EPISODES):
        writer.write("cam-0", episode, feed.segments)
    writer.close()
    write_s = time.monotonic() - started
    row = training_read(root, READ_BACK_EPISODES)
    return {"layout": layout, "image": [size, size],
            "frames_written_per_s": round(READ_BACK_EPISODES * feed.frames / write_s, 1), **row}


def run_cameras_bench(cfg: CamerasBenchConfig, progress: Any = print) -> dict[str, Any]:
    height, width = cfg.image
    progress(f"rendering the scripted expert's episode at {width}x{height} ({int(cfg.episode_s * 30)} steps)")
    steps = rendered_episode(height, width, int(cfg.episode_s * 30), seed=0)
    feeds = [robot_feed(steps, robot) for robot in range(cfg.robots)]
    cameras = {cam: (height, width) for cam in steps[0].images}
    report: dict[str, Any] = {"config": {"robots": cfg.robots, "image": [height, width], "cameras": list(cameras),
                                         "window_s": cfg.window_s, "episode_s": cfg.episode_s,
                                         "commit_batch": cfg.commit_batch},
                              "sustained": [], "read": []}
    with tempfile.TemporaryDirectory(prefix="bench-cameras-") as tmp:
        for layout in cfg.layouts:
            progress(f"{layout}: {cfg.robots} robots x {len(cameras)} cameras at {width}x{height}, 30 Hz, "
                     f"{cfg.window_s:.0f} s")
            root = Path(tmp) / f"{layout}-{width}x{height}"
            row = sustained_writing(layout, feeds, cfg, root, cameras, progress)
            if row["episodes_written"] >= 1:
                row["read"] = training_read(root, min(READ_BACK_EPISODES, row["episodes_written"]))
            report["sustained"].append(row)
        for layout in cfg.layouts:
            progress(f"{layout}: read back at {cfg.small_image}x{cfg.small_image}")
            report["read"].append(small_frames_read(layout, cfg, Path(tmp) / f"{layout}-small"))
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    config = report["config"]
    height, width = config["image"]
    table = Table(title=f"store at {width}x{height}: {config['robots']} robots x {len(config['cameras'])} cameras, "
                        f"30 Hz, {config['window_s']:.0f} s in real time")
    for col in ("layout", "frames/s needed", "writer frames/s", "writer cores", "CPU ms/frame", "cores needed",
                "episodes written/finished", "backlog at end", "kept up", "drain s", "read frames/s", "KB/frame"):
        table.add_column(col, justify="right")
    for row in report["sustained"]:
        read = row.get("read", {})
        table.add_row(row["layout"], f"{row['frames_per_s_needed']:.0f}", f"{row['frames_written_per_s']:.0f}",
                      f"{row['writer_cores']:.2f}", f"{row['cpu_ms_per_frame']:.1f}", f"{row['cores_needed']:.2f}",
                      f"{row['episodes_written']} / {row['episodes_finished']}",
                      str(row["backlog_at_end"]), "yes" if row["sustained"] else "NO",
                      "-" if row["drain_s"] is None else f"{row['drain_s']:.1f}",
                      f"{read['frames_per_s']:.0f}" if read else "-", f"{read['kb_per_frame']:.1f}" if read else "-")
    Console(width=160).print(table)
    small = Table(title="training read of the sim's frames (whole episodes into arrays)")
    for col in ("layout", "image", "written frames/s", "read frames/s", "KB / frame"):
        small.add_column(col, justify="right")
    for row in report["read"]:
        small.add_row(row["layout"], "x".join(map(str, row["image"])), f"{row['frames_written_per_s']:.0f}",
                      f"{row['frames_per_s']:.0f}", f"{row['kb_per_frame']:.1f}")
    Console(width=160).print(small)


def run_from_cli(cfg: RobotRLConfig) -> dict:
    report = timed_run(lambda progress: run_cameras_bench(cfg.bench, progress=progress))
    print_table(report)
    return report
