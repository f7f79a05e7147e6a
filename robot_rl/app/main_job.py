"""The main job (``robot-rl run``) on its embedded default.

A learner and ``run.num_robots`` simulated SO-101 edge nodes on loopback, a simulated
operator watching each robot and taking over when the policy goes wrong, all on CPU.
The policy starts from the behaviour-cloned checkpoint (recorded and trained first if
missing); the learner fine-tunes it (``learner=hgdagger`` by default: on the operator's
corrections and the demonstrations) while the robots keep acting, and hot-swaps each new
version into the robots between two chunks. At the end it writes a learning-curve plot
and prints a summary.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from robot_rl.app import behaviour_cloning, evaluation
from robot_rl.app.config import LocalRunConfig, VerdictMode
from robot_rl.app.family_check import check_task_families
from robot_rl.app.heldout_monitor import HeldoutMonitor, HeldoutPoint
from robot_rl.app.learning_curve import CurvePoint, LearningCurve
from robot_rl.app.local_run import make_sim_robot_factory, run_local
from robot_rl.app.policies import shipped_bc_checkpoint
from robot_rl.app.run_stop import RunStop
from robot_rl.app.served_fleet import check_served_fleet, serves_robots
from robot_rl.app.sim import demo_expert, sim_config, task_families
from robot_rl.app.unattended_verdicts import UnattendedVerdicts
from robot_rl.core.registry import POLICIES
from robot_rl.core.statistics import PairedComparison
from robot_rl.edge.rerun_view import start_viewer
from robot_rl.hardware.sim.scene import JOINT_NAMES
from robot_rl.hardware.teleop.blend import TakeoverBlender
from robot_rl.hardware.teleop.intervention import TeleopIntervention
from robot_rl.hardware.teleop.scripted import ScriptedOperatorConfig, scripted_operator_for_sim
from robot_rl.learner.algorithms.config import ALGORITHMS
from robot_rl.learner.console import console_line
from robot_rl.policies.lerobot_config import LeRobotPolicyConfig
from robot_rl.policies.loading import load_trainable

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig
    from robot_rl.learner.config import LearnerConfig
    from robot_rl.learner.service import LearnerService
    from robot_rl.policies.trainable import TrainablePolicy

log = logging.getLogger(__name__)

VERSION_ROW_EPISODES = 20  # the summary's table merges versions until a row has this many episodes


def ensure_bc_checkpoint(cfg: RobotRLConfig) -> Path:
    """The starting policy: ``policy.path`` if given, else the BC checkpoint under
    ``bc.checkpoint_dir``, else the one shipped in ``checkpoints/`` if it was trained for the
    configured model and tasks, else one trained now (records demonstrations first)."""
    if cfg.policy.path:
        return Path(cfg.policy.path)
    checkpoint = Path(cfg.bc.checkpoint_dir)
    shipped = shipped_bc_checkpoint(cfg)
    if not (checkpoint / "model.safetensors").exists() and shipped is not None:
        print(f"starting from the BC checkpoint that ships with robot_rl: {shipped}")
        return shipped
    if not (checkpoint / "model.safetensors").exists():
        print(f"no BC checkpoint at {checkpoint}: recording demonstrations and training one first (one-time)")
        result = behaviour_cloning.train_bc(cfg)
        print(f"BC start: success {result['success']:.0%} over {result['eval_episodes']} sim episodes")
    return checkpoint


def run_policy(cfg: RobotRLConfig, checkpoint: Path) -> TrainablePolicy:
    """The policy the run's learner trains and its robots start from: ``checkpoint`` as ``policy=lerobot``
    configures it (LoRA adapters on a frozen base, ``camera_map``, ``joint_names``; on ``policy.device``,
    else the CPU the run shares), or by its layout (a FlowVLA or LeRobot checkpoint)."""
    if isinstance(cfg.policy, LeRobotPolicyConfig):
        return POLICIES.build(replace(cfg.policy, path=str(checkpoint), device=cfg.policy.device or "cpu"))
    return load_trainable(checkpoint)


@dataclass(frozen=True)
class ScriptedOperatorFactory:
    """Each robot gets a scripted operator (seeded by ``settings.seed`` + its index) behind the
    real takeover path, driving at the demonstrator's ``expert_speed`` (its corrections are
    training data too). Picklable, so a robot process builds its own operator."""

    fps: int
    expert_speed: float = 1.0
    settings: ScriptedOperatorConfig = field(default_factory=ScriptedOperatorConfig)

    def __call__(self, index: int, robot):
        settings = replace(self.settings, seed=self.settings.seed + index)
        operator = scripted_operator_for_sim(settings, robot, demo_expert(robot, self.expert_speed))
        blender = TakeoverBlender(self.fps, settings.blend_time_s, settings.max_step_per_tick)
        return TeleopIntervention(operator, blender)


def operator_factory(cfg: RobotRLConfig) -> ScriptedOperatorFactory | None:
    """The run's operators (``run.operator``; null: none), driving at the demonstrator's speed."""
    if cfg.run.operator is None:
        return None
    return ScriptedOperatorFactory(cfg.robot.fps, cfg.demos.expert_speed, cfg.run.operator)


class Progress:
    """One live line: episodes, rolling success, interventions, updates/s, versions per robot."""

    def __init__(self, curve: LearningCurve, total: int) -> None:
        self.curve = curve
        self.bar = tqdm(total=total, desc="run", unit="ep")
        self.learner = None
        self.robot_versions: dict[str, int] = {}
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._step0 = 0

    def attach(self, learner) -> None:
        """Called as the robots start: the curve's clock and the updates/s count from here."""
        self.learner = learner
        self.curve.start_clock()
        self._t0 = time.monotonic()
        self._step0 = learner.trainer.step

    def on_episode(self, robot_id: str, episode, version: int) -> None:
        self.curve.add(robot_id, episode, version)
        with self._lock:
            self.robot_versions[robot_id] = version
            recent = self.curve.recent()
            updates = self.learner.trainer.step if self.learner else 0
            published = self.learner.trainer.version if self.learner else 0
            rate = (updates - self._step0) / max(time.monotonic() - self._t0, 1e-9)
            versions = " ".join(f"{r}:v{v}" for r, v in sorted(self.robot_versions.items()))
            self.bar.set_postfix_str(
                f"success {recent['success']:.0%} autonomous {recent['autonomous']:.0%} "
                f"interventions {recent['intervention']:.0%} | updates {updates} ({rate:.1f}/s) "
                f"published v{published} | {versions}"
            )
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def local_learner_config(cfg: RobotRLConfig, checkpoint: Path, run_dir: Path,
                         demos: Path | None = None) -> LearnerConfig:
    """The learner of a run whose robots share this machine: starts from ``checkpoint``, stores what
    the simulated robots record (their cameras, image size and rate), keeps its store and
    checkpoints under ``run_dir``, and trains and stores at ``run.learner_nice`` so the robots'
    control ticks are served first (a learner on its own GPU box needs no such thing). With
    ``edge.inference_runner=remote`` it also serves the robots their chunks (``learner.serve_policy``)."""
    robot = sim_config(cfg)
    config = copy.deepcopy(cfg.learner)
    config.serve_policy = config.serve_policy or serves_robots(cfg)
    config.init_checkpoint = str(checkpoint)
    config.store = replace(config.store, root=str(run_dir / "store"), fps=robot.fps, joint_names=JOINT_NAMES,
                           cameras=tuple(robot.cameras),
                           image_height=robot.image_height, image_width=robot.image_width,
                           commit_nice=max(config.store.commit_nice, cfg.run.learner_nice))
    if config.store.demonstrations is None:
        config.store.demonstrations = str(demos if demos is not None else behaviour_cloning.ensure_demos(cfg))
    config.trainer = replace(config.trainer, checkpoint_dir=str(run_dir / "checkpoints"),
                             thread_nice=max(config.trainer.thread_nice, cfg.run.learner_nice))
    return config


