"""The learning curve of a run: one record per finished episode, a plot, a summary.

Success is reported two ways because a simulated (or real) operator can rescue an
episode: ``success`` counts every success, ``autonomous`` only those the policy
achieved without a takeover. The second is what learning must raise.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class EpisodeRecord:
    index: int  # order of completion over all robots
    robot_id: str
    wall_s: float  # since the robots started (``LearningCurve.start_clock``)
    policy_version: int
    success: bool
    intervened: bool  # the operator took over at least once
    intervention_frac: float  # share of the episode's ticks driven by the operator
    steps: int

    @property
    def autonomous(self) -> bool:
        return self.success and not self.intervened


class LearningCurve:
    """Thread-safe collector fed by every robot's episode callback."""

    def __init__(self) -> None:
        self._records: list[EpisodeRecord] = []
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    def start_clock(self) -> None:
        """Count ``wall_s`` from now: the robots' start, after the learner's and robots' start-up."""
        with self._lock:
            self._t0 = time.monotonic()

    def add(self, robot_id: str, episode, policy_version: int) -> EpisodeRecord:
        steps = max(episode.num_steps, 1)
        with self._lock:
            record = EpisodeRecord(
                index=len(self._records),
                robot_id=robot_id,
                wall_s=time.monotonic() - self._t0,
                policy_version=int(policy_version),
                success=bool(episode.success),
                intervened=episode.intervention_steps > 0,
                intervention_frac=episode.intervention_steps / steps,
                steps=episode.num_steps,
            )
            self._records.append(record)
        return record

    @property
    def records(self) -> list[EpisodeRecord]:
        with self._lock:
            return list(self._records)

    def recent(self, window: int = 20) -> dict[str, float]:
        """Rates over the last ``window`` episodes (for the live progress line)."""
        recs = self.records[-window:]
        if not recs:
            return {"success": 0.0, "autonomous": 0.0, "intervention": 0.0}
        return {
            "success": float(np.mean([r.success for r in recs])),
            "autonomous": float(np.mean([r.autonomous for r in recs])),
            "intervention": float(np.mean([r.intervened for r in recs])),
        }

    def per_version(self) -> dict[int, dict[str, float]]:
        out: dict[int, dict[str, float]] = {}
        for version in sorted({r.policy_version for r in self.records}):
            recs = [r for r in self.records if r.policy_version == version]
            out[version] = {
                "episodes": len(recs),
                "success": float(np.mean([r.success for r in recs])),
                "autonomous": float(np.mean([r.autonomous for r in recs])),
                "intervention": float(np.mean([r.intervened for r in recs])),
            }
        return out

    def first_vs_last(self, window: int = 30) -> dict[str, dict[str, float]]:
        recs = self.records
        n = min(window, len(recs) // 2) or len(recs)
        def rates(rs):
            return {
                "episodes": len(rs),
                "success": float(np.mean([r.success for r in rs])) if rs else float("nan"),
                "autonomous": float(np.mean([r.autonomous for r in rs])) if rs else float("nan"),
                "intervention": float(np.mean([r.intervened for r in rs])) if rs else float("nan"),
            }
        return {"first": rates(recs[:n]), "last": rates(recs[-n:])}

    def operator_effort(self) -> dict[str, float]:
        """How much the operator drove: the human time a learning curve costs (HG-DAgger and
        HIL-SERL buy their gains with it, so it belongs next to every success rate)."""
        recs = self.records
        steps = sum(r.steps for r in recs)
        driven = sum(round(r.intervention_frac * r.steps) for r in recs)
        return {"episodes_taken_over": sum(r.intervened for r in recs), "steps_driven": driven,
                "share_of_steps": driven / steps if steps else 0.0}

    def to_json(self) -> list[dict]:
        return [asdict(r) | {"autonomous": r.autonomous} for r in self.records]

    def plot(self, path: str | Path, window: int = 20, title: str = "learning curve") -> Path:
        """Rolling success / autonomous success / intervention rate vs episodes and vs wall-clock."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        recs = self.records
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
        if recs:
            episodes = np.arange(1, len(recs) + 1)
            wall_min = np.array([r.wall_s for r in recs]) / 60.0
            series = {
                "success (any)": [r.success for r in recs],
                "autonomous success": [r.autonomous for r in recs],
                "intervention rate": [r.intervened for r in recs],
            }
            styles = {"success (any)": ("tab:blue", "-"), "autonomous success": ("tab:green", "-"),
                      "intervention rate": ("tab:red", "--")}
            for label, values in series.items():
                smooth = _rolling_mean(np.asarray(values, dtype=float), window)
                colour, style = styles[label]
                axes[0].plot(episodes, smooth, color=colour, linestyle=style, label=label)
                axes[1].plot(wall_min, smooth, color=colour, linestyle=style, label=label)
            for ax in axes:
                for version_start in _version_starts(recs):
                    x = version_start + 1 if ax is axes[0] else recs[version_start].wall_s / 60.0
                    ax.axvline(x, color="grey", alpha=0.15, linewidth=0.8)
        axes[0].set_xlabel("episodes (all robots)")
        axes[1].set_xlabel("wall-clock minutes")
        axes[0].set_ylabel(f"rate (rolling mean over {window} episodes)")
        axes[0].set_ylim(-0.02, 1.02)
        for ax in axes:
            ax.grid(alpha=0.3)
        axes[0].legend(loc="best", fontsize=8)
        fig.suptitle(f"{title} (grey lines: a new policy version in use)")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    out = np.empty_like(values)
    for i in range(len(values)):
        out[i] = values[max(0, i - window + 1) : i + 1].mean()
    return out


def _version_starts(recs: list[EpisodeRecord]) -> list[int]:
    starts, seen = [], set()
    for i, r in enumerate(recs):
        if r.policy_version not in seen:
            seen.add(r.policy_version)
            if i:
                starts.append(i)
    return starts
