"""Closed-loop evaluation of policies in the sim, through the real EdgeNode: the one place that
runs a policy on scenes and scores it (``robot-rl eval``, the main job's and ``bench learning``'s
held-out scores, train-bc's check and the benchmarks all call it; the statistics are
``core.statistics``).

Scenes: ``seed_scenes`` / ``scenes_of`` (seeded, the task families rotating over them) or
``dataset_scenes`` (where a logged dataset's episodes started). Running: ``run_scene_episode``
(one episode), ``evaluate_on_scenes`` (one policy), ``compare_policies`` (several on the same
scenes, best first), ``evaluate_policy`` (seeds in, the result alone). ``robot-rl eval`` runs
in ``robot_rl.app.eval_report``; ``heldout_eval`` / ``heldout_eval_all`` score saved weights in a
fresh process.

Everything that is evaluated runs the control path a robot runs (action queue, roll-forward,
splice, clamps); only the clock is virtual, so a 2-core CPU evaluates a policy as if it ran at a
given inference latency, exactly and reproducibly. Every policy of one comparison starts from the
very same scenes (seeds, or initial scenes taken from a dataset) and meets the same flow noise per
scene, so their success rates compare scene by scene (``core.statistics.compare_paired``) rather
than across different luck.

Held-out scores of saved weights (the main job's start against its final weights, ``bench
learning``'s arms) run in a fresh process (``heldout_eval``): the main job's process has by then
run simulated robots with their GL contexts, a learner and a ZeroMQ server for minutes, and once
an evaluation inside it scored the same weights on the same scenes 15 % where a fresh process
scored 35 % (the evaluation is deterministic; the cause was never reproduced). A fresh process
measures the weights and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from robot_rl.app.policies import load_policy, policy_source
from robot_rl.app.sim import sim_config, task_families
from robot_rl.core.clock import VirtualClock
from robot_rl.core.errors import ConfigError
from robot_rl.core.statistics import PairedComparison, compare_paired, wilson_interval
from robot_rl.core.types import Episode
from robot_rl.edge import EdgeConfig, EdgeNode
from robot_rl.hardware.sim.config import SimConfig
from robot_rl.hardware.sim.robot import SimSO101
from robot_rl.hardware.sim.wording import reword
from robot_rl.policies.loading import load_trainable
from robot_rl.replay.dataset import DatasetError, LoggedDataset, load_logged_dataset
from robot_rl.replay.joint_mapping import JointMapping, build_mapper
from robot_rl.replay.scenes import Scene, apply_scene, task_of_instruction

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)

# Builds the intervention hook of one episode (e.g. a simulated operator), or None.
InterventionFactory = Callable[[int], Callable | None]


# ---------------------------------------------------------------- results


@dataclass
class EvalResult:
    episodes: list[Episode]
    success_rate: float
    ci95: tuple[float, float]
    completion_s: float  # mean time to success over successful episodes (nan if none)
    stall_s_per_episode: float
    late_tick_frac: float
    per_family: dict[str, float]

    def as_dict(self) -> dict:
        return {
            "success": self.success_rate,
            "ci95": list(self.ci95),
            "completion_s": self.completion_s,
            "stall_s_per_episode": self.stall_s_per_episode,
            "late_tick_frac": self.late_tick_frac,
            "per_family": self.per_family,
            "episodes": len(self.episodes),
        }


@dataclass
class PolicyEval:
    """One policy's results over the shared scenes."""

    name: str
    result: EvalResult
    intervention_free_rate: float  # episodes in which nobody took over
    intervention_free_success: float  # succeeded with nobody taking over
    intervention_free_ci95: tuple[float, float]

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            **self.result.as_dict(),
            "intervention_free_rate": self.intervention_free_rate,
            "intervention_free_success": self.intervention_free_success,
            "intervention_free_ci95": list(self.intervention_free_ci95),
            "per_episode_success": [bool(e.success) for e in self.result.episodes],
        }


