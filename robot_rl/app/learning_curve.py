"""The learning curve of a run: one record per finished episode, a plot, a summary.

Success is reported two ways because a simulated (or real) operator can rescue an
episode: ``success`` counts every success, ``autonomous`` only those the policy
achieved without a takeover. The second is what learning must raise.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robot_rl.core.statistics import wilson_interval
from robot_rl.core.types import VerdictSource
from robot_rl.replay.report import pyplot

FAMILY_COLOURS = {"pick": "tab:orange", "push": "tab:cyan", "place": "tab:olive"}  # the sim's task families


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
    verdict_source: str = VerdictSource.task.value  # who judged it as stored
    verdict_success: bool = False  # that verdict (``success`` is what the sim says happened)
    asked: bool = False  # the operator was asked: the success detector was unsure

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

    def elapsed_s(self) -> float:
        """Seconds since ``start_clock``: where on the wall-clock axis "now" is."""
        with self._lock:
            return time.monotonic() - self._t0

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
                verdict_source=str(episode.verdict_source),
                verdict_success=bool(episode.verdict_success),
                asked=bool(episode.asked),
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
            out[version] = _rates([r for r in self.records if r.policy_version == version])
        return out

    def per_version_groups(self, min_episodes: int = 20) -> list[dict[str, Any]]:
        """Consecutive versions merged until each row has ``min_episodes`` episodes (the last row
        takes what is left): a row of 2-12 episodes says nothing about its success rate."""
        rows: list[dict[str, Any]] = []
        group: list[EpisodeRecord] = []
        versions = sorted({r.policy_version for r in self.records})
        for i, version in enumerate(versions):
            group += [r for r in self.records if r.policy_version == version]
            if len(group) >= min_episodes or i == len(versions) - 1:
                first = group[0].policy_version
                name = f"v{first}" if first == version else f"v{first}-v{version}"
                rows.append({"versions": name, **_rates(group)})
                group = []
        return rows

    def first_vs_last(self, window: int = 30) -> dict[str, dict[str, float]]:
        recs = self.records
        n = min(window, len(recs) // 2) or len(recs)
        return {"first": _rates(recs[:n]), "last": _rates(recs[-n:])}

    def operator_effort(self) -> dict[str, float]:
        """How much the operator drove: the human time a learning curve costs (HG-DAgger and
        HIL-SERL buy their gains with it, so it belongs next to every success rate)."""
        recs = self.records
        steps = sum(r.steps for r in recs)
        driven = sum(round(r.intervention_frac * r.steps) for r in recs)
        return {"episodes_taken_over": sum(r.intervened for r in recs), "steps_driven": driven,
                "share_of_steps": driven / steps if steps else 0.0}

    def verdicts(self) -> dict[str, Any]:
        """Who judged the episodes: counts per source (``labelled``: the operator's, not asked), and
        where the success detector judged, how often the operator was asked (``asked_fraction``, of the
        episodes after the labelled ones) and how often the detector's own verdicts were right."""
        recs = self.records
        by_detector = [r for r in recs if r.verdict_source == VerdictSource.detector]
        asked = sum(r.asked for r in recs)
        labelled = sum(r.verdict_source == VerdictSource.operator and not r.asked for r in recs)
        judged_unattended = len(by_detector) + asked
        return {"task": sum(r.verdict_source == VerdictSource.task for r in recs), "labelled": labelled,
                "detector": len(by_detector), "asked": asked,
                "asked_fraction": asked / judged_unattended if judged_unattended else None,
                "detector_accuracy": (sum(r.verdict_success == r.success for r in by_detector) / len(by_detector)
                                      if by_detector else None)}

    def to_json(self) -> list[dict]:
        return [asdict(r) | {"autonomous": r.autonomous} for r in self.records]

    def plot(self, path: str | Path, window: int = 20, title: str = "learning curve",
             heldout: Sequence[CurvePoint] = ()) -> Path:
        """Rolling live rates vs episodes and vs wall-clock, with the held-out scores (each with its
        95 % interval) where the run had reached when those weights were taken."""
        plt = pyplot()
        recs = self.records
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, axes = plt.subplots(1, 2, figsize=(12, 5.2), sharey=True)
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
                live = f"live {label} (rolling {window}, operator watching)"
                axes[0].plot(episodes, smooth, color=colour, linestyle=style, alpha=0.6, label=live)
                axes[1].plot(wall_min, smooth, color=colour, linestyle=style, alpha=0.6, label=live)
            for ax in axes:
                for version_start in _version_starts(recs):
                    x = version_start + 1 if ax is axes[0] else recs[version_start].wall_s / 60.0
                    ax.axvline(x, color="grey", alpha=0.12, linewidth=0.8)
        for label in dict.fromkeys(p.label for p in heldout):
            points = [p for p in heldout if p.label == label]
            success = np.array([p.success for p in points])
            errors = np.array([[p.success - p.ci95[0] for p in points], [p.ci95[1] - p.success for p in points]])
            marker = "s" if points[0].endpoints else "o"
            family = points[0].family
            overall = "black" if points[0].endpoints else "tab:purple"
            colour = FAMILY_COLOURS.get(family, "tab:gray") if family else overall
            style = f"{marker}:" if family else marker  # a family's points joined by a dotted line
            for ax, xs in ((axes[0], [float(p.episodes) for p in points]), (axes[1], [p.wall_s / 60 for p in points])):
                ax.errorbar(xs, success, yerr=errors, fmt=style, color=colour, capsize=3, markersize=5, label=label,
                            alpha=0.7 if family else 1.0)
        axes[0].set_xlabel("episodes (all robots)")
        axes[1].set_xlabel("wall-clock minutes")
        axes[0].set_ylabel("rate")
        axes[0].set_ylim(-0.02, 1.02)
        for ax in axes:
            ax.grid(alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
        fig.suptitle(f"{title}\nheld-out: the weights alone on unseen scenes, 95 % intervals; "
                     "grey lines: a new policy version in use", fontsize=10)
        fig.tight_layout(rect=(0, 0.13, 1, 1))
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


@dataclass(frozen=True)
class CurvePoint:
    """A held-out score to draw: where the run stood (episodes, wall seconds) and the score."""

    label: str  # the legend's: what was scored on what
    episodes: int
    wall_s: float
    success: float
    ci95: tuple[float, float]
    endpoints: bool = False  # the start's and the final weights' scores (drawn as squares)
    family: str | None = None  # one task family's scenes (a colour per family); None: all scenes


def _rates(records: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """Episodes, success, autonomous success (with its 95 % interval) and intervention rate."""
    n = len(records)
    autonomous = sum(r.autonomous for r in records)
    nan = float("nan")
    return {
        "episodes": n,
        "success": float(np.mean([r.success for r in records])) if n else nan,
        "autonomous": autonomous / n if n else nan,
        "autonomous_ci95": list(wilson_interval(autonomous, n)),
        "intervention": float(np.mean([r.intervened for r in records])) if n else nan,
    }


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
