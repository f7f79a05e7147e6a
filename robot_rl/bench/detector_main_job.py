"""``robot-rl bench detector bench.main_job=true``: the main job judged by the success detector,
against the main job judged by the sim, from the same start on the same scenes.

Two main jobs (``robot_rl.app.main_job``) with the same seeds, differing only in who judges the
robots' episodes:

* ``oracle``: the sim's ground truth at every tick (``run.verdicts=task``);
* ``detector``: as on an unattended real arm (``run.verdicts=detector``): the scripted operator
  labels the first ``run.labelled_episodes``, then the learner's success detector judges, the
  operator asked only when it is unsure (``robot_rl.app.unattended_verdicts``).

Both train with ``bench.main_job_learner`` (``rwr``: it weighs each episode by its outcome, so wrong
verdicts cost it; the main job's default ``hgdagger`` imitates the operator's corrections and reads
no verdict at all). The robots run ``run.episodes`` each with no time budget, so a slower arm (the
detector fits on the learner's CPU) still sees every scene, and no held-out scores are taken while
running (``run.heldout_scenes=0``: CPU for the robots). Then each arm's final weights on the same
``run.eval_episodes`` held-out scenes with the same flow noise: each one's success, and the
detector arm against the oracle arm scene by scene (exact McNemar p).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.app.config import VerdictMode
from robot_rl.app.evaluation import paired_scores
from robot_rl.app.main_job import run_main_job

if TYPE_CHECKING:
    from robot_rl.bench.config import DetectorBenchConfig
    from robot_rl.config import RobotRLConfig

ARMS = {"oracle": VerdictMode.task, "detector": VerdictMode.detector}


def arm_overrides(bench: DetectorBenchConfig, mode: VerdictMode, run_dir: Path) -> list[str]:
    """The command line's extra settings for one arm (the module doc says why each)."""
    return [f"learner={bench.main_job_learner}", f"run.verdicts={mode.value}", "run.time_budget_min=null",
            "run.heldout_scenes=0", f"run.dir={run_dir}"]


def arm_configs(compose: Callable[[list[str]], RobotRLConfig], bench: DetectorBenchConfig,
                out_dir: Path) -> dict[str, RobotRLConfig]:
    """Each arm's config, composed before anything runs: a bad setting fails at once, not after an hour."""
    return {name: compose(arm_overrides(bench, mode, out_dir / name)) for name, mode in ARMS.items()}


def compare_main_jobs(configs: dict[str, RobotRLConfig], out_dir: Path) -> dict[str, Any]:
    """Both main jobs (``arm_configs``), one after the other; their held-out results side by side."""
    summaries: dict[str, dict] = {}
    minutes: dict[str, float] = {}
    for name, cfg in configs.items():
        print(f"\nbench detector, the main job judged by {'the sim' if name == 'oracle' else 'the detector'}")
        started = time.perf_counter()
        summaries[name] = run_main_job(cfg)
        minutes[name] = (time.perf_counter() - started) / 60.0
    scored = {name: (summary.get("heldout") or {}).get("final") for name, summary in summaries.items()}
    finals: dict[str, dict] = {name: final for name, final in scored.items() if final is not None}
    if len(finals) < len(scored):
        raise RuntimeError(f"bench detector: a main job's final weights were not scored on held-out scenes "
                           f"(run.eval_episodes must be > 0; see its log under {out_dir})")
    paired = paired_scores(finals["detector"], finals["oracle"])
    verdicts = summaries["detector"]["verdicts"]
    return {"heldout_oracle": finals["oracle"]["success"], "heldout_detector": finals["detector"]["success"],
            "heldout_oracle_ci95": finals["oracle"]["ci95"], "heldout_detector_ci95": finals["detector"]["ci95"],
            "heldout_start": summaries["oracle"]["heldout"]["start"]["success"],
            "heldout_scenes": len(finals["oracle"]["per_episode_success"]),
            "detector_vs_oracle": paired, "paired_p": paired["p_value"] if paired else None,
            "main_job_asked_fraction": verdicts["asked_fraction"], "main_job_verdicts": verdicts,
            "episodes": {name: s["episodes"] for name, s in summaries.items()},
            "updates": {name: s["updates"] for name, s in summaries.items()},
            "minutes": minutes, "learner": summaries["oracle"]["algorithm"],
            "summaries": {name: str(Path(s["curve_png"]).parent / "summary.json") for name, s in summaries.items()}}


def print_comparison(report: dict[str, Any]) -> None:
    paired = report["detector_vs_oracle"]
    verdicts = report["main_job_verdicts"]
    print(f"\nthe main job ({report['learner']}) judged by the sim against judged by the success detector, final "
          f"weights on {report['heldout_scenes']} held-out scenes (start {report['heldout_start']:.0%}):")
    print(f"  oracle {report['heldout_oracle']:.1%}, detector {report['heldout_detector']:.1%}; "
          f"detector against oracle: {paired['difference'] * 100:+.1f} points "
          f"(95 % CI {paired['difference_ci95'][0] * 100:+.0f}..{paired['difference_ci95'][1] * 100:+.0f}), "
          f"exact McNemar p = {paired['p_value']:.2g}")
    print(f"  the detector arm's verdicts: {verdicts['labelled']} labelled, {verdicts['detector']} by the detector "
          f"({_pct(verdicts['detector_accuracy'])} right against the sim), {verdicts['asked']} asked "
          f"({_pct(verdicts['asked_fraction'])} of those after the labelled)")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