def summarize(episodes: list[Episode], fps: int, stall_ticks: int, late_ticks: int, total_ticks: int) -> EvalResult:
    successes = [e for e in episodes if e.success]
    completion = [_first_success_tick(e) / fps for e in successes]
    families = sorted({e.task_family for e in episodes})
    per_family = {f: float(np.mean([e.success for e in episodes if e.task_family == f])) for f in families}
    n = len(episodes)
    return EvalResult(
        episodes=episodes,
        success_rate=len(successes) / n if n else 0.0,
        ci95=wilson_interval(len(successes), n),
        completion_s=float(np.mean(completion)) if completion else float("nan"),
        stall_s_per_episode=stall_ticks / fps / n if n else 0.0,
        late_tick_frac=late_ticks / total_ticks if total_ticks else 0.0,
        per_family=per_family,
    )


def _first_success_tick(episode: Episode) -> int:
    for i, step in enumerate(episode.steps):
        if step.success:
            return i + 1
    return episode.num_steps


# ---------------------------------------------------------------- scenes


def seed_scenes(n: int, first_seed: int, families: Sequence[str] | None = None) -> list[Scene]:
    """Scenes from seeds ``first_seed`` on; with ``families`` the task family rotates over them in
    order (every family an equal share), else each seed draws its own."""
    return scenes_of([first_seed + i for i in range(n)], families)


def scenes_of(seeds: Sequence[int], families: Sequence[str] | None = None) -> list[Scene]:
    """One scene per seed, the families rotating over them in order."""
    return [Scene(seed=seed, family=families[i % len(families)] if families else None) for i, seed in enumerate(seeds)]


def dataset_scenes(dataset: LoggedDataset, mapping: JointMapping, sim_joints: tuple[str, ...]) -> list[Scene]:
    """The starting scene of each loaded episode: its seed if known, its instruction and first state."""
    mapper = build_mapper(mapping, dataset.state_names, sim_joints)
    scenes = []
    for episode in dataset.episodes:
        if task_of_instruction(episode.instruction) is None:
            raise DatasetError(
                f"episode {episode.index} of {dataset.source} asks {episode.instruction!r}, which is not a sim task; "
                "closed-loop eval judges success with the sim's tasks (pick/push/place a coloured cube)"
            )
        scenes.append(Scene(episode.seed, episode.instruction, mapper.to_sim(episode.state[0])))
    return scenes


# ---------------------------------------------------------------- running policies on scenes


@contextmanager
def episode_noise(policy: Any, seed: int) -> Iterator[None]:
    """Seed the policy's sampling noise for one episode (if it has ``reseed_noise``), then return it
    to fresh noise: the episode is reproducible, and policies compared on the same seeds meet the
    same noise."""
    reseed = getattr(policy, "reseed_noise", None)
    if reseed is None:
        yield
        return
    reseed(seed)
    try:
        yield
    finally:
        reseed(None)


def run_scene_episode(
    robot: Any,
    policy: Any,
    edge_config: EdgeConfig,
    scene: Scene,
    episode_id: int = 0,
    max_steps: int | None = None,
    intervention: Callable | None = None,
    fallback_seed: int = 0,
    on_tick: Callable | None = None,
    wording: str = "trained",
) -> tuple[Episode, EdgeNode]:
    """One closed-loop episode from ``scene`` on a fresh virtual clock (the policy's noise and the
    simulated latency seeded by the scene's seed); the policy reads the instruction in ``wording``
    (``robot_rl.hardware.sim.wording``), the task stays the scene's."""
    instruction = reword(apply_scene(robot, scene, fallback_seed=fallback_seed + episode_id), wording, episode_id)
    seed = scene.seed if scene.seed is not None else fallback_seed + episode_id
    config = replace(edge_config, fps=robot.fps, latency_seed=edge_config.latency_seed + seed)
    node = EdgeNode(robot, policy, VirtualClock(), config, task=robot, intervention=intervention, on_tick=on_tick)
    with episode_noise(policy, seed), node:
        episode = node.run_episode(max_steps or robot.config.max_episode_steps, instruction, episode_id=episode_id,
                                   seed=scene.seed, task_family=robot.task.family)
    return episode, node


