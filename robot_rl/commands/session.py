"""`robot-rl session`: what an operator types to start a robot."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

HELP = """\
an operator session on one robot, real or simulated.

The policy drives; the operator takes over and hands back with the teleop device (keyboard jog
keys are shown on screen), gives each episode a verdict and can e-stop (exit code 3); r rerecords
the episode in the same scene. Every episode is recorded locally (LeRobotDataset v3 in
session.dataset_root, a line per episode in session.log_path; an episode cut by a crash is stored
there as truncated at the next start); with link.learner set it is also
streamed to that learner while it runs (a rerecorded attempt reaches it as a truncated episode,
with no outcome), the learner acks it, and the weights it publishes are swapped in between
chunks (the status line shows the version). With the learner away, episodes wait in the spool
and are sent when it is back. A real robot runs only the checkpoint named by policy.path (or
policy=hold, a dry run that keeps the arm still); every joint target is bounded by
robot.max_joint_velocity. A driver that falls silent stops the session (exit code 4), the
episode saved as aborted. viewer=rerun shows the cameras, the measured and commanded joints, the
plan being executed and the next one, takeovers and weight versions live in Rerun
(viewer.mode=spawn|connect|serve|save; save writes OUTPUT_DIR/rerun/ROBOT.rrd).

examples:
  robot-rl session robot=so101 teleop=leader policy.path=outputs/bc_policy session.episodes=20
  robot-rl session robot=sim_so101 teleop=keyboard link.learner=tcp://127.0.0.1:5555
  robot-rl session robot=sim_so101 viewer=rerun
"""

# The root config groups this command reads.
GROUPS: tuple[str, ...] = ("robot", "viewer", "policy", "teleop", "edge", "link", "session")


def run_reporting_faults(command: str, cfg: RobotRLConfig) -> int:
    """``run_session(cfg)``; a robot, device or learner that is not there or refuses is one line
    on stderr and exit code 2, never a traceback."""
    # Imported when the command runs: the CLI reads every command's HELP and GROUPS without them.
    from robot_rl.app.preflight import check_session_files

    check_session_files(cfg)  # before the imports below, which take seconds

    from robot_rl.bridges.zmq.spool import SpoolError
    from robot_rl.core.robot_io import RobotFaultError
    from robot_rl.session.runner import run_session

    try:
        return run_session(cfg)
    except (ValueError, TimeoutError, ConnectionError, FileNotFoundError, RobotFaultError, SpoolError) as exc:
        print(f"robot-rl {command}: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str]) -> int:
    """``argv``: configuration overrides only."""
    from robot_rl.config import load_config  # when the command runs, as above

    return run_reporting_faults("session", load_config(argv))
