"""`robot-rl train-bc`: behaviour-clone the policy (``robot_rl.app.behaviour_cloning``)."""

from __future__ import annotations

from robot_rl.config import load_config

HELP = """behaviour-clone the policy from scripted-expert demonstrations (recorded first if demos.dir
holds none), with state-offset augmentation; saves the checkpoint to bc.checkpoint_dir (for a LeRobot
policy a LeRobot checkpoint) and scores it closed-loop in the sim. policy=lerobot trains a new
LeRobot policy of policy.type (its config fields in policy.options), or fine-tunes policy.path.

  robot-rl train-bc
  robot-rl train-bc bc.steps=8000 policy.model.image_size=96 bc.checkpoint_dir=outputs/bc96
  robot-rl train-bc policy=lerobot policy.type=act '+policy.options={chunk_size: 20, n_action_steps: 20}' \
      bc.checkpoint_dir=outputs/bc_act"""
GROUPS = ("robot", "policy", "edge", "demos", "bc", "seeds", "task_families")


def main(argv: list[str]) -> int:
    # imported when the command runs, so that `robot-rl train-bc --help` answers without torch and MuJoCo
    from robot_rl.app.behaviour_cloning import train_bc

    result = train_bc(load_config(argv))
    print(
        f"BC checkpoint: {result['checkpoint']}  success {result['success']:.0%} "
        f"(95% CI {result['ci95'][0]:.0%}-{result['ci95'][1]:.0%}) over {result['eval_episodes']} episodes"
    )
    return 0