def share_cpu_with_robots(cfg: RobotRLConfig, *, overlapping: bool = True) -> None:
    """Cap PyTorch's intra-op threads for a run whose robots and learner share this process.

    PyTorch starts one intra-op thread per core, for the trainer and for every robot's policy.
    On a small CPU the trainer's second thread waits at every parallel op for a core that a
    robot or the dataset writer holds (BENCHMARKS.md "learning": more updates per second with
    one). ``run.torch_threads: null`` keeps PyTorch's default (a learner on a machine of its own).
    ``overlapping=False`` (a synchronous collect-then-train loop, whose trainer has the CPU to
    itself while the robots wait) gives it one thread per core whatever the setting.
    """
    threads = cfg.run.torch_threads if overlapping else len(os.sched_getaffinity(0))
    if threads is not None:
        torch.set_num_threads(threads)


def learner_label(config: LearnerConfig) -> str:
    """The learner as configured (``learner=hgdagger``) and the stream mix it samples: hgdagger is
    ``bc`` at 0 / 0.5 / 0.5, and the plot and the summary should say which data it imitated."""
    t = config.trainer
    return (f"{config.name}, online / corrections / demonstrations "
            f"{t.online_ratio:g} / {t.intervention_ratio:g} / {t.demonstration_ratio:g}")


