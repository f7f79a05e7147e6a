"""Part 8 of `robot-rl bench faults`: every damaged file a learner or an edge reads at start is one line
and exit code 2 through the real command (``corrupt_files``), never a traceback or a process that comes
up and waits.

Each variant builds what the command reads (a store's dataset, a video-stored one, a FlowVLA or a
LeRobot checkpoint, a robot's own dataset), damages one file, runs ``robot-rl learner`` or ``robot-rl
edge`` on it in a process of its own and passes when the process exits 2 with exactly one line on
stderr naming the damaged file, and no traceback. The datasets are written by the project's own
recorder (LeRobot's writer); the checkpoints by ``save_pretrained``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robot_rl.app.policies import SHIPPED_BC
from robot_rl.core.types import Episode, Step

COMMAND_TIMEOUT_S = 300.0  # a cold process imports torch, LeRobot and MuJoCo before it reads anything
JOINTS = tuple(f"joint{i}" for i in range(6))
CAMERAS = {"front": (32, 32), "wrist": (32, 32)}
STORE_REPO_ID = "local/robot_rl_replay"  # learner.store.repo_id's default: what the learner opens


@dataclass(frozen=True)
class Variant:
    command: str  # "learner" or "edge"
    damaged: str  # the file, relative to the variant's directory
    damage: Callable[[Path], None]
    args: tuple[str, ...]  # the command's overrides; {root} is the variant's directory


def garble(path: Path, offset: int = 40) -> None:
    """Bytes that are neither UTF-8 nor what the file's format expects, over the file's own."""
    data = bytearray(path.read_bytes())
    offset = min(offset, max(0, len(data) - 16))
    data[offset:offset + 16] = b"\xff\xfe\x00\x81" * 4
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _episode(episode_id: int, ticks: int = 6) -> Episode:
    rng = np.random.default_rng(episode_id)
    steps = [Step(tick=t, time_s=t / 30, state=np.full(len(JOINTS), t, np.float32),
                  action=np.full(len(JOINTS), t + 1, np.float32), done=t == ticks - 1,
                  images={cam: rng.integers(0, 255, (h, w, 3), np.uint8) for cam, (h, w) in CAMERAS.items()})
             for t in range(ticks)]
    return Episode("robot-0", episode_id, "push the cube", steps=steps)


def _dataset(root: Path, repo_id: str, images: str) -> None:
    """Two episodes, each written by a recorder of its own: two data files (two video files per camera)."""
    from robot_rl.data.frame_storage import FrameStorageConfig
    from robot_rl.data.recorder import EpisodeRecorder

    for episode_id in (0, 1):
        with EpisodeRecorder(root, 30, JOINTS, CAMERAS, repo_id=repo_id,
                             frames=FrameStorageConfig(images=images)) as recorder:
            recorder.write_episode(_episode(episode_id))


def _lerobot_checkpoint(directory: Path) -> None:
    """A randomly initialised ACT (no download) and its processors, saved as ``lerobot-train`` does."""
    # LeRobot's policy stack: the edge and learner extras, as for every LeRobot checkpoint
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (len(JOINTS),)),
              **{f"observation.images.{cam}": PolicyFeature(FeatureType.VISUAL, (3, h, w))
                 for cam, (h, w) in CAMERAS.items()}}
    config = make_policy_config("act", input_features=inputs,
                                output_features={"action": PolicyFeature(FeatureType.ACTION, (len(JOINTS),))},
                                chunk_size=4, n_action_steps=4, dim_model=32, n_heads=2, dim_feedforward=64,
                                n_encoder_layers=1, n_decoder_layers=1, latent_dim=8,
                                pretrained_backbone_weights=None, device="cpu")
    stats = {key: {"mean": torch.zeros(feature.shape[0]), "std": torch.ones(feature.shape[0])}
             for key, feature in {**inputs, "action": PolicyFeature(FeatureType.ACTION, (len(JOINTS),))}.items()}
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    for part in (get_policy_class("act")(config), preprocessor, postprocessor):
        part.save_pretrained(directory)


def _sources(root: Path) -> Path:
    """What the variants damage copies of: built once."""
    sources = root / "sources"
    _dataset(sources / "store" / "dataset", STORE_REPO_ID, "png")
    _dataset(sources / "video-store" / "dataset", STORE_REPO_ID, "video")
    _dataset(sources / "edge" / "session", "local/robot_rl_session", "png")
    shutil.copytree(SHIPPED_BC, sources / "flow")  # a FlowVLA checkpoint as save_pretrained writes it
    _lerobot_checkpoint(sources / "act")
    return sources


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _learner_args(store: str) -> tuple[str, ...]:
    return ("--no-train", f"learner.store.root={{root}}/{store}", "learner.trainer.checkpoint_dir={root}/ckpt",
            "learner.trainer.device=cpu", "learner.console.enabled=false", "learner.trainer.log_dir=''",
            "learner.service.router_endpoint=tcp://127.0.0.1:{port}",
            "learner.service.pub_endpoint=tcp://127.0.0.1:{port2}")


EDGE_ARGS = ("link.learner=tcp://127.0.0.1:{port}", "session.episodes=1", "session.max_episode_steps=3",
             "session.realtime=false", "robot.image_height=32", "robot.image_width=32", "output_dir={root}/edge")

VARIANTS: dict[str, Variant] = {
    "learner: store info.json garbled": Variant("learner", "store/dataset/meta/info.json", garble,
                                                _learner_args("store")),
    "learner: store tasks.parquet garbled": Variant("learner", "store/dataset/meta/tasks.parquet",
                                                    lambda p: garble(p, p.stat().st_size // 2), _learner_args("store")),
    "learner: store stats.json garbled": Variant("learner", "store/dataset/meta/stats.json", garble,
                                                 _learner_args("store")),
    "learner: first data file truncated": Variant("learner", "store/dataset/data/chunk-000/file-000.parquet",
                                                  truncate, _learner_args("store")),
    "learner: first video file truncated": Variant(
        "learner", "video-store/dataset/videos/observation.images.front/chunk-000/file-000.mp4", truncate,
        _learner_args("video-store")),
    "learner: init checkpoint truncated": Variant("learner", "flow/model.safetensors", truncate,
                                                  (*_learner_args("store"), "learner.init_checkpoint={root}/flow")),
    "learner: LeRobot checkpoint config.json garbled": Variant(
        "learner", "act/config.json", garble, (*_learner_args("store"), "policy=lerobot", "policy.path={root}/act")),
    "edge: FlowVLA checkpoint truncated": Variant("edge", "flow/model.safetensors", truncate,
                                                  ("policy.path={root}/flow", *EDGE_ARGS)),
    "edge: LeRobot checkpoint weights truncated": Variant(
        "edge", "act/model.safetensors", truncate, ("policy=lerobot", "policy.path={root}/act", *EDGE_ARGS)),
    "edge: its own dataset's info.json garbled": Variant("edge", "edge/session/meta/info.json", garble,
                                                         ("policy=hold", *EDGE_ARGS)),
}


def run_variant(variant: Variant, sources: Path, root: Path) -> tuple[bool, str]:
    """(one line naming the damaged file and exit 2, what the command printed)."""
    shutil.copytree(sources, root)
    damaged = root / variant.damaged
    variant.damage(damaged)
    ports = {"port": _free_port(), "port2": _free_port()}
    args = [a.format(root=root, **ports) for a in variant.args]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    try:
        done = subprocess.run([sys.executable, "-m", "robot_rl.cli", variant.command, *args], env=env,
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"still running after {COMMAND_TIMEOUT_S:.0f} s"
    errors = [line for line in done.stderr.splitlines() if line.startswith(f"robot-rl {variant.command}:")]
    output = done.stdout + done.stderr
    ok = (done.returncode == 2 and len(errors) == 1 and "Traceback" not in output
          and f"{damaged}:" in errors[0])
    return ok, f"exit {done.returncode}: " + (errors[0] if errors else output[-500:])


def corrupt_files(root: Path, names: list[str], progress: Callable[[str], None]) -> dict[str, object]:
    """The variants named (all where ``names`` is empty), each on a copy of the same sources."""
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise ValueError(f"bench.corrupt_variants: unknown {unknown}; known: {list(VARIANTS)}")
    chosen = names or list(VARIANTS)
    sources = _sources(root)
    results: dict[str, str] = {}
    passed = 0
    for i, name in enumerate(chosen):
        progress(f"corrupt files {i + 1}/{len(chosen)}: {name}")
        ok, said = run_variant(VARIANTS[name], sources, root / f"variant-{i}")
        passed += ok
        results[name] = said if not ok else "one line, exit 2"
    return {"variants": len(chosen), "one_line_exit_2": passed, "results": results}


def corrupt_files_passed(row: dict[str, object]) -> bool:
    return row["one_line_exit_2"] == row["variants"]
