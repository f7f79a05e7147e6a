"""Rewards and returns from what a recorded episode carries.

A robot episode in the replay index is a dict of per-step columns (``state``, ``action``,
``images.<cam>``, ``is_intervention``, ``reward`` = the sim's dense shaping or 0,
``success``, optionally ``done`` and ``policy_version``). This module turns it into the
learning signal the ``rwr``, ``awr`` and ``rl`` algorithms need:

- **task outcome**: a terminal reward at the first successful step (or at the last step
  of an episode that ended without success);
- **dense shaping** (optional): the recorded ``reward`` column used as a potential, so
  the shaped return cannot change which policy is optimal (Ng, Harada & Russell 1999);
- **intervention penalty** (RLIF, Luo et al. 2023): a human takeover says "the policy was
  going wrong", so the policy-driven steps just before each takeover share a penalty;
- **returns**: discounted return-to-go, n-step and TD(lambda) targets, and the chunk-level
  transition (reward summed over one action chunk, discount, next observation) that the
  critics over action chunks are trained on.

Everything per-sample is computed on demand from the episode as it stands, because online
episodes are sampled while they are still growing (their outcome is then not yet known:
``episode_finished`` is False and their returns are partial).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_rl.core.types import VerdictSource, source_code
from robot_rl.learner.config import RewardConfig

TASK_CODE = source_code(VerdictSource.task)  # what an episode recorded before sources were says

# Per-sample fields that ``transition_fields`` adds to a training sample (see there).
TRANSITION_FIELDS = ("return", "episode_return", "chunk_reward", "chunk_discount", "transition_valid",
                     "episode_success", "autonomous_success", "episode_finished", "policy_version",
                     "episode_success_confidence", "episode_success_source", "next.state")  # + "next.images.<cam>"


# ---------------------------------------------------------------- per-step rewards


@dataclass(frozen=True)
class EpisodeRewards:
    """An episode's shaped per-step rewards and its outcome, computed once per episode state.

    ``horizon`` is the number of steps that count: up to and including the first success
    step of a successful episode (what happens after the task is done is not rewarded),
    else the whole episode. ``last_takeover`` is the last step (before the horizon) at which
    a human took over, -1 if none did: steps before it did not lead to success on their own.
    """

    rewards: np.ndarray  # float64 [T]
    success: bool
    finished: bool
    horizon: int
    last_takeover: int = -1
    episode_return: float = 0.0  # discounted return of the whole episode, from its first step

    def autonomous_success(self, step: int) -> bool:
        """Did the policy, from ``step`` on, reach success without anyone taking over?

        A rescued episode is a success of the operator, not of the policy steps that made the
        operator take over (RLIF): imitating those would teach exactly the mistake. Steps after
        the last hand-back that then finish the task on their own do count.
        """
        return self.success and step >= self.last_takeover


def takeover_steps(is_intervention: np.ndarray) -> np.ndarray:
    """Indices where a human takes over (intervention starts after a policy-driven step)."""
    flags = np.asarray(is_intervention, dtype=bool)
    starts = np.flatnonzero(flags[1:] & ~flags[:-1]) + 1
    return starts.astype(np.int64)


def intervention_penalties(is_intervention: np.ndarray, penalty: float, window: int) -> np.ndarray:
    """Per-step penalties (<= 0): each takeover's ``penalty`` split over the policy steps before it.

    Only policy-driven steps in the ``window`` steps before the takeover are blamed; a takeover
    at the very first step has no policy step to blame and costs nothing.
    """
    flags = np.asarray(is_intervention, dtype=bool)
    out = np.zeros(len(flags), dtype=np.float64)
    for start in takeover_steps(flags):
        lo = max(0, int(start) - window)
        blamed = lo + np.flatnonzero(~flags[lo:start])
        if len(blamed):
            out[blamed] -= penalty / len(blamed)
    return out


def potential_shaping(potential: np.ndarray, gamma: float) -> np.ndarray:
    """F_t = gamma * phi_t - phi_{t-1} (phi_{-1} = phi_0): progress rewards that keep the optimum.

    The sim records a progress measure in [0, 1] at each tick (1 on success); summing it
    as a reward would pay a policy for lingering near the goal, its increments do not.
    """
    phi = np.asarray(potential, dtype=np.float64)
    if len(phi) == 0:
        return phi
    previous = np.concatenate([phi[:1], phi[:-1]])
    return gamma * phi - previous


def episode_rewards(episode: Mapping[str, Any], config: RewardConfig) -> EpisodeRewards:
    """Shaped per-step rewards of one episode (see the module docstring for the terms)."""
    n = len(episode["action"])
    success_flags = _column(episode, "success", n, False).astype(bool)
    done = episode.get("done")
    # Without a ``done`` column (older datasets) an episode is taken as finished. One that ended with
    # no verdict (nobody judged it, no detector did) has an unknown outcome, not a failed one: it stays
    # unfinished for learning (no failure reward, no terminal, rejected as unfinished), as an episode
    # still running does. Without a confidence column (older datasets) every verdict is known.
    ended = True if done is None else n > 0 and bool(_column(episode, "done", n, False)[-1])
    finished = ended and (n == 0 or float(_column(episode, "success_confidence", n, 1.0)[-1]) > 0.0)
    success = bool(success_flags.any())
    horizon = int(np.argmax(success_flags)) + 1 if success else n

    rewards = np.zeros(n, dtype=np.float64)
    if config.dense_scale:
        rewards += config.dense_scale * potential_shaping(_column(episode, "reward", n, 0.0), config.gamma)
    if config.intervention_penalty:
        flags = _column(episode, "is_intervention", n, False).astype(bool)
        rewards += intervention_penalties(flags, config.intervention_penalty, config.penalty_window)
    if success:
        rewards[horizon - 1] += config.success_reward
    elif finished and n:
        rewards[n - 1] += config.failure_reward
    rewards[horizon:] = 0.0
    takeovers = takeover_steps(_column(episode, "is_intervention", n, False).astype(bool)[:horizon])
    last_takeover = int(takeovers[-1]) if len(takeovers) else -1
    return EpisodeRewards(rewards=rewards, success=success, finished=finished, horizon=horizon,
                          last_takeover=last_takeover, episode_return=discounted_sum(rewards[:horizon], config.gamma))


def _column(episode: Mapping[str, Any], name: str, n: int, default: float | bool) -> np.ndarray:
    value = episode.get(name)
    if value is None:
        return np.full(n, default)
    value = np.asarray(value)
    if len(value) != n:
        raise ValueError(f"episode column {name!r} has {len(value)} rows but the episode has {n} actions")
    return value.reshape(n)


# ---------------------------------------------------------------- returns and targets


def discounted_sum(rewards: np.ndarray, gamma: float) -> float:
    """sum_k gamma^k r_k."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return float(rewards @ np.power(gamma, np.arange(len(rewards)))) if len(rewards) else 0.0