def local_run_config(cfg: RobotRLConfig, run_dir: Path, viewer: Any = None) -> LocalRunConfig:
    """What ``run_local`` needs of the run's settings, its spools and each robot's local dataset under
    ``run_dir`` (``spool/``, ``robots/ROBOT_ID``, as a real robot keeps them); ``viewer``: what the
    robots log a live view to (``rerun_view.start_viewer``; None: ``cfg.viewer``)."""
    budget = cfg.run.time_budget_min
    verdicts = None
    if cfg.run.verdicts == VerdictMode.detector:
        verdicts = UnattendedVerdicts(labelled=-(-cfg.run.labelled_episodes // cfg.run.num_robots),
                                      wait_s=cfg.session.detector_wait_s)
    return LocalRunConfig(num_robots=cfg.run.num_robots, episodes_per_robot=cfg.run.episodes,
                          max_steps=cfg.run.max_episode_steps, spool_dir=str(run_dir / "spool"), edge=cfg.edge,
                          time_budget_s=budget * 60.0 if budget else None, robots=cfg.run.robots,
                          min_updates=cfg.run.min_updates or None, record_dir=str(run_dir / "robots"),
                          viewer=cfg.viewer if viewer is None else viewer, verdicts=verdicts)


def run_main_job(cfg: RobotRLConfig) -> dict:
    run_dir = Path(cfg.run.dir) / time.strftime("%Y%m%d-%H%M%S")
    families = task_families(cfg)  # a bad value fails now, not after a BC start was trained
    check_task_families(cfg, families)
    check_served_fleet(cfg)
    checkpoint = ensure_bc_checkpoint(cfg)
    share_cpu_with_robots(cfg)
    policy = run_policy(cfg, checkpoint)
    learner_config = local_learner_config(cfg, checkpoint, run_dir)
    viewer, viewer_hub = start_viewer(cfg.viewer, run_dir.name)
    run = local_run_config(cfg, run_dir, viewer)
    curve = LearningCurve()
    progress = Progress(curve, run.num_robots * run.episodes_per_robot)
    monitors: list[HeldoutMonitor] = []

    def robots_starting(learner: LearnerService) -> None:
        progress.attach(learner)
        if learner.console is not None:
            progress.bar.write(console_line(learner.console))
        if cfg.run.heldout_scenes:
            monitor = HeldoutMonitor(learner.trainer, cfg, run_dir / "heldout", cfg.run.heldout_scenes,
                                     lambda: len(curve.records), cfg.run.heldout_every_updates,
                                     policy_options=policy.loading_options()).start()
            monitors.append(monitor)
            learner.heldout_points = lambda: [point.to_dict() for point in monitor.points]

    served = f", chunks from the learner's server on {cfg.serve.endpoint}" if serves_robots(cfg) else ""
    print(
        f"robot-rl run: learner ({learner_label(learner_config)}) + {run.num_robots} simulated SO-101 "
        f"+ {'scripted operator' if cfg.run.operator else 'no operator'}, loopback, CPU{served}; output {run_dir}"
    )
    stop = RunStop().install()  # Ctrl-C from here on: the robots end their episodes (robot_rl.app.run_stop)
    try:
        result = run_local(
            learner_config, policy, run,
            make_sim_robot_factory(sim_config(cfg), families, seed_base=cfg.seed + cfg.seeds.robots,
                                   stride=cfg.seeds.stride),
            operator_factory=operator_factory(cfg),
            on_episode=progress.on_episode,
            on_start=robots_starting,
            on_robots_done=progress.close,
            serve=cfg.serve,
            stop_requested=stop.requested,
        )
    finally:
        stop.robots_done()
        progress.close()
        points = [p for monitor in monitors for p in monitor.stop()]
        if viewer_hub is not None:
            viewer_hub.disconnect()
    ended_s = curve.elapsed_s()
    heldout = None if result.stopped_early else start_vs_final(cfg, checkpoint, result.checkpoint,
                                                               policy.loading_options())
    summary = summarize(curve, result, run_dir, cfg.run.curve_window, ALGORITHMS.name_of(learner_config.algorithm),
                        heldout=heldout, learner=learner_label(learner_config), heldout_points=points,
                        ended_s=ended_s, start=checkpoint)
    print_summary(summary)
    return summary


def start_vs_final(cfg: RobotRLConfig, start: Path, final: Path | None,
                   policy_options: dict[str, Any] | None = None) -> dict | None:
    """The start's and the final weights' success alone (no operator) on ``run.eval_episodes``
    scenes no robot of the run saw, paired (same scenes, same flow noise): the live window of 30
    episodes, watched by the operator, moves by +-17 points on its own (BENCHMARKS.md "learning").
    ``policy_options``: the run policy's ``loading_options()`` (a LeRobot policy's camera_map,
    joint_names, tokenizer)."""
    episodes = cfg.run.eval_episodes
    if episodes <= 0 or final is None:
        return None
    print(f"held-out check: the start and the final weights on {episodes} unseen scenes (run.eval_episodes)")
    before, after = evaluation.heldout_eval_all([start, final], cfg, episodes, "held-out",
                                                policy_options=policy_options)
    return {"start": before, "final": after, "episodes": episodes,
            "final_vs_start": evaluation.paired_scores(after, before)}


def summarize(curve: LearningCurve, result, run_dir: Path, window: int, algorithm: str,
              heldout: dict | None = None, learner: str | None = None,
              heldout_points: Sequence[HeldoutPoint] = (), ended_s: float | None = None,
              start: Path | None = None) -> dict:
    """``learner``: how the plot and the table name the learner (``learner_label``; default the
    algorithm); ``heldout_points``: versions scored while the run went; ``ended_s``: when training
    ended on the curve's clock (where the final weights' score is drawn); ``start``: the checkpoint
    the run started from."""
    run_dir.mkdir(parents=True, exist_ok=True)
    learner = learner or algorithm
    episodes = len(curve.records)
    by_family = evaluation.paired_by_family(heldout["final"], heldout["start"]) if heldout else {}
    drawn = heldout_curve_points(heldout, heldout_points, by_family, episodes, ended_s or curve.elapsed_s())
    png = curve.plot(run_dir / "learning_curve.png", window=window, title=f"robot-rl run ({learner})",
                     heldout=drawn)
    summary = {
        "algorithm": algorithm,
        "learner": learner,
        "episodes": result.episodes,
        "steps": result.steps,
        "updates": result.updates,
        "updates_with_robots": result.updates_with_robots,  # the rest came after them (run.min_updates)
        "weights_version": result.weights_version,
        "robot_versions": result.robot_versions,
        "per_version": {str(k): v for k, v in curve.per_version().items()},
        "per_version_groups": curve.per_version_groups(VERSION_ROW_EPISODES),
        "first_vs_last": curve.first_vs_last(),
        "operator": curve.operator_effort(),
        "verdicts": curve.verdicts(),  # who judged the live episodes, and how often the operator was asked
        "curve_png": str(png),
        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
        "start_checkpoint": str(start) if start else None,
        "stopped_early": result.stopped_early,  # by Ctrl-C: no held-out check of the start and final weights
        "heldout": heldout,  # ``start_vs_final``: None when off or not trained
        # per task family, on the same scenes: {family: {start, final, start_ci, final_ci, n, p}}
        "heldout_by_family": by_family,
        "heldout_per_version": [p.to_dict() for p in heldout_points],
        "family_shares": result.family_shares,  # each task family's share of the samples trained on
        "served_chunks": result.served_chunks,  # per robot, from the learner's server (None: robots' own copies)
        "episodes_log": curve.to_json(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def heldout_curve_points(heldout: dict | None, points: Sequence[HeldoutPoint], by_family: dict[str, dict],
                         episodes: int, ended_s: float) -> list[CurvePoint]:
    """What the learning curve draws of the held-out scores: each version scored while running and
    the start and final weights, over all scenes and, with more than one task family, per family."""
    drawn = [CurvePoint(f"held-out per version ({p.scenes} scenes)", p.episodes, p.wall_s, p.success, p.ci95)
             for p in points]
    for p in points:
        if len(p.by_family) > 1:
            drawn += [CurvePoint(f"held-out per version: {family} ({score['scenes']} scenes)", p.episodes, p.wall_s,
                                 score["success"], tuple(score["ci95"]), family=family)
                      for family, score in p.by_family.items()]
    if heldout and heldout.get("start") and heldout.get("final"):
        label = f"held-out start and final ({heldout['episodes']} scenes)"
        for scored, at_episodes, at_s in ((heldout["start"], 0, 0.0), (heldout["final"], episodes, ended_s)):
            drawn.append(CurvePoint(label, at_episodes, at_s, scored["success"], tuple(scored["ci95"]),
                                    endpoints=True))
    if len(by_family) > 1:
        for family, score in by_family.items():
            label = f"held-out start and final: {family} ({score['n']} scenes)"
            drawn += [CurvePoint(label, at_episodes, at_s, score[k], tuple(score[f"{k}_ci"]), endpoints=True,
                                 family=family)
                      for k, at_episodes, at_s in (("start", 0, 0.0), ("final", episodes, ended_s))]
    return drawn


def print_summary(summary: dict) -> None:
    """The run in a table and a few lines that agree with each other: the live window (watched and
    rescued by the operator) first, what the weights do alone on unseen scenes last."""
    table = Table(title=f"robot-rl run: live episodes per policy version ({summary['learner']})")
    for col in ("versions", "episodes", "success", "autonomous", "interventions"):
        table.add_column(col, justify="right")
    for row in summary["per_version_groups"]:
        table.add_row(row["versions"], str(row["episodes"]), f"{row['success']:.0%}", f"{row['autonomous']:.0%}",
                      f"{row['intervention']:.0%}")
    console = Console()
    console.print(table)
    console.print(
        f"{summary['episodes']} episodes, {summary['steps']} steps, {summary['updates']} updates, "
        f"weights v{summary['weights_version']}, robots on {summary['robot_versions']}"
    )
    served = summary.get("served_chunks")
    if served is not None:
        print("chunks from the learner's policy server: " + ", ".join(f"{r} {n}" for r, n in sorted(served.items())))
    with_robots = summary.get("updates_with_robots")
    if with_robots is not None and with_robots < summary["updates"]:
        print(f"{with_robots} updates while the robots acted, {summary['updates'] - with_robots} after them "
              f"(while their episodes were written, then on to run.min_updates)")
    operator = summary.get("operator")
    if operator and operator["episodes_taken_over"]:
        print(f"the operator took over in {operator['episodes_taken_over']} episodes and drove "
              f"{operator['steps_driven']} steps ({operator['share_of_steps']:.1%} of all)")
    verdicts = summary.get("verdicts") or {}
    if verdicts.get("detector"):
        print(f"verdicts: the success detector gave {verdicts['detector']} ({verdicts['detector_accuracy']:.0%} "
              f"right against the sim), the operator was asked for {verdicts['asked']} "
              f"({verdicts['asked_fraction']:.0%} of the episodes after the {verdicts['labelled']} labelled)")
    first, last = summary["first_vs_last"]["first"], summary["first_vs_last"]["last"]
    print(f"live, with the operator watching (a window of {last['episodes']} episodes moves by +-17 points on its "
          f"own): autonomous success {_rate(first)} in the first {first['episodes']} -> {_rate(last)} in the last; "
          f"interventions {first['intervention']:.0%} -> {last['intervention']:.0%}")
    points = summary.get("heldout_per_version") or []
    if points:
        best = max(points, key=lambda p: p["success"])
        print(f"held-out while running, the weights alone on {points[0]['scenes']} unseen scenes: "
              f"{len(points)} versions scored, v{points[0]['version']} {points[0]['success']:.0%} -> "
              f"v{points[-1]['version']} {points[-1]['success']:.0%} (best v{best['version']} {best['success']:.0%})")
    if summary.get("stopped_early") and summary.get("checkpoint"):
        print(f"stopped early (Ctrl-C): the start and the final weights were not scored on held-out scenes; "
              f"robot-rl eval policy.path={summary['checkpoint']} eval.compare_path={summary['start_checkpoint']} "
              f"scores them (add the run's own settings)")
    heldout = summary.get("heldout")
    if heldout:
        missing = "not scored (see the log)"
        start, final = (evaluation.format_score(heldout[k], missing) for k in ("start", "final"))
        print(f"held-out success on {heldout['episodes']} unseen scenes, the weights alone: start {start} "
              f"-> final {final}")
        paired = heldout.get("final_vs_start")
        if paired:
            comparison = PairedComparison.from_dict(paired)
            print(f"final against start, scene by scene: {comparison.describe('the final', 'the start')}")
    by_family = summary.get("heldout_by_family") or {}
    if len(by_family) > 1:  # one family's line would repeat the line above
        for family, score in by_family.items():
            start, final = (evaluation.format_score({"success": score[k], "ci95": score[f"{k}_ci"]})
                            for k in ("start", "final"))
            print(f"  {family}: start {start} -> final {final} on {score['n']} scenes, final against start exact "
                  f"McNemar p = {score['p']:.2g}")
    shares = summary.get("family_shares") or {}
    if len(shares) > 1:
        print("samples trained on per task family: " + ", ".join(f"{f} {share:.0%}" for f, share in shares.items()))
    print(f"learning curve: {summary['curve_png']}; everything above: {Path(summary['curve_png']).parent}/summary.json")


def _rate(rates: dict) -> str:
    low, high = rates["autonomous_ci95"]
    return f"{rates['autonomous']:.0%} ({low:.0%}-{high:.0%})"
