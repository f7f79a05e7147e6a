"""Shared by the learner and streaming tests: synthetic Steps, a tiny FlowVLA, small configs."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robot_rl.core.types import Step
from robot_rl.learner.algorithms.config import WeightedBCConfig
from robot_rl.learner.config import StoreConfig, TrainerConfig
from robot_rl.policies.flow_vla import FlowVLA, FlowVLAConfig
from robot_rl.policies.text_encoder import InstructionEncoder

JOINTS = tuple(f"j{i}" for i in range(6))
IMG = 16
CAMERAS = ("front",)
BC = WeightedBCConfig()  # plain behaviour cloning: the algorithm of the tests about the loop, not the update


def hashed_embeddings(texts: list[str]) -> np.ndarray:
    """Offline stand-in for the sentence encoder: a fixed random unit vector per string."""
    out = []
    for s in texts:
        seed = int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(384)
        out.append(v / np.linalg.norm(v))
    return np.stack(out).astype(np.float32)


TEXT = InstructionEncoder(backend=hashed_embeddings)


def tiny_policy_config() -> FlowVLAConfig:
    """A FlowVLA small enough for a CPU test. No state noise: the model draws it from torch's
    global generator, and the learner tests check that updates depend on the seeds they own.
    Raw instruction embeddings: the tests' episodes share one instruction, which standardised
    over the instructions seen would be all zeros (no gradient for the text and FiLM weights)."""
    return FlowVLAConfig(cameras=CAMERAS, image_size=IMG, chunk_size=4, cnn_channels=(8, 8), image_grid=2,
                         d_model=16, n_heads=2, n_layers=1, n_expert_layers=1, ffn_mult=2, max_state_offset=2,
                         num_integration_steps=2, state_noise_std=0.0, normalize_instruction=False)


def tiny_policy(seed: int = 0) -> FlowVLA:
    torch.manual_seed(seed)
    return FlowVLA(tiny_policy_config(), text_encoder=TEXT).eval()


# Push episodes of 6 ticks at 32x32: a held-out evaluation in a second, never a success.
TINY_SIM = ["robot.image_height=32", "robot.image_width=32", "robot.max_episode_steps=6"]


def tiny_sim_weights(directory: Path, monkeypatch) -> tuple[Path, Any]:
    """A tiny two-camera FlowVLA saved in ``directory`` and a config whose push episodes last
    6 ticks at 32x32: a held-out evaluation in a second, never a success. The sentence
    encoder is replaced by ``TEXT`` (offline)."""
    from robot_rl.config import load_config

    monkeypatch.setattr(InstructionEncoder, "_shared", TEXT)
    config = tiny_policy_config()
    config.cameras = ("front", "wrist")
    FlowVLA(config, text_encoder=TEXT).save_pretrained(directory)
    return directory, load_config(TINY_SIM)


def store_config(root: Path, **overrides) -> StoreConfig:
    base = dict(root=str(root), fps=30, joint_names=JOINTS, cameras=CAMERAS, image_height=IMG, image_width=IMG,
                background_commit=False, writer="thread")  # in-process: tests patch the recorder
    return StoreConfig(**{**base, **overrides})


def trainer_config(checkpoints: Path, **overrides) -> TrainerConfig:
    base = dict(batch_size=4, lr=1e-3, min_steps_to_train=1, publish_every_updates=1000, publish_every_s=1e9,
                checkpoint_dir=str(checkpoints), checkpoint_every_updates=1000, device="cpu")
    return TrainerConfig(**{**base, **overrides})


def make_step(tick: int, *, episode: int = 0, robot: int = 0, intervention: bool = False, done: bool = False,
              version: int = 0) -> Step:
    """A step whose numbers say where it came from: state[0]=robot, state[1]=episode, state[2]=tick.

    Policy-driven unless ``intervention``: it belongs to a chunk (chunk_id >= 0), as every
    step the edge executes from a chunk does; a step with no chunk and no human is a hold."""
    state = np.array([robot, episode, tick, 0, 0, 0], dtype=np.float32)
    image = np.full((IMG, IMG, 3), (tick * 7) % 256, dtype=np.uint8)
    return Step(tick=tick, time_s=tick / 30, state=state, action=state + 1, images={"front": image},
                instruction="pick the cube", is_intervention=intervention, done=done, policy_version=version,
                chunk_id=-1 if intervention else tick // 4)


def make_steps(n: int, **kwargs) -> list[Step]:
    return [make_step(t, done=(t == n - 1), **kwargs) for t in range(n)]


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition") -> None:
    """Bounded wait for socket-driven state (not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def finishes_within(call: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``call()`` on a thread of its own; its result, or an AssertionError if it is still running after
    ``timeout_s`` (a hang becomes a failure; the thread is left to the process's exit)."""
    out: list = []
    errors: list[Exception] = []

    def target() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - whatever call() raises is re-raised on the test's thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True, name=f"finishes_within: {what}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise AssertionError(f"{what} still running after {timeout_s} s: something it calls blocks")
    if errors:
        raise errors[0]
    return out[0]


def learner_config(root: Path, router: str = "tcp://127.0.0.1:*", pub: str = "tcp://127.0.0.1:*", **trainer):
    from robot_rl.learner.config import ConsoleConfig, LearnerConfig, ServiceConfig

    return LearnerConfig(store=store_config(root / "store", background_commit=True),
                         trainer=trainer_config(root / "ckpt", **trainer),
                         service=ServiceConfig(router_endpoint=router, pub_endpoint=pub, heartbeat_interval_s=0.2),
                         console=ConsoleConfig(enabled=False))  # the console's own tests turn it on


def robot_features() -> dict:
    """What the test robots record, as their hello says it (``Hello.features``)."""
    return {"fps": 30, "joint_names": list(JOINTS), "cameras": {cam: [IMG, IMG] for cam in CAMERAS}}


def client_config(robot: str, learner, spool: Path, **overrides):
    from robot_rl.bridges.zmq.client import ClientConfig

    base = dict(robot_id=robot, router_endpoint=learner.router_endpoint, pub_endpoint=learner.pub_endpoint,
                features=robot_features(),
                spool_dir=str(spool / robot), config_hash=tiny_policy().config_hash(), heartbeat_interval_s=0.2,
                hello_retry_s=0.1, ack_timeout_s=2.0, server_timeout_s=2.0)
    return ClientConfig(**{**base, **overrides})


def stored_triples(store_root: Path) -> list[tuple[int, int, int]]:
    """(robot, episode, tick) of every step in the dataset, read back with LeRobot."""
    from robot_rl.data.reader import load_episode_arrays

    out = []
    for episode in load_episode_arrays(store_root / "dataset", "local/robot_rl_replay"):
        out += [tuple(int(v) for v in row[:3]) for row in episode["state"]]
    return out


def stored_episode_frames(store_root: Path, frame_id: Callable[[np.ndarray], int]
                          ) -> dict[tuple[str, int], list[int]]:
    """(robot, episode) -> ``frame_id(image)`` of each of its stored steps, in stored order: the robot
    and episode from the store's ledger, the number from its first camera's frame (LeRobot reads it)."""
    from robot_rl.data.reader import load_episode_arrays
    from robot_rl.learner.ledger import CommitRecord

    lines = (store_root / "ledger.jsonl").read_text().splitlines()
    commits = [CommitRecord.from_json(data) for data in map(json.loads, lines) if data["op"] == "commit"]
    owner = {record.index: (record.robot_id, record.episode_id) for record in commits}
    out: dict[tuple[str, int], list[int]] = {}
    for episode in load_episode_arrays(store_root / "dataset", "local/robot_rl_replay"):
        frames = out.setdefault(owner[episode["episode_index"]], [])
        frames += [frame_id(image) for image in episode[f"images.{CAMERAS[0]}"]]
    return out