def evaluate_on_scenes(
    robot: Any,
    policy: Any,
    edge_config: EdgeConfig,
    scenes: Sequence[Scene],
    name: str = "policy",
    *,
    max_steps: int | None = None,
    intervention_factory: InterventionFactory | None = None,
    fallback_seed: int = 0,
    progress: bool = True,
    wording: str = "trained",
) -> PolicyEval:
    """Success (Wilson 95 % CI), completion time, stalls and intervention-free rate over ``scenes``,
    the instructions in ``wording``."""
    episodes: list[Episode] = []
    stall_ticks = late_ticks = total_ticks = 0
    for i, scene in enumerate(tqdm(scenes, desc=f"evaluating {name}", disable=not progress, leave=False)):
        intervention = intervention_factory(i) if intervention_factory else None
        episode, node = run_scene_episode(robot, policy, edge_config, scene, i, max_steps, intervention, fallback_seed,
                                          wording=wording)
        episodes.append(episode)
        stall_ticks += episode.stall_steps
        late_ticks += node.stats.late_ticks
        total_ticks += episode.num_steps
    n = len(episodes)
    clean = [e for e in episodes if e.intervention_steps == 0]
    clean_successes = sum(1 for e in clean if e.success)
    return PolicyEval(
        name=name,
        result=summarize(episodes, robot.fps, stall_ticks, late_ticks, total_ticks),
        intervention_free_rate=len(clean) / n if n else 0.0,
        intervention_free_success=clean_successes / n if n else 0.0,
        intervention_free_ci95=wilson_interval(clean_successes, n),
    )


def evaluate_policy(robot: Any, policy: Any, edge_config: EdgeConfig, seeds: Sequence[int],
                    families: Sequence[str] | None = None, progress: bool = True,
                    desc: str = "policy") -> EvalResult:
    """``evaluate_on_scenes`` on seeded scenes (families rotating over them), the result alone."""
    return evaluate_on_scenes(robot, policy, edge_config, scenes_of(seeds, families), desc, progress=progress).result


def compare_policies(robot: Any, policies: dict[str, Any], edge_config: EdgeConfig, scenes: Sequence[Scene],
                     **kwargs: Any) -> list[PolicyEval]:
    """Every policy on the same ``scenes``; returned best first (success, then faster completion)."""
    return rank([evaluate_on_scenes(robot, policy, edge_config, scenes, name, **kwargs)
                 for name, policy in policies.items()])


def rank(evals: list[PolicyEval]) -> list[PolicyEval]:
    def key(e: PolicyEval) -> tuple[float, float]:
        completion = e.result.completion_s
        return (-e.result.success_rate, completion if completion == completion else float("inf"))

    return sorted(evals, key=key)


# ---------------------------------------------------------------- robot-rl eval: the configured policies


def paired_comparison(a: PolicyEval, b: PolicyEval) -> PairedComparison:
    """``a`` against ``b`` scene by scene (exact McNemar p, Newcombe interval); both must have run
    on the same scenes, in the same order."""
    return compare_paired([e.success for e in a.result.episodes], [e.success for e in b.result.episodes])


def load_policies(cfg: RobotRLConfig) -> dict[str, Any]:
    """{name: policy} for the configured policy and, if given, ``eval.compare_path`` (the same
    policy type with other weights); the names are where the weights came from."""
    main_name = policy_source(cfg) or type(cfg.policy).__name__
    policies = {main_name: load_policy(cfg)}
    compare = cfg.eval.compare_path
    if compare:
        if not hasattr(cfg.policy, "path"):
            raise ConfigError(f"eval.compare_path: policy={type(cfg.policy).__name__} loads no weights to compare")
        other = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, path=compare))
        policies[compare if compare != main_name else f"{compare} (compare)"] = load_policy(other)
    return policies


def eval_scenes(cfg: RobotRLConfig, robot: Any) -> list[Scene]:
    """``eval.episodes`` seeded scenes from ``seeds.eval`` on (families rotating over
    ``task_families``), or the starting scenes of ``eval.dataset``'s ``eval.episode_indices``."""
    if not cfg.eval.dataset:
        return seed_scenes(cfg.eval.episodes, cfg.seeds.eval, task_families(cfg))
    # A damaged dataset (DatasetError) or joints that do not map (JointMappingError) are ConfigErrors.
    dataset = load_logged_dataset(cfg.eval.dataset, cfg.eval.episode_indices)
    return dataset_scenes(dataset, cfg.eval.mapping, tuple(robot.joint_names))