def discounted_returns(rewards: np.ndarray, gamma: float, bootstrap: float = 0.0) -> np.ndarray:
    """Return-to-go G_t = r_t + gamma * G_{t+1}, with G_T = ``bootstrap`` (0 at a terminal)."""
    out = np.empty(len(rewards), dtype=np.float64)
    running = float(bootstrap)
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def n_step_targets(rewards: np.ndarray, values: np.ndarray, gamma: float, n: int) -> np.ndarray:
    """y_t = sum_{k<n} gamma^k r_{t+k} + gamma^n V_{t+n}, cut at the trajectory end.

    ``values`` has T + 1 entries: V(s_0..s_T), where V(s_T) is the value after the last step
    (0 if the episode terminated there). Works for any time unit: pass chunk rewards and
    gamma**H to get chunk-level targets.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    t_len = len(rewards)
    if values.shape != (t_len + 1,):
        raise ValueError(f"values must have T + 1 = {t_len + 1} entries (V of s_0..s_T), got {values.shape}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out = np.empty(t_len, dtype=np.float64)
    for t in range(t_len):
        end = min(t + n, t_len)
        out[t] = discounted_sum(rewards[t:end], gamma) + gamma ** (end - t) * values[end]
    return out


def td_lambda_returns(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """TD(lambda) returns G_t = r_t + gamma * ((1 - lam) V_{t+1} + lam G_{t+1}), G_T = V_T (Sutton & Barto 12.1).

    lam = 0 is the one-step TD target, lam = 1 the Monte-Carlo return bootstrapped at the end.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (len(rewards) + 1,):
        raise ValueError(f"values must have T + 1 = {len(rewards) + 1} entries, got {values.shape}")
    out = np.empty(len(rewards), dtype=np.float64)
    running = values[-1]
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * ((1.0 - lam) * values[t + 1] + lam * running)
        out[t] = running
    return out


