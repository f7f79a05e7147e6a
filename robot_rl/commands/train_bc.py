"""`robot-rl train-bc`: behaviour-clone the flow VLA from scripted-expert demonstrations.

Records the demonstrations first when ``demos.dir`` holds none, trains with
state-offset augmentation, saves a Hugging Face-layout checkpoint, then evaluates
it closed-loop in the sim through the EdgeNode and prints the success rate.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig

from robot_rl.config import load_config, to_dataclass

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    cfg = load_config(argv)
    result = train_bc(cfg)
    print(
        f"BC checkpoint: {result['checkpoint']}  success {result['success']:.0%} "
        f"(95% CI {result['ci95'][0]:.0%}-{result['ci95'][1]:.0%}) over {result['eval_episodes']} episodes"
    )
    return 0


def ensure_demos(cfg: DictConfig) -> Path:
    """Return the demonstration dataset directory, recording it first if it is missing."""
    from robot_rl.commands.record_demos import record_demos

    demos = Path(cfg.demos.dir)
    if (demos / "meta" / "info.json").exists():
        return demos
    log.info("no demonstrations in %s: recording them with the scripted expert", demos)
    record_demos(cfg)
    return demos


def train_bc(cfg: DictConfig, progress: bool = True) -> dict:
    from robot_rl.policies.flow_vla import FlowVLA, FlowVLAConfig
    from robot_rl.policies.flow_vla.training import fit
    from robot_rl.hardware.sim import TASK_FAMILIES
    from robot_rl.commands.sim_setup import make_sim, task_families
    from robot_rl.data import load_episode_arrays
    from robot_rl.edge import EdgeConfig
    from robot_rl.evaluation import evaluate_policy

    demos = ensure_demos(cfg)
    episodes = load_episode_arrays(demos)
    log.info("training on %d demonstrations (%d steps)", len(episodes), sum(len(e["action"]) for e in episodes))
    policy = FlowVLA(to_dataclass(cfg.policy.model, FlowVLAConfig))
    started = time.monotonic()
    stats = fit(
        policy, episodes, steps=int(cfg.bc.steps), batch_size=int(cfg.bc.batch_size), lr=float(cfg.bc.lr),
        seed=int(cfg.seed), progress=progress,
    )
    checkpoint = Path(cfg.bc.checkpoint_dir)
    policy.save_pretrained(checkpoint)
    log.info("trained %d steps in %.0f s (loss %.4f -> %.4f); saved %s", stats["steps"],
             time.monotonic() - started, stats["initial_loss"], stats["final_loss"], checkpoint)
    robot = make_sim(cfg)
    try:
        n = int(cfg.bc.eval_episodes)
        evaluation = evaluate_policy(
            robot, policy.cpu(), to_dataclass(cfg.edge, EdgeConfig),
            seeds=[1_000_000 + i for i in range(n)], families=task_families(cfg.demos.families, TASK_FAMILIES),
            desc="evaluating BC policy", progress=progress,
        )
    finally:
        robot.disconnect()
    return {"checkpoint": str(checkpoint), "eval_episodes": n, "train": stats, **evaluation.as_dict()}