# ---------------------------------------------------------------- held-out scores of saved weights


def scoring_edge(edge: EdgeConfig) -> EdgeConfig:
    """``edge`` as a score of weights runs it: the policy on this machine, on the virtual clock. A fleet
    served by a policy server (``inference_runner=remote``) acts on the server's chunks, but what is
    scored is the weights, on the same scenes, noise and simulated latency whatever served the fleet."""
    return replace(edge, inference_runner="auto") if edge.inference_runner == "remote" else edge


@dataclass(frozen=True)
class HeldoutJob:
    """What a held-out evaluation needs, as plain data for the child process (JSON, never pickled)."""

    robot: SimConfig
    edge: EdgeConfig
    seeds: list[int]
    families: list[str]
    policy_options: dict[str, Any] = dataclasses.field(default_factory=dict)  # the policy's ``loading_options()``

    @classmethod
    def of(cls, cfg: RobotRLConfig, episodes: int, policy_options: dict[str, Any] | None = None) -> HeldoutJob:
        """``episodes`` scenes no robot of a run sees (``seeds.heldout`` on), families rotating."""
        first = cfg.seed + cfg.seeds.heldout
        return cls(sim_config(cfg), scoring_edge(cfg.edge), [first + i for i in range(episodes)], task_families(cfg),
                   dict(policy_options or {}))

    def to_json(self) -> str:
        return json.dumps({"robot": dataclasses.asdict(self.robot), "edge": dataclasses.asdict(self.edge),
                           "seeds": self.seeds, "families": self.families, "policy_options": self.policy_options})

    @classmethod
    def from_json(cls, text: str) -> HeldoutJob:
        data = json.loads(text)
        return cls(SimConfig(**data["robot"]), EdgeConfig(**data["edge"]), list(data["seeds"]), list(data["families"]),
                   dict(data.get("policy_options") or {}))


def evaluate_weights(weights: Path, job: HeldoutJob, desc: str) -> dict[str, Any]:
    """Success of ``weights`` alone (no operator) on the job's scenes, in this process (virtual time)."""
    policy = load_trainable(weights, **job.policy_options)
    robot = SimSO101(job.robot)
    robot.connect()
    try:
        result = evaluate_policy(robot, policy, job.edge, job.seeds, job.families, desc=desc)
    finally:
        robot.disconnect()
    return {"success": result.success_rate, "ci95": [round(c, 3) for c in result.ci95], "episodes": len(job.seeds),
            "weights": str(weights), "per_episode_success": [bool(e.success) for e in result.episodes],
            "per_episode_family": [e.task_family for e in result.episodes]}


def heldout_eval(weights: Path, cfg: RobotRLConfig, episodes: int, desc: str,
                 timeout_s: float = 1800.0) -> dict | None:
    """``evaluate_weights`` in a child process; None when ``episodes`` is 0 or the child fails
    (logged: a failed evaluation must not cost the results it was to score)."""
    return heldout_eval_all([weights], cfg, episodes, desc, timeout_s)[0]


def heldout_eval_all(weights: list[Path], cfg: RobotRLConfig, episodes: int, desc: str,
                     timeout_s: float = 1800.0, policy_options: dict[str, Any] | None = None) -> list[dict | None]:
    """``heldout_eval`` of several weights, one after the other in one child (one start-up);
    None for each one not scored (``episodes`` 0, a failed child, a missing result).
    ``policy_options``: the saving policy's ``loading_options()`` (a LeRobot policy's camera_map,
    joint_names, tokenizer)."""
    if episodes <= 0 or not weights:
        return [None] * len(weights)
    with tempfile.TemporaryDirectory(prefix="heldout-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(HeldoutJob.of(cfg, episodes, policy_options).to_json())
        command = [sys.executable, "-m", "robot_rl.app.evaluation", str(job_path), desc, *map(str, weights)]
        try:
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=timeout_s * len(weights),
                                  check=False)
        except subprocess.TimeoutExpired:
            log.error("held-out evaluation of %s did not finish within %.0f s each", weights, timeout_s)
            return [None] * len(weights)
    results: dict[str, dict] = {}
    for line in done.stdout.strip().splitlines():
        try:
            result = json.loads(line)
        except ValueError:
            continue  # progress or library output; results are whole JSON lines
        if isinstance(result, dict) and "weights" in result and "error" not in result:
            results[result["weights"]] = result
    if done.returncode != 0:
        log.error("held-out evaluation: %d of %d weights scored (exit code %d); see its output above",
                  len(results), len(weights), done.returncode)
    return [results.get(str(w)) for w in weights]


