"""Test-only stand-ins for the edge runtime tests: a kinematic robot and deterministic policies.

The kinematic robot reaches every commanded target within one tick (no physics), so
the measured state after tick t is exactly the action sent at tick t: timing logic can
be checked without a simulator. The encoding policy writes (call number, chunk index)
into every action, so each executed action says exactly where it came from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from robot_rl.hardware.robot import Observation, features_for, validate_action
from robot_rl.policies.base import ObservationHistory, PastObservation

CODE = 1000  # action value = base + CODE * call + index


class KinematicRobot:
    """Position-controlled arm that is at its last target: state(t+1) = clip(action(t))."""

    name = "kinematic"
    camera_names = ("front",)

    def __init__(self, num_joints: int = 6, fps: int = 30, limit: float = 1e7, start: float = 0.0) -> None:
        self.fps = fps
        self.joint_names = tuple(f"j{i}" for i in range(num_joints))
        self._lower = np.full(num_joints, -limit, dtype=np.float32)
        self._upper = np.full(num_joints, limit, dtype=np.float32)
        self.state = np.full(num_joints, start, dtype=np.float32)
        self.sent: list[np.ndarray] = []
        self._connected = True

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        return self._lower, self._upper

    @property
    def observation_features(self) -> dict:
        return features_for(self.joint_names, {"front": (4, 4)})[0]

    @property
    def action_features(self) -> dict:
        return features_for(self.joint_names, {"front": (4, 4)})[1]

    def connect(self) -> None:
        self._connected = True

    def disconnect(self) -> None:
        self._connected = False

    def get_observation(self) -> Observation:
        return {"images": {"front": np.zeros((4, 4, 3), dtype=np.uint8)}, "state": self.state.copy()}

    def send_action(self, action: np.ndarray) -> np.ndarray:
        arr = np.clip(validate_action(action, self.joint_names), self._lower, self._upper)
        self.state = arr.copy()
        self.sent.append(arr.copy())
        return arr


class FrameCountingRobot(KinematicRobot):
    """A kinematic robot whose camera shows a different frame at every observation: all pixels equal
    ``step`` times the number of observations taken before (``seen`` holds each one's measured state)."""

    def __init__(self, image_size: int = 4, step: int = 1) -> None:
        super().__init__(num_joints=6, fps=30)
        self.image_size, self.step = image_size, step
        self.seen: list[np.ndarray] = []

    def get_observation(self) -> Observation:
        value = self.step * len(self.seen)
        self.seen.append(self.state.copy())
        return {"images": {"front": np.full((self.image_size, self.image_size, 3), value, np.uint8)},
                "state": self.state.copy()}


class PastEchoPolicy:
    """Reads two observations; every action of its chunk says which frames it was given (a frame's pixel
    value): joint 0 the earlier observation's (-1 without one), joint 1 the request's own."""

    chunk_size, action_dim = 8, 6
    cameras = ("front",)  # served: the edge sends the cameras a policy names, no others
    observation_history = ObservationHistory(steps=2)

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        return self.predict_chunk_with_history((), observation, state, instruction)

    def predict_chunk_with_history(self, history: Sequence[PastObservation], observation: dict, state: np.ndarray,
                                   instruction: str) -> np.ndarray:
        chunk = np.zeros((self.chunk_size, self.action_dim), np.float32)
        chunk[:, 0] = float(history[-1].images["front"][0, 0, 0]) if history else -1.0
        chunk[:, 1] = float(observation["front"][0, 0, 0])
        return chunk

    def save_pretrained(self, directory: str) -> None:  # protocol completeness
        pass


class EncodingPolicy:
    """Chunk of call c: every joint of action i equals ``base + CODE * c + i``.

    Remembers the state and instruction of every call. ``load_state_dict({"base": b})``
    stands in for new weights (the output changes visibly).
    """

    def __init__(self, chunk_size: int = 20, action_dim: int = 6, base: float = 0.0) -> None:
        self.chunk_size = chunk_size
        self.action_dim = action_dim
        self.base = base
        self.calls = 0
        self.states: list[np.ndarray] = []
        self.instructions: list[str] = []

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        self.states.append(np.array(state, dtype=np.float32))
        self.instructions.append(instruction)
        values = self.base + CODE * self.calls + np.arange(self.chunk_size, dtype=np.float32)
        self.calls += 1
        return np.repeat(values[:, None], self.action_dim, axis=1).astype(np.float32)

    def load_state_dict(self, state_dict: dict) -> None:
        self.base = float(state_dict["base"])

    def save_pretrained(self, directory: str) -> None:  # protocol completeness
        pass


def decode(action: np.ndarray, base: float = 0.0) -> tuple[int, int]:
    """(call number, chunk index) of an action produced by EncodingPolicy."""
    value = int(round(float(action[0]) - base))
    return value // CODE, value % CODE


class FaultyPolicy(EncodingPolicy):
    """EncodingPolicy that misbehaves on chosen calls: "nan", "shape" or "raise"."""

    def __init__(self, faults: dict[int, str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.faults = faults

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        fault = self.faults.get(self.calls)
        chunk = super().predict_chunk(observation, state, instruction)
        if fault == "nan":
            chunk[3, 1] = np.nan
        elif fault == "shape":
            chunk = chunk[:, :-1]
        elif fault == "raise":
            raise RuntimeError("simulated policy crash")
        return chunk


class SlowPolicy(EncodingPolicy):
    """Really takes ``compute_s`` per chunk, for the threaded runner on the wall clock."""

    def __init__(self, compute_s: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.compute_s = compute_s

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        time.sleep(self.compute_s)
        return super().predict_chunk(observation, state, instruction)


class ScriptedLatency:
    """Latency model that returns the given latencies (ms) in order, then repeats the last."""

    def __init__(self, latencies_ms: Sequence[float]) -> None:
        self.latencies_ms = list(latencies_ms)
        self.calls = 0

    def sample_s(self, compute_s: float = 0.0) -> float:
        ms = self.latencies_ms[min(self.calls, len(self.latencies_ms) - 1)]
        self.calls += 1
        return ms / 1000.0


class CountingTask:
    """Succeeds from tick ``success_tick`` on (counted by reward() calls, one per tick)."""

    def __init__(self, success_tick: int) -> None:
        self.success_tick = success_tick
        self.ticks = 0

    def reward(self) -> float:
        self.ticks += 1
        return 1.0 if self.is_success() else 0.0

    def is_success(self) -> bool:
        return self.ticks > self.success_tick


class TorchEncodingPolicy(torch.nn.Module):
    """EncodingPolicy's chunks from a torch module: action i of a chunk is ``base + i`` on every
    joint, ``base`` a buffer, so published weights (a state dict with another base) show in the
    very next chunk; ``load_hold_s`` makes every weights load hold the interpreter lock that long
    (a C-level loop that never yields it), the way a slow library call in a loader would."""

    def __init__(self, chunk_size: int = 20, action_dim: int = 6, base: float = 0.0, load_hold_s: float = 0.0
                 ) -> None:
        super().__init__()
        self.chunk_size = chunk_size
        self.action_dim = action_dim
        self.load_hold_s = load_hold_s
        self.register_buffer("base", torch.tensor(float(base)))

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        values = float(self.base) + np.arange(self.chunk_size, dtype=np.float32)
        return np.repeat(values[:, None], self.action_dim, axis=1).astype(np.float32)

    def published_state_dict(self) -> dict:
        if self.load_hold_s > 0:
            hold_interpreter_lock(self.load_hold_s)
        return self.state_dict()

    def save_pretrained(self, directory: str) -> None:  # protocol completeness
        pass


def hold_interpreter_lock(seconds: float) -> None:
    """Hold the GIL for about ``seconds``: ``sum`` over a range runs in C and never releases it."""
    per_item_s = 2e-8  # CPython's int sum, a few ns per item on any recent CPU; the loop below calibrates
    items = 1_000_000
    started = time.perf_counter()
    sum(range(items))
    per_item_s = max(per_item_s, (time.perf_counter() - started) / items)
    sum(range(int(seconds / per_item_s)))


def failing_policy(error: Exception | None = None) -> TorchEncodingPolicy:
    raise error or FileNotFoundError("no checkpoint at /nowhere (a test's policy factory)")
