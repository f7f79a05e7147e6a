"""`robot-rl run`: the main job (``robot_rl.app.main_job``)."""

from __future__ import annotations

from robot_rl.config import load_config

HELP = """the main job on its embedded default: a learner and two simulated SO-101 edge nodes on
loopback, a scripted operator who takes over when the policy goes wrong, the learner fine-tuning the
behaviour-cloned start (learner=hgdagger) and hot-swapping its weights into the robots; while it runs
each newest version is scored alone on unseen scenes, and at the end the start and the final weights.

Where to look: the fleet console's address is printed at the start (learner.console; its controls
need learner.console.token_file); viewer=rerun shows every robot in Rerun (viewer.mode=save writes
OUTPUT_DIR/rerun/*.rrd); TensorBoard: tensorboard --logdir OUTPUT_DIR/run; at the end
OUTPUT_DIR/run/TIME/learning_curve.png and summary.json (docs/live_views.md).

  robot-rl run
  robot-rl run learner=rwr run.episodes=50 run.num_robots=4 output_dir=/tmp/run
  robot-rl run viewer=rerun learner.console.token_file=keys/console.token
  robot-rl run learner=rwr run.verdicts=detector   # judged as unattended arms are (docs/success_detector.md)

Ctrl-C: each robot ends the episode it is in, the learner writes the episodes and its checkpoint (no
training on after the robots), and the summary follows (no held-out check); Ctrl-C again stops at once."""
GROUPS = ("robot", "viewer", "policy", "learner", "edge", "run", "demos", "bc", "seeds", "task_families")


def main(argv: list[str]) -> int:
    # imported when the command runs, so that `robot-rl run --help` answers without torch, MuJoCo and LeRobot
    from robot_rl.app.main_job import run_main_job

    run_main_job(load_config(argv))  # prints its summary, ending with where the curve and the JSON are
    return 0