def chunk_rewards(rewards: np.ndarray, chunk_size: int, gamma: float) -> np.ndarray:
    """Per-step rewards -> one reward per action chunk, sum_{k<H} gamma^k r_{cH+k} (chunk MDP of Q-chunking)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return np.array([discounted_sum(rewards[i:i + chunk_size], gamma) for i in range(0, len(rewards), chunk_size)])


# ---------------------------------------------------------------- per-sample transition fields


def transition_fields(episode: Mapping[str, Any], t: int, offset: int, chunk_size: int, cameras: Sequence[str],
                      config: RewardConfig,
                      rewards: EpisodeRewards | None = None) -> dict[str, np.ndarray | np.generic]:
    """What the learning algorithms need for the training sample at time ``t`` with state offset ``offset``.

    The sample's chunk starts at ``s = t + offset`` (offset clipped as in
    ``robot_rl.policies.augment.offset_indices``) and spans H = ``chunk_size`` steps. Returns:

    - ``return``: discounted return-to-go from ``s`` (partial while the episode is open);
    - ``episode_return``: the discounted return of the whole episode (the same for all its steps);
    - ``chunk_reward``: sum_{k<H} gamma^k r_{s+k}; ``chunk_discount``: gamma^H, or 0 when the
      episode terminates inside the chunk, so a TD target is chunk_reward + chunk_discount * V(next);
    - ``next.state`` / ``next.images.<cam>``: the observation at the next chunk boundary s + H;
    - ``transition_valid``: False when the open episode has not reached s + H yet (no next
      observation, so no TD target);
    - ``episode_success``, ``episode_finished``, ``policy_version`` (of the step at ``t``);
    - ``episode_success_confidence`` and ``episode_success_source`` (a code into
      ``robot_rl.core.types.SUCCESS_SOURCES``): who judged the episode and how sure (0: nobody);
    - ``autonomous_success``: the episode succeeded and no human took over after the chunk start
      (``EpisodeRewards.autonomous_success``).

    Pass ``rewards`` (from ``episode_rewards``) to reuse it across samples of one episode.
    Values are numpy scalars/arrays, so a sampler can stack them like ``build_sample``'s.
    """
    n = len(episode["action"])
    if not 0 <= t < n:
        raise IndexError(f"t={t} is outside the episode [0, {n})")
    if rewards is None:
        rewards = episode_rewards(episode, config)
    start = t + min(max(offset, 0), n - 1 - t)
    end = start + chunk_size
    horizon = rewards.horizon if rewards.finished else n
    if rewards.finished and end >= horizon:
        discount, next_index, valid = 0.0, horizon - 1, True  # terminal inside the chunk
    elif end <= n - 1:
        discount, next_index, valid = config.gamma ** chunk_size, end, True
    else:
        discount, next_index, valid = 0.0, n - 1, False  # open episode, next boundary not recorded yet
    fields: dict[str, np.ndarray | np.generic] = {
        "return": np.float32(discounted_sum(rewards.rewards[start:horizon], config.gamma)),
        "episode_return": np.float32(rewards.episode_return),
        "chunk_reward": np.float32(discounted_sum(rewards.rewards[start:min(end, horizon)], config.gamma)),
        "chunk_discount": np.float32(discount),
        "transition_valid": np.bool_(valid),
        "episode_success": np.bool_(rewards.success),
        "autonomous_success": np.bool_(rewards.autonomous_success(start)),
        "episode_finished": np.bool_(rewards.finished),
        "policy_version": np.int64(_column(episode, "policy_version", n, -1)[t]),
        # Who judged the episode (a code into SUCCESS_SOURCES) and how sure: the last step's, as the outcome.
        "episode_success_confidence": np.float32(_column(episode, "success_confidence", n, 1.0)[-1]),
        "episode_success_source": np.int64(_column(episode, "success_source", n, TASK_CODE)[-1]),
        "next.state": np.asarray(episode["state"][next_index], dtype=np.float32),
    }
    for cam in cameras:
        fields[f"next.images.{cam}"] = episode[f"images.{cam}"][next_index]
    return fields
