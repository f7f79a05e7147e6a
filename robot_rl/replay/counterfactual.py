"""Counterfactual replay: what would the policy have done at each logged step?

For every step t the policy gets the logged observation (images, joint state,
instruction) and predicts a chunk; it is compared with what was actually executed:
its first action against logged action t, and the whole chunk against logged actions
t..t+H-1. Where a human intervened, a large error means the operator did something the
policy would not have done: that is the correction worth learning from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from robot_rl.replay.joint_mapping import JointMappingError


@dataclass
class CounterfactualResult:
    """Per-step disagreement between a policy and the logged actions (mean |error| over joints)."""

    first_error: np.ndarray  # [T] first predicted action vs logged action t
    chunk_error: np.ndarray  # [T] predicted chunk vs logged actions t..t+H-1 (those that exist)
    first_error_per_joint: np.ndarray  # [T, D]
    interventions: np.ndarray  # [T] bool

    def top_deviations(self, k: int = 5) -> list[int]:
        """Steps where the policy would have deviated most (by chunk error), largest first."""
        return [int(i) for i in np.argsort(-self.chunk_error, kind="stable")[:k]]

    def intervention_spans(self) -> list[tuple[int, int]]:
        return spans(self.interventions)

    def as_dict(self, k: int = 5) -> dict:
        inside = self.interventions
        return {
            "mean_first_error": float(self.first_error.mean()),
            "mean_chunk_error": float(self.chunk_error.mean()),
            "mean_chunk_error_during_interventions": _mean_or_none(self.chunk_error[inside]),
            "mean_chunk_error_policy_driving": _mean_or_none(self.chunk_error[~inside]),
            "top_deviations": [
                {"step": i, "chunk_error": float(self.chunk_error[i]), "intervention": bool(inside[i])}
                for i in self.top_deviations(k)
            ],
            "intervention_spans": [list(s) for s in self.intervention_spans()],
        }


def counterfactual_replay(
    policy,
    images: dict[str, np.ndarray],
    states: np.ndarray,
    actions: np.ndarray,
    instruction: str,
    interventions: np.ndarray | None = None,
    *,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> CounterfactualResult:
    """Run ``policy`` on every logged step; images by camera [T, H, W, 3], states/actions [T, D] in sim units.

    Policies with a batched ``predict_chunks`` (FlowVLA) get ``batch_size`` steps at a
    time with a fixed noise seed, so the result is reproducible; others are asked step by step.
    """
    _check_cameras(policy, images)
    length = len(actions)
    chunks = []
    for start in tqdm(range(0, length, batch_size), desc="counterfactual", leave=False, disable=not progress):
        stop = min(length, start + batch_size)
        observations = [{cam: frames[t] for cam, frames in images.items()} for t in range(start, stop)]
        chunks.extend(_predict(policy, observations, states[start:stop], instruction, seed))
    first = np.stack([np.abs(c[0] - actions[t]) for t, c in enumerate(chunks)])
    chunk_err = np.array([_chunk_error(c, actions[t:]) for t, c in enumerate(chunks)])
    flags = np.zeros(length, bool) if interventions is None else np.asarray(interventions, bool)
    return CounterfactualResult(first.mean(axis=1), chunk_err, first, flags)


def spans(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) runs where ``flags`` is true."""
    padded = np.concatenate([[False], np.asarray(flags, bool), [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _predict(policy, observations: list[dict], states: np.ndarray, instruction: str, seed: int) -> list[np.ndarray]:
    if hasattr(policy, "predict_chunks"):
        out = policy.predict_chunks(observations, states, [instruction] * len(observations), seed=seed)
        return [np.asarray(c, np.float32) for c in out]
    return [np.asarray(policy.predict_chunk(o, s, instruction), np.float32) for o, s in
            zip(observations, states, strict=True)]


def _chunk_error(chunk: np.ndarray, future: np.ndarray) -> float:
    """Mean |chunk - logged| over the steps the episode still had (the tail is shorter than H)."""
    n = min(len(chunk), len(future))
    return float(np.abs(chunk[:n] - future[:n]).mean())


def _check_cameras(policy, images: dict[str, np.ndarray]) -> None:
    wanted = list(getattr(getattr(policy, "config", None), "cameras", None) or [])
    missing = [c for c in wanted if c not in images]
    if missing:
        raise JointMappingError(
            f"the policy needs cameras {missing} but the dataset gives {sorted(images)}; "
            f"map them with replay.mapping.cameras={{DATASET_CAMERA: POLICY_CAMERA}}"
        )


def _mean_or_none(values: np.ndarray) -> float | None:
    return float(values.mean()) if len(values) else None
