"""The fleet's state as the console shows it: one JSON-friendly snapshot of the learner service.

Everything is read, never changed, from the threads that own it (the serving thread's robot table,
the store's outcomes, the trainer's counters): copies are taken with single C-level calls
(``list(dict.values())``, ``deque.copy``) so a snapshot never iterates a container another thread
grows. Rates come with 95 % Wilson intervals, because a robot's or a version's success over a few
episodes says little without one.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from robot_rl.core.statistics import wilson_interval
from robot_rl.learner.metrics import EpisodeOutcome, staleness_values

if TYPE_CHECKING:
    from robot_rl.learner.config import LearnerConfig
    from robot_rl.learner.published import PublishedHistory
    from robot_rl.learner.store import ReplayStore
    from robot_rl.learner.trainer import Trainer

RECENT_EPISODES = 20  # a robot's success and intervention rates: its last this-many episodes
CURVE_WINDOW = 20  # the live curve: rolling mean over this many episodes (all robots)
CURVE_POINTS = 600  # the live curve sends at most this many points (evenly spaced) to the page
RATE_WINDOW_S = 30.0  # updates per second over this long
STATUS_VERSIONS = 3  # the status line counts robots on this many versions (the most common), never lists ids
# Store counters the status line names only when they are not zero: each says something went wrong.
STATUS_TROUBLE = (("segments_held_back", "segments held back"), ("staging_write_failures", "staging write failures"),
                  ("episodes_lost_to_damage", "episodes lost to damage"))


@dataclass
class RobotStatus:
    """What the learner knows about one robot (from its hello and heartbeats)."""

    robot_id: str
    policy_version: int
    connected: bool = True
    segments: int = 0
    steps: int = 0
    last_seen_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)  # its last heartbeat's (link counters, tick lateness)
    # Episodes whose last segment was acked and that the dataset writer had not written at the last
    # status line: the writer gathers episodes for up to store.commit_linger_s before it writes them,
    # and an acked episode missing from "stored" for that long reads as a loss unless it is shown.
    acked_unwritten: set[int] = field(default_factory=set)


class FleetSource(Protocol):
    """What the console and the status line read of the learner service (``LearnerService``), and the
    one thing the console changes (pins): the service holds the console, so the console names the
    service by this shape, not by its module."""

    config: LearnerConfig
    robots: dict[str, RobotStatus]
    store: ReplayStore
    trainer: Trainer
    published: PublishedHistory

    def heldout_points(self) -> list[dict[str, Any]]: ...

    @property
    def training(self) -> bool: ...

    @property
    def fleet_pin(self) -> int | None: ...

    def servable_versions(self) -> list[int]: ...

    def pin(self, version: int | None, robot_id: str | None = None) -> None: ...

    def pinned_version(self, robot_id: str) -> int | None: ...


class UpdateRate:
    """Updates per second over the last ``RATE_WINDOW_S``, from the trainer's step sampled at each snapshot."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def __call__(self, step: int, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


def rate(successes: int, n: int) -> dict[str, Any]:
    """A rate with its 95 % interval; None rates when there is nothing to count."""
    if n == 0:
        return {"n": 0, "rate": None, "ci95": None}
    low, high = wilson_interval(successes, n)
    return {"n": n, "rate": successes / n, "ci95": [round(low, 4), round(high, 4)]}


def stored_episodes(outcomes: Sequence[EpisodeOutcome]) -> dict[str, set[int]]:
    """Robot -> the ids of its episodes in the dataset."""
    stored: dict[str, set[int]] = {}
    for outcome in outcomes:
        stored.setdefault(outcome.robot_id, set()).add(outcome.episode_id)
    return stored


def episodes_writing(status: RobotStatus, stored: Mapping[str, set[int]]) -> int:
    """A robot's episodes acked in full and not in the dataset yet (the writer gathers a batch first)."""
    return len(set(status.acked_unwritten) - stored.get(status.robot_id, set()))


def status_line(service: FleetSource, stats: Mapping[str, int]) -> str:
    """The learner's periodic log line: robot counts per weights version, the store, training."""
    robots = list(service.robots.values())
    connected = [r for r in robots if r.connected]
    versions = Counter(r.policy_version for r in connected).most_common()
    fleet = f"robots: {len(connected)} connected"
    if versions:
        more = len(versions) - STATUS_VERSIONS
        fleet += " (" + ", ".join(f"{n} on v{v}" for v, n in versions[:STATUS_VERSIONS])
        fleet += f", {more} more versions)" if more > 0 else ")"
    gone = len(robots) - len(connected)
    fleet += f", {gone} gone" if gone else ""
    stored = stored_episodes(service.store.outcomes.outcomes())
    writing = sum(episodes_writing(r, stored) for r in robots)
    store = (f"store: {stats['episodes_stored']} episodes" + (f" (+{writing} acked, being written)" if writing else "")
             + f", {stats['steps_ingested']:,} steps, {stats['bytes_staged'] / 1e6:.1f} MB staged")
    store += "".join(f", {stats[key]} {label}" for key, label in STATUS_TROUBLE if stats.get(key))
    trainer = service.trainer
    training = f"update {trainer.step:,}, weights v{trainer.version}" + (" (paused)" if trainer.paused else "")
    detectors = _detectors(service)
    judged = " | success detectors: " + ", ".join(
        f"{task!r} {100 * row['heldout_accuracy']:.0f}% held-out of {row['heldout_episodes']}"
        for task, row in detectors.items()) if detectors else ""
    return f"{fleet} | {store} | {training}{judged}"


