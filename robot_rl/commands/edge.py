"""`robot-rl edge`: one unattended robot streaming to a learner."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

HELP = """\
one unattended edge node: the robot of robot= (the sim, a LeRobot robot, a ROS 2 arm) runs
session.episodes episodes of session.max_episode_steps ticks with no operator, streams each
episode to link.learner while it runs (spooled on disk, acked: a crash loses at most one segment),
records it locally when it ends (journaled on disk while it runs: after a crash, the next start
stores the cut episode as truncated), and swaps in the weights published on link.weights (default: the
learner's port + 1). The same edge runtime as `robot-rl session` and `robot-rl run`'s robots,
without teleop or keys: the task (sim), the learner's success detector when it is sure of a
success (session.end_on_detected_success), or time ends each episode.
Any policy a session runs: policy.path=DIR (a FlowVLA checkpoint, or a LeRobot one, recognised by
its config.json), policy=lerobot with policy.lora_rank=R, or policy=hold: a dry run of the robot,
cameras and recorder with the arm held still, link settings checked, nothing streamed, no weights
fetched. Whether the learner trains the same model is its hello's check (the config hash).
A real robot runs only policy.path or policy=hold.
Off loopback the link needs CURVE keys from `robot-rl keys`: link.secret_key and link.learner_key.

examples:
  robot-rl edge link.learner=tcp://127.0.0.1:5555 session.episodes=5 session.realtime=false
  robot-rl edge policy=hold link.learner=tcp://127.0.0.1:5555 session.episodes=1 session.realtime=false
  robot-rl edge robot=so101 policy.path=outputs/bc_policy link.learner=tcp://learner.lab:5555 \\
      link.secret_key=keys/robots/follower.key_secret link.learner_key=keys/learner.key
"""

# The root config groups this command reads.
GROUPS: tuple[str, ...] = ("robot", "viewer", "policy", "edge", "link", "session")


def main(argv: list[str]) -> int:
    """``argv``: configuration overrides only."""
    # Imported when the command runs: the CLI reads every command's HELP and GROUPS without them
    # (the edge runtime brings PyTorch, LeRobot's dataset writer and the robot drivers).
    from robot_rl.commands.session import run_reporting_faults
    from robot_rl.config import ConfigError, load_config

    cfg = load_config(argv)
    if cfg.link.learner is None:
        raise ConfigError("say where the learner is: robot-rl edge link.learner=tcp://HOST:5555")
    return run_reporting_faults("edge", unattended(cfg))


def unattended(cfg: RobotRLConfig) -> RobotRLConfig:
    """``cfg`` for ``robot-rl edge``: no teleop device, no keys, verdicts from the task or the detector."""
    from robot_rl.hardware.teleop.base import NoTeleopConfig

    session = dataclasses.replace(cfg.session, keys="none", key_script=[], ask_outcome=False)
    return dataclasses.replace(cfg, teleop=NoTeleopConfig(), session=session)
