"""`robot-rl bench learning`: learning algorithms side by side, and async vs a synchronous loop.

One run, arms one after the other, each from the same start (the BC checkpoint of
``ensure_bc_checkpoint``), on the same demonstrations, the same robot scenes (robot ``i``
episode ``e`` is seeded identically in every arm) and the same simulated operators, for
the same wall-clock budget. Robots run on the wall clock (real-time mode), so robot time
is wall time and "equal budget" means equal robot time.

Arms (``bench.arms``):

* ``none``: no learning (the learner stores data, never trains); the operator is on.
* ``rwr``, ``awr``, ``rl``: the asynchronous learner with that algorithm (``learner=...``),
  training while the robots act and hot-swapping weights between chunks; operator on.
* ``hgdagger``: the asynchronous learner with ``learner=hgdagger`` (behaviour cloning on the
  operator's corrections and the demonstrations; the robots' own attempts are not imitated).
* ``rwr_no_intervention``: ``rwr`` without the operator (no takeovers, no corrections).
* ``rwr_sync`` (and ``hgdagger_sync``, the same loop around ``hgdagger``): the synchronous
  baseline with the same learner: the robots collect
  ``sync_collect_episodes`` episodes (all robots together) with the current weights while
  the trainer idles, then the trainer does ``sync_updates`` updates while the robots idle,
  publishes, and the next round starts. Same store, same sampling, same algorithm: only
  the overlap of acting and training differs from ``rwr`` (``hgdagger``).

Measure: *autonomous* success (success without any takeover; a rescued episode does not
count), as a rolling rate over the last ``window`` episodes of the arm (all robots, in order
of completion). ``episodes_to_80`` is the first episode count, with a full window behind
it, at which that rate reaches 80 %.

Settings: ``bench.*`` (``robot_rl.bench.config.LearningBenchConfig``: arms, minutes per arm,
robots, window, the sync loop's round, held-out scenes; ``--quick`` is the preset
``configs/bench/learning_quick.yaml``).

Held-out evaluation: after each arm, its final weights (the start for ``none``) run
``eval_episodes`` episodes without the operator on scenes no arm trained on (``seeds.heldout``
onwards; the arms' robots use ``seeds.robots`` onwards), with the same
flow-noise stream per scene for every arm, in virtual time, in a fresh process
(``robot_rl.app.evaluation`` says why). A rolling window of 20
live episodes cannot tell 25 % from 40 %; this paired comparison on 40 fixed scenes can
tell larger gaps, and it measures the weights alone, not the weights plus a watching operator.
With ``heldout_every_s`` every training arm also gets a held-out curve over robot time (the
first ``timeline_episodes`` of those scenes), and ``sync_vs_async`` reads each side's time to
80 % and 90 % off it (``heldout_wall_s_to_80_*``, ``_90_*``) as well as 80 % off the live window.

Any other override goes to the composed config as usual (e.g. ``output_dir=/tmp/x``,
``run.max_episode_steps=150``, ``learner.trainer.batch_size=16``); ``learner=...`` is refused
because the arms choose the algorithm. Outputs go under
``<output_dir>/bench_learning/<time>/<arm>/``; the comparison plot is written next to the
JSON (same name, ``.png``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from robot_rl.app.behaviour_cloning import ensure_demos
from robot_rl.app.config import LocalRunConfig
from robot_rl.app.evaluation import format_paired, format_score, heldout_eval, heldout_eval_all, paired_scores
from robot_rl.app.learning_curve import EpisodeRecord, LearningCurve
from robot_rl.app.local_run import make_sim_robot_factory, run_local
from robot_rl.app.main_job import (
    Progress,
    ensure_bc_checkpoint,
    local_learner_config,
    operator_factory,
    share_cpu_with_robots,
)
from robot_rl.app.sim import sim_config, task_families
from robot_rl.app.sync_baseline import run_sync
from robot_rl.bench.config import ARMS, LearningBenchConfig
from robot_rl.bench.timeline import WeightsTimeline, first_heldout_reaching
from robot_rl.policies.flow_vla.model import FlowVLA
from robot_rl.replay.report import pyplot

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig
    from robot_rl.learner.config import LearnerConfig
    from robot_rl.learner.service import LearnerService

log = logging.getLogger(__name__)

THRESHOLD = 0.8  # the target: success >= 80 %
# Held-out levels whose first crossing sync_vs_async reports. 90 % as well as 80 %: where an arm
# levels off near 80 % (the sync loop did, BENCHMARKS.md "learning"), its first copy at >= 80 %
# is a coin toss of the evaluation's noise, and a higher level tells the arms apart.
HELDOUT_THRESHOLDS = (80, 90)
# (async arm, its synchronous twin) pairs sync_vs_async compares: the first pair of which both arms ran.
SYNC_PAIRS = (("rwr", "rwr_sync"), ("hgdagger", "hgdagger_sync"))
ASYNC_ARM, SYNC_ARM = SYNC_PAIRS[0]  # the pair reported when no pair ran whole
LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"  # never collide with a `robot-rl run` on the default ports
PARTIAL_REPORT = "partial.json"  # in the run's directory, rewritten after every arm


# ---------------------------------------------------------------- curves (pure)


def curve_points(records: Sequence[EpisodeRecord], window: int) -> list[dict[str, float]]:
    """One point per episode: rolling autonomous success and intervention rate over the last ``window``.

    Before ``window`` episodes exist the rate is over all of them (a noisy start, kept so
    the plot starts at episode 1; ``first_reaching`` ignores those points).
    """
    autonomous = np.array([r.autonomous for r in records], dtype=float)
    intervened = np.array([r.intervened for r in records], dtype=float)
    points = []
    for i, record in enumerate(records):
        lo = max(0, i + 1 - window)
        points.append({
            "episodes": i + 1,
            "wall_s": round(float(record.wall_s), 3),
            "success": float(autonomous[lo:i + 1].mean()),
            "intervention_rate": float(intervened[lo:i + 1].mean()),
        })
    return points


def first_reaching(points: Sequence[dict[str, float]], window: int, threshold: float = THRESHOLD) -> dict | None:
    """The first point with a full window behind it whose success is >= ``threshold`` (None: never)."""
    for point in points:
        if point["episodes"] >= window and point["success"] >= threshold:
            return point
    return None


def final_success(points: Sequence[dict[str, float]]) -> float | None:
    """Rolling autonomous success at the end of the budget (None: the arm finished no episode)."""
    return points[-1]["success"] if points else None


# ---------------------------------------------------------------- report (pure)


@dataclass
class ArmResult:
    """What one arm produced: its episodes in completion order (wall_s from the robots' start), learner counters."""

    name: str
    records: list[EpisodeRecord]
    updates: int = 0
    weights_version: int = 0
    arm_total_s: float = 0.0  # start-up, budget and the tail (last episodes, store flush)
    output_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the sync arm's rounds
    heldout: dict[str, Any] | None = None  # ``heldout_eval`` of the arm's final weights (None: not run)
    heldout_timeline: list[dict[str, Any]] = field(default_factory=list)  # scored ``timeline.Snapshot``s


def build_report(results: Sequence[ArmResult], config: LearningBenchConfig) -> dict:
    """The JSON of the benchmark: ``curves``, ``final``, ``sync_vs_async``, plus per-arm details."""
    curves = {r.name: curve_points(r.records, config.window) for r in results}
    final = {}
    arms = {}
    for r in results:
        reached = first_reaching(curves[r.name], config.window)
        final[r.name] = {"success": final_success(curves[r.name]),
                         "episodes_to_80": reached["episodes"] if reached else None,
                         "heldout_success": r.heldout["success"] if r.heldout else None}
        last = curves[r.name][-1] if curves[r.name] else None
        arms[r.name] = {
            **dataclasses.asdict(ARMS[r.name]),
            "episodes": len(r.records),
            "updates": r.updates,
            "weights_version": r.weights_version,
            "arm_total_s": round(r.arm_total_s, 1),
            "final_intervention_rate": last["intervention_rate"] if last else None,
            "wall_s_to_80": reached["wall_s"] if reached else None,
            "output_dir": r.output_dir,
            "heldout": r.heldout,
            "heldout_timeline": r.heldout_timeline,
            **r.extra,
        }
    return {
        "curves": curves,
        "final": final,
        "sync_vs_async": sync_vs_async(curves, config.window, {r.name: r.heldout_timeline for r in results}),
        "arms": arms,
        "settings": dataclasses.asdict(config),
        "notes": (
            f"success = autonomous success (success with no operator takeover) as a rolling mean over the last "
            f"{config.window} episodes of the arm (all robots, completion order; fewer episodes before the "
            f"window fills); wall_s counts from the robots' start (learner start-up excluded). "
            f"episodes_to_80 / wall_s_to_80: first point with a full window at >= 80 %, null if never within "
            f"the budget. Every arm: same BC start, same demonstrations, same scene seeds, "
            f"{config.minutes_per_arm:g} min of wall clock with robots in real time (robot time = wall time), "
            f"run one after the other on the same machine; learner and robots share its CPUs, so the async "
            f"trainer competes with the robots for compute (the sync loop's trainer does not; it runs one "
            f"PyTorch intra-op thread per core, the async arms run.torch_threads; the async arms' robots run as "
            f"run.robots says, the sync loop's on threads since its phases take turns). A rolling window this "
            f"short touches 80 % by chance at ~65-70 % true success: compare wall_s_to_80 with the none "
            f"arm's, and trust heldout_success for learning. sync_vs_async "
            f"compares {' or '.join(f'{a!r} with {s!r}' for a, s in SYNC_PAIRS)} (the first pair that ran; "
            f"collect {config.sync_collect_episodes} episodes, then "
            f"{config.sync_updates} updates, per round). heldout_success: the arm's final weights alone (no "
            f"operator) on {config.eval_episodes} scenes no arm trained on, same scenes and flow noise for every arm. "
            f"heldout_timeline (when bench.heldout_every_s > 0): the learner's weights saved every "
            f"{config.heldout_every_s:g} s of robot time, each scored on the first {config.timeline_episodes} of "
            f"those scenes; heldout_wall_s_to_80_* / _90_*: the first saved copy at >= 80 % / 90 % there."
        ),
    }


def sync_vs_async(curves: dict[str, list[dict]], window: int,
                  timelines: dict[str, list[dict]] | None = None) -> dict[str, Any]:
    """Wall clock to 80 % for the async learner and the sync loop (off the live window and, where
    the arms have one, off the held-out timeline), and where each stood at the end."""
    async_arm, sync_arm = next((pair for pair in SYNC_PAIRS if all(arm in curves for arm in pair)),
                               (ASYNC_ARM, SYNC_ARM))
    out: dict[str, Any] = {"async_arm": async_arm, "sync_arm": sync_arm}
    timelines = timelines or {}
    for side, arm in (("async", async_arm), ("sync", sync_arm)):
        points = curves.get(arm, [])
        reached = first_reaching(points, window)
        out[f"wall_s_to_80_{side}"] = reached["wall_s"] if reached else None
        out[f"success_at_budget_{side}"] = final_success(points)
        out[f"episodes_{side}"] = len(points)
        for percent in HELDOUT_THRESHOLDS:
            heldout = first_heldout_reaching(timelines.get(arm, []), percent / 100)
            out[f"heldout_wall_s_to_{percent}_{side}"] = heldout["wall_s"] if heldout else None
    out["async_over_sync_wall_s_to_80"] = _ratio(out["wall_s_to_80_async"], out["wall_s_to_80_sync"])
    for percent in HELDOUT_THRESHOLDS:
        out[f"heldout_async_over_sync_wall_s_to_{percent}"] = _ratio(out[f"heldout_wall_s_to_{percent}_async"],
                                                                     out[f"heldout_wall_s_to_{percent}_sync"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# ---------------------------------------------------------------- running the arms


def arm_learner_config(cfg: RobotRLConfig, checkpoint: Path, demos: Path, arm_dir: Path) -> LearnerConfig:
    """The learner config of one arm: its algorithm's settings, the shared start, its own directories."""
    config = local_learner_config(cfg, checkpoint, arm_dir, demos)
    config.service.router_endpoint = config.service.pub_endpoint = LOOPBACK_ANY_PORT
    return config


def run_arm(name: str, cfg: RobotRLConfig, bench: LearningBenchConfig, policy: FlowVLA, checkpoint: Path,
            demos: Path, out_dir: Path) -> ArmResult:
    """Run one arm for ``bench.minutes_per_arm`` and collect its learning curve."""
    arm = ARMS[name]
    arm_dir = out_dir / name
    share_cpu_with_robots(cfg, overlapping=not arm.sync)  # the sync loop's phases take turns
    learner_config = arm_learner_config(cfg, checkpoint, demos, arm_dir)
    run = LocalRunConfig(num_robots=bench.num_robots, episodes_per_robot=10**9, max_steps=cfg.run.max_episode_steps,
                         spool_dir=str(arm_dir / "spool"), edge=cfg.edge, time_budget_s=bench.minutes_per_arm * 60.0,
                         robots=cfg.run.robots)
    robots = make_sim_robot_factory(sim_config(cfg), task_families(cfg), seed_base=cfg.seed + cfg.seeds.robots,
                                    stride=cfg.seeds.stride)  # same scenes in every arm
    operators = operator_factory(cfg) if arm.operator else None
    torch.manual_seed(cfg.seed)  # same flow-matching noise stream at the start of every arm
    started = time.monotonic()
    curve = LearningCurve()
    progress = Progress(curve, total=None)  # type: ignore[arg-type]  # time-bounded: no known total
    progress.bar.set_description(name)
    timeline: list[WeightsTimeline] = []

    def on_start(learner: LearnerService) -> None:
        progress.attach(learner)  # the curve's wall clock starts with the robots (not the start-up)
        if bench.heldout_every_s > 0 and arm.train:
            timeline.append(WeightsTimeline(learner.trainer, arm_dir / "timeline", bench.heldout_every_s,
                                            lambda: len(curve.records)).start())

    try:
        if arm.sync:
            result = run_sync(learner_config, policy, run, robots, collect_episodes=bench.sync_collect_episodes,
                              updates=bench.sync_updates, operator_factory=operators,
                              on_episode=progress.on_episode, on_start=on_start)
        else:
            result = run_local(learner_config, policy, run, robots, train=arm.train, operator_factory=operators,
                               on_episode=progress.on_episode, on_start=on_start)
    finally:
        progress.close()
        snapshots = timeline[0].stop() if timeline else []
    records = curve.records
    extra = {"sync_rounds": result.weights_version} if arm.sync else {}
    arm_total_s = time.monotonic() - started
    final_weights = result.checkpoint if result.checkpoint is not None else checkpoint
    return ArmResult(name, records, updates=result.updates, weights_version=result.weights_version,
                     arm_total_s=arm_total_s, output_dir=str(arm_dir), extra=extra,
                     heldout=heldout_eval(final_weights, cfg, bench.eval_episodes, f"held-out {name}"),
                     heldout_timeline=score_timeline(snapshots, cfg, bench.timeline_episodes, name))


def score_timeline(snapshots: Sequence[Any], cfg: RobotRLConfig, episodes: int, name: str) -> list[dict[str, Any]]:
    """Each saved copy of an arm's weights with its held-out success (None where not scored)."""
    scores = heldout_eval_all([Path(s.weights) for s in snapshots], cfg, episodes, f"timeline {name}")
    return [{**s.to_dict(), "success": r["success"] if r else None, "ci95": r["ci95"] if r else None}
            for s, r in zip(snapshots, scores, strict=True)]


def save_partial_report(report: dict, path: Path) -> None:
    """The arms finished so far, rewritten after each one: an hour of arms survives a crash or Ctrl-C."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(path)
    print(f"bench learning: {len(report['arms'])} arm(s) done, saved in {path}")


def run_learning_bench(cfg_for: Callable[[str], RobotRLConfig], bench: LearningBenchConfig, out_dir: Path) -> dict:
    """Every arm in turn from the same BC checkpoint; returns the report (see ``build_report``)."""
    base = cfg_for(ARMS[bench.arms[0]].learner)
    checkpoint = ensure_bc_checkpoint(base)
    demos = ensure_demos(base)
    policy = FlowVLA.from_pretrained(checkpoint, device="cpu")
    print(f"bench learning: arms {list(bench.arms)}, {bench.minutes_per_arm:g} min each "
          f"(~{len(bench.arms) * bench.minutes_per_arm:.0f} min), {bench.num_robots} robots, start {checkpoint}")
    results: list[ArmResult] = []
    for name in bench.arms:
        results.append(run_arm(name, cfg_for(ARMS[name].learner), bench, policy, checkpoint, demos, out_dir))
        save_partial_report(build_report(results, bench), out_dir / PARTIAL_REPORT)
    report = build_report(results, bench)
    report["start_checkpoint"] = str(checkpoint)
    report["start_heldout"] = next((r.heldout for r in results if r.name == "none"), None) \
        or heldout_eval(checkpoint, base, bench.eval_episodes, "held-out start")
    report["heldout_vs_start"] = heldout_vs_start(report["arms"], report["start_heldout"])
    return report


def heldout_vs_start(arms: dict[str, dict], start: dict | None) -> dict[str, dict | None]:
    """"Clearly above no learning", tested: each training arm's final weights against the start on
    the same held-out scenes (``paired_scores``; None where either was not scored)."""
    return {name: paired_scores(arm.get("heldout"), start) for name, arm in arms.items() if ARMS[name].train}


def plot_arms(report: dict, path: Path) -> Path:
    """One PNG: rolling autonomous success vs episodes and vs wall clock, and intervention rate, per arm."""
    plt = pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    timelines = {name: arm.get("heldout_timeline") or [] for name, arm in report.get("arms", {}).items()}
    panels = 4 if any(timelines.values()) else 3
    fig, axes = plt.subplots(1, panels, figsize=(5.3 * panels, 4.5))
    for name, points in report["curves"].items():
        if not points:
            continue
        style = "--" if ARMS[name].sync else ":" if not ARMS[name].train else "-"
        episodes = [p["episodes"] for p in points]
        axes[0].plot(episodes, [p["success"] for p in points], style, label=name)
        axes[1].plot([p["wall_s"] / 60.0 for p in points], [p["success"] for p in points], style, label=name)
        axes[2].plot(episodes, [p["intervention_rate"] for p in points], style, label=name)
        scored = [p for p in timelines.get(name, []) if p.get("success") is not None]
        if panels == 4 and scored:
            start = report.get("start_heldout")  # every arm's curve starts at the shared start's score
            scored = ([{"wall_s": 0.0, "success": start["success"]}] if start else []) + scored
            axes[3].plot([p["wall_s"] / 60.0 for p in scored], [p["success"] for p in scored], style, marker="o",
                         label=name)
    window = report["settings"]["window"]
    titles: tuple[str, ...] = ("autonomous success vs episodes", "autonomous success vs wall clock",
                               "intervention rate vs episodes")
    xlabels = ["episodes", "wall-clock minutes", "episodes"]
    if panels == 4:
        titles += ("held-out success of the weights vs wall clock",)
        xlabels.append("wall-clock minutes")
    for ax, title, xlabel in zip(axes, titles, xlabels, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if ax is not axes[2]:  # every success panel
            ax.axhline(THRESHOLD, color="grey", alpha=0.4, linewidth=0.8)
    axes[0].set_ylabel(f"rolling mean over {window} episodes")
    axes[0].legend(loc="best", fontsize=8)
    fig.suptitle("robot-rl bench learning (same start, seeds and budget per arm)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(report: dict) -> None:
    window = report["settings"]["window"]
    table = Table(title=f"bench learning: {report['settings']['minutes_per_arm']:g} min per arm",
                  caption=f"success: autonomous, over the last {window} episodes; interventions: share of "
                          f"those episodes with a takeover; held-out: final weights alone on fixed unseen "
                          f"scenes (95 % CI); vs start: points above the start on those scenes (exact McNemar p)")
    table.add_column("arm", no_wrap=True)
    for col in ("episodes", "success", "episodes to 80%", "wall s to 80%", "updates", "interventions", "held-out",
                "vs start"):
        table.add_column(col, justify="right")
    vs_start = report.get("heldout_vs_start") or {}
    for name, final in report["final"].items():
        arm = report["arms"][name]
        table.add_row(name, str(arm["episodes"]), _pct(final["success"]), _or_dash(final["episodes_to_80"]),
                      _or_dash(arm["wall_s_to_80"]), str(arm["updates"]), _pct(arm["final_intervention_rate"]),
                      format_score(arm.get("heldout")), format_paired(vs_start.get(name)))
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)  # a log file or pipe: room for every column (80 wraps the held-out CIs)
    console.print(table)
    if report.get("start_heldout"):
        console.print(f"held-out success of the start: {format_score(report['start_heldout'])}")
    sva = report["sync_vs_async"]
    console.print(
        f"sync vs async ({sva['sync_arm']} vs {sva['async_arm']}): wall s to 80% "
        f"{_or_dash(sva['wall_s_to_80_sync'])} vs {_or_dash(sva['wall_s_to_80_async'])}; success at the end of the "
        f"budget {_pct(sva['success_at_budget_sync'])} vs {_pct(sva['success_at_budget_async'])} "
        f"({sva['episodes_sync']} vs {sva['episodes_async']} episodes)")
    for name, arm in report["arms"].items():
        scored = [p for p in arm.get("heldout_timeline") or [] if p.get("success") is not None]
        if scored:
            console.print(f"held-out over robot time, {name}: " + ", ".join(
                f"{p['wall_s'] / 60:.0f} min {p['success']:.0%} ({p['updates']} upd)" for p in scored))
    if any(arm.get("heldout_timeline") for arm in report["arms"].values()):
        for percent in HELDOUT_THRESHOLDS:
            console.print(f"held-out wall s to {percent}% (saved weights), sync vs async: "
                          f"{_or_dash(sva.get(f'heldout_wall_s_to_{percent}_sync'))} vs "
                          f"{_or_dash(sva.get(f'heldout_wall_s_to_{percent}_async'))} "
                          f"(async/sync {_or_dash(sva.get(f'heldout_async_over_sync_wall_s_to_{percent}'))})")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def run_from_cli(cfg: RobotRLConfig, json_path: Path | None = None,
                 compose: Callable[[list[str]], RobotRLConfig] | None = None) -> dict:
    """``cfg`` as composed; ``compose(["learner=NAME"])`` is the same command line with an arm's learner."""
    configs: dict[str, RobotRLConfig] = {}

    def cfg_for(learner: str) -> RobotRLConfig:
        if compose is None:
            raise ValueError("bench learning composes one config per arm: give it compose")
        if learner not in configs:
            configs[learner] = compose([f"learner={learner}"])
        return configs[learner]

    out_dir = Path(cfg.output_dir) / "bench_learning" / time.strftime("%Y%m%d-%H%M%S")
    report = run_learning_bench(cfg_for, cfg.bench, out_dir)
    png = (json_path or out_dir / "learning.json").with_suffix(".png")
    report["plot"] = str(plot_arms(report, png))
    print_table(report)
    print(f"plot: {png}")
    return report