def _detectors(service: FleetSource) -> dict[str, dict[str, Any]]:
    """Each task's trained success detector: its held-out accuracy, threshold and episodes (console, log)."""
    judging = service.store.judging
    if judging is None:
        return {}
    return {task: {"heldout_accuracy": c.heldout_accuracy, "heldout_episodes": c.heldout_episodes,
                   "trained_episodes": c.trained_episodes, "threshold": round(c.threshold, 4)}
            for task, c in sorted(judging.calibrations().items())}


def fleet_state(service: FleetSource, update_rate: UpdateRate) -> dict[str, Any]:
    """The snapshot the console page renders (and ``/api/state`` returns)."""
    outcomes = service.store.outcomes.outcomes()
    stored = stored_episodes(outcomes)
    robots = _robots(service, outcomes, stored)
    learner = _learner(service, update_rate)
    learner["store"]["episodes_writing"] = sum(robot["episodes_writing"] for robot in robots)
    return {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "learner": learner,
        "robots": robots,
        "versions": _versions(service, outcomes),
        "curve": {"live": live_curve(outcomes), "heldout": service.heldout_points()},
    }


def _learner(service: FleetSource, update_rate: UpdateRate) -> dict[str, Any]:
    trainer, config = service.trainer, service.config
    staleness = staleness_values(trainer.last_metrics)
    store = service.store.stats()
    return {
        "name": config.name,
        "server_id": config.service.server_id,
        "updates": trainer.step,
        "updates_per_s": round(update_rate(trainer.step), 2),
        "version": trainer.version,
        "paused": trainer.paused,
        "training": service.training,
        "failure": trainer.failure,
        "stream_mix": {"online": config.trainer.online_ratio, "corrections": config.trainer.intervention_ratio,
                       "demonstrations": config.trainer.demonstration_ratio},
        "family_shares": trainer.family_samples.shares(),  # each task family's share of the samples trained on
        "stream_steps": {stream: store.get(f"{stream}_steps", 0) for stream in ("online", "intervention",
                                                                                "demonstration")},
        "staleness": ({"mean": round(float(staleness.mean()), 2), "max": int(staleness.max())}
                      if staleness.size else None),
        "store": {key: store[key] for key in ("episodes_stored", "steps_ingested", "episodes_to_write",
                                              "bytes_staged") if key in store},
        "fleet_pin": service.fleet_pin,
        "success_detectors": _detectors(service),
    }


def _robots(service: FleetSource, outcomes: Sequence[EpisodeOutcome],
            stored: Mapping[str, set[int]]) -> list[dict[str, Any]]:
    now = time.monotonic()
    rows = []
    for status in sorted(list(service.robots.values()), key=lambda r: r.robot_id):
        recent = [o for o in outcomes if o.robot_id == status.robot_id][-RECENT_EPISODES:]
        stats = dict(status.stats)
        rows.append({
            "id": status.robot_id,
            "connected": status.connected,
            "version": status.policy_version,
            "pinned": service.pinned_version(status.robot_id),
            "episode": stats.get("episode"),
            "episodes_stored": sum(o.robot_id == status.robot_id for o in outcomes),
            "episodes_writing": episodes_writing(status, stored),  # acked, in the writer's next batch
            "success": rate(sum(o.success for o in recent), len(recent)),
            "interventions": rate(sum(o.takeovers > 0 for o in recent), len(recent)),
            "late_ticks": stats.get("late_ticks"),
            "ticks": stats.get("ticks"),
            "lateness_p99_ms": stats.get("lateness_p99_ms"),
            "lateness_max_ms": stats.get("lateness_max_ms"),
            "spool_backlog": stats.get("pending"),
            "segments_refused": stats.get("segments_refused"),  # malformed, set aside in the robot's spool
            "replan_slots": stats.get("replan_slots"),  # continuous re-planning's requests in flight; 0: thrifty
            "seen_s_ago": round(now - status.last_seen_s, 1),
        })
    return rows


def _versions(service: FleetSource, outcomes: Sequence[EpisodeOutcome]) -> list[dict[str, Any]]:
    heldout = {point["version"]: point for point in service.heldout_points()}
    per_version = service.store.outcomes.per_version()
    servable = set(service.servable_versions())
    rows = []
    for published in list(service.published):
        stats = per_version.get(published.version)
        scored = heldout.get(published.version)
        rows.append({
            "version": published.version,
            "published": datetime.fromtimestamp(published.wall_s, UTC).isoformat(timespec="seconds"),
            "update": published.update,
            "live": rate(stats.successes, stats.episodes) if stats else rate(0, 0),
            "heldout": ({"rate": scored["success"], "ci95": list(scored["ci95"]), "n": scored["scenes"]}
                        if scored else None),
            "servable": published.version in servable,
        })
    return rows[::-1]  # newest first


def live_curve(outcomes: Sequence[EpisodeOutcome]) -> list[dict[str, Any]]:
    """Rolling autonomous success (no takeover: an operator's rescue is no success of the policy's)
    and takeover rate over stored episodes (all robots, in storing order), thinned to at most
    ``CURVE_POINTS`` points."""
    if not outcomes:
        return []
    success = np.array([o.success and o.takeovers == 0 for o in outcomes], dtype=float)
    taken = np.array([o.takeovers > 0 for o in outcomes], dtype=float)
    kernel = np.ones(CURVE_WINDOW)
    counts = np.convolve(np.ones_like(success), kernel)[: len(success)]
    rolling_success = np.convolve(success, kernel)[: len(success)] / counts
    rolling_taken = np.convolve(taken, kernel)[: len(success)] / counts
    keep = np.unique(np.linspace(0, len(success) - 1, min(len(success), CURVE_POINTS)).round().astype(int))
    return [{"episodes": int(i + 1), "success": round(float(rolling_success[i]), 4),
             "interventions": round(float(rolling_taken[i]), 4), "version": outcomes[i].policy_version}
            for i in keep]