def paired_scores(result: dict | None, baseline: dict | None) -> dict | None:
    """``result`` against ``baseline`` scene by scene (``compare_paired``); None unless both were
    scored on the same scenes (an older result without per-scene successes included)."""
    mine, theirs = (r.get("per_episode_success") if r else None for r in (result, baseline))
    if not mine or not theirs or len(mine) != len(theirs):
        return None
    return compare_paired(mine, theirs).as_dict()


def successes_by_family(result: dict | None) -> dict[str, list[bool]]:
    """``evaluate_weights``' per-scene successes grouped by the scenes' task family, in the order the
    families first come ({} for a result without per-scene families)."""
    if not result or not result.get("per_episode_family"):
        return {}
    grouped: dict[str, list[bool]] = {}
    for family, success in zip(result["per_episode_family"], result["per_episode_success"], strict=True):
        grouped.setdefault(family, []).append(bool(success))
    return grouped


def family_scores(result: dict | None) -> dict[str, dict]:
    """``evaluate_weights``' result per task family: {family: {success, ci95, scenes}}."""
    scores = {}
    for family, wins in successes_by_family(result).items():
        low, high = wilson_interval(sum(wins), len(wins))
        scores[family] = {"success": sum(wins) / len(wins), "ci95": [round(low, 3), round(high, 3)],
                          "scenes": len(wins)}
    return scores


def paired_by_family(final: dict | None, start: dict | None) -> dict[str, dict]:
    """``final`` against ``start`` per task family on the same held-out scenes: {family: {start, final,
    start_ci, final_ci, n, p}}, ``p`` the exact McNemar test of ``compare_paired`` (as ``paired_scores``
    over all scenes); {} unless both were scored scene by scene on the same scenes."""
    before, after = successes_by_family(start), successes_by_family(final)
    if not before or before.keys() != after.keys() or any(len(before[f]) != len(after[f]) for f in before):
        return {}
    out = {}
    for family, wins in after.items():
        comparison = compare_paired(wins, before[family])
        out[family] = {"start": comparison.b_success, "final": comparison.a_success,
                       "start_ci": list(wilson_interval(sum(before[family]), len(wins))),
                       "final_ci": list(wilson_interval(sum(wins), len(wins))), "n": len(wins),
                       "p": comparison.p_value}
    return out


def format_paired(paired: dict | None, missing: str = "-") -> str:
    """``paired_scores``' result as "+12.5 (p=0.003)": the difference in points and its exact McNemar p."""
    if not paired:
        return missing
    return f"{100 * paired['difference']:+.1f} (p={paired['p_value']:.2g})"


def format_score(result: dict | None, missing: str = "-") -> str:
    """``evaluate_weights``' result as "80% (70%-87%)" (success and its 95 % interval)."""
    if not result:
        return missing
    lo, hi = result["ci95"]
    return f"{result['success']:.0%} ({lo:.0%}-{hi:.0%})"


def main(argv: list[str]) -> int:
    """The child of ``heldout_eval_all``: ``JOB DESC WEIGHTS...``, one JSON line per weights as each is
    scored; ``JOB DESC -`` reads the weights one per line from stdin until it closes (the main job's
    scorer of published versions, ``app.heldout_monitor``, which keeps one child for the whole run)."""
    job_path, desc, *weights = argv
    job = HeldoutJob.from_json(Path(job_path).read_text())
    failed = 0
    for w in (line.strip() for line in sys.stdin) if weights == ["-"] else weights:
        try:
            result = evaluate_weights(Path(w), job, f"{desc} {Path(w).name}")
        except Exception as exc:
            log.exception("held-out evaluation of %s failed", w)
            failed += 1
            result = {"weights": w, "error": f"{type(exc).__name__}: {exc}"}  # an answer for every request
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
