"""`robot-rl session`: what an operator types to start a robot."""

from __future__ import annotations

import sys

HELP = """\
an operator session on one robot, real or simulated.

The policy drives; the operator takes over and hands back with the teleop device, gives each
episode a verdict (keys shown on screen) and can e-stop (exit code 3). Every episode is recorded
locally (LeRobotDataset v3 in session.dataset_root); with link.learner set it is also streamed to
that learner, whose new weights are swapped in between chunks. A real robot runs only the
checkpoint named by policy.path (or policy=hold, a dry run that keeps the arm still).

examples:
  robot-rl session robot=so101 teleop=leader policy.path=outputs/bc_policy session.episodes=20
  robot-rl session robot=sim_so101 policy=hold teleop=scripted link.learner=tcp://127.0.0.1:5555
"""

# The root config groups this command reads.
GROUPS: tuple[str, ...] = ("robot", "policy", "teleop", "edge", "link", "session")


def main(argv: list[str]) -> int:
    """``argv``: configuration overrides only."""
    from robot_rl.config import load_config
    from robot_rl.session.runner import run_session

    cfg = load_config(argv)
    try:
        return run_session(cfg)
    except (ValueError, TimeoutError, ConnectionError, FileNotFoundError) as exc:
        # A robot or device that is not there, or refuses: one line, no traceback.
        print(f"robot-rl session: {exc}", file=sys.stderr)
        return 2
