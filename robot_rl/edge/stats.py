"""Counters and per-chunk records of one edge node, for tests, benchmarks and heartbeats.

Histories are bounded (``HISTORY`` most recent entries) because a robot's edge process
may run for days; counters are exact for the whole run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

HISTORY = 10_000
LATENESS_WINDOW = 900  # ticks of lateness kept for the heartbeat's quantiles: 30 s at 30 fps


def _history() -> deque:
    return deque(maxlen=HISTORY)


@dataclass
class ChunkRecord:
    """The life of one inference: when it was asked for, with which k and d, and how it landed."""

    chunk_id: int
    request_tick: int
    executed_index: int  # k: index (in its chunk) of the action executed last at request time
    delay_estimate: int  # the estimator's d at request time
    delay_used: int  # d the state was rolled forward by (0 without roll-forward)
    start_tick: int | None  # tick chunk[0] was meant for; None = starts on arrival
    policy_state: np.ndarray  # the state given to the policy
    remaining_at_request: int = 0  # actions left in the queue when asking
    arrival_tick: int = -1
    measured_delay: int = -1  # d' = arrival_tick - request_tick
    stale_dropped: int = 0  # leading actions dropped because their tick had passed
    old_kept: int = 0  # old actions still executed before the chunk was due
    queued: int = 0  # actions of this chunk put in the queue
    policy_version: int = -1
    latency_s: float = 0.0
    compute_s: float = 0.0
    error: str | None = None


@dataclass
class EdgeStats:
    """What happened since the node was created (across episodes)."""

    ticks: int = 0
    stall_ticks: int = 0  # async: queue empty, the robot held (latency not hidden)
    wait_ticks: int = 0  # held by design: sync waiting, or the first chunk of an episode
    late_ticks: int = 0
    intervention_ticks: int = 0
    inferences: int = 0
    chunks_spliced: int = 0
    chunks_rejected: int = 0  # policy raised or returned an invalid chunk
    chunks_superseded: int = 0  # arrived after a newer chunk (several requests in flight)
    chunks_expired: int = 0  # arrived so late that every action was stale
    stale_actions_dropped: int = 0
    swaps: int = 0
    swap_failures: int = 0
    sink_errors: int = 0
    invalid_human_actions: int = 0
    max_lateness_s: float = 0.0
    replan_slots: int = 0  # gauge: requests continuous re-planning keeps in flight (0: thrifty, edge.replan)
    delay_estimates: deque[int] = field(default_factory=_history)  # d at each request
    measured_delays: deque[int] = field(default_factory=_history)  # d' of each finished inference
    inference_latency_s: deque[float] = field(default_factory=_history)
    chunks: deque[ChunkRecord] = field(default_factory=_history)
    recent_lateness_s: deque[float] = field(default_factory=lambda: deque(maxlen=LATENESS_WINDOW))

    def heartbeat(self) -> dict[str, float | int]:
        """What the learner's fleet console shows of this robot: its ticks and how late they started
        over the last ``LATENESS_WINDOW`` ticks. Called from the link's thread while the control thread
        appends: ``deque.copy`` runs in C under the interpreter lock, so it sees a consistent window."""
        lateness_ms = np.asarray(self.recent_lateness_s.copy(), dtype=float) * 1000.0
        p50, p99, peak = (np.quantile(lateness_ms, 0.5), np.quantile(lateness_ms, 0.99),
                          lateness_ms.max()) if lateness_ms.size else (0.0, 0.0, 0.0)
        return {"ticks": self.ticks, "late_ticks": self.late_ticks, "intervention_ticks": self.intervention_ticks,
                "swaps": self.swaps, "replan_slots": self.replan_slots,
                "lateness_p50_ms": round(float(p50), 3), "lateness_p99_ms": round(float(p99), 3),
                "lateness_max_ms": round(float(peak), 3)}

    def summary(self) -> dict[str, float | int]:
        """Scalars only (JSON-friendly), for benchmark tables and heartbeats."""
        lat = np.asarray(self.inference_latency_s, dtype=float)
        return {
            "ticks": self.ticks,
            "stall_ticks": self.stall_ticks,
            "wait_ticks": self.wait_ticks,
            "late_ticks": self.late_ticks,
            "intervention_ticks": self.intervention_ticks,
            "inferences": self.inferences,
            "chunks_spliced": self.chunks_spliced,
            "chunks_rejected": self.chunks_rejected,
            "chunks_superseded": self.chunks_superseded,
            "chunks_expired": self.chunks_expired,
            "stale_actions_dropped": self.stale_actions_dropped,
            "swaps": self.swaps,
            "swap_failures": self.swap_failures,
            "max_lateness_s": self.max_lateness_s,
            "replan_slots": self.replan_slots,
            "delay_estimate_last": self.delay_estimates[-1] if self.delay_estimates else -1,
            "measured_delay_mean": float(np.mean(self.measured_delays)) if self.measured_delays else 0.0,
            "latency_mean_s": float(lat.mean()) if lat.size else 0.0,
            "latency_p90_s": float(np.quantile(lat, 0.9)) if lat.size else 0.0,
        }
