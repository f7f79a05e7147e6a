"""`robot-rl session`: what an operator types to start a robot.

    robot-rl session robot=so101 policy.path=outputs/bc_policy [learner=tcp://host:5555]
    robot-rl session robot=sim_so101 policy.type=hold session.episodes=3

Hydra overrides select the robot, policy, teleop device and session settings. ``learner=``
takes a URL (it is not a config group choice); without it the policy runs locally and
episodes are only recorded. Exit code 3 means the session ended by e-stop.
"""

from __future__ import annotations

import logging
import sys

import yaml
from omegaconf import DictConfig

from robot_rl.config import CONFIG_DIR, load_config

log = logging.getLogger(__name__)

# Groups this command needs beyond the root config's defaults, and their default choice.
SESSION_GROUPS = {"session": "default", "teleop": None}  # teleop default depends on the robot


def split_learner(argv: list[str]) -> tuple[str | None, list[str]]:
    """Pull ``learner=tcp://...`` out of the overrides (Hydra would read it as a group choice)."""
    learner, rest = None, []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "learner" and "://" in value:
            learner = value
        else:
            rest.append(arg)
    return learner, rest


def compose(overrides: list[str]) -> DictConfig:
    """The root config plus the session and teleop groups (added if the root does not list them)."""
    root = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text()) if (CONFIG_DIR / "config.yaml").exists() else {}
    listed = {next(iter(d)) for d in root.get("defaults", []) if isinstance(d, dict)}
    chosen: dict[str, str] = {}
    passed: list[str] = []
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+") in SESSION_GROUPS and key.lstrip("+") not in listed:
            chosen[key.lstrip("+")] = value
        else:
            passed.append(arg)
    robot_choice = next((a.partition("=")[2] for a in overrides if a.partition("=")[0] == "robot"), "sim_so101")
    defaults = dict(SESSION_GROUPS, teleop="scripted" if robot_choice.startswith("sim") else "keyboard")
    for group, default in defaults.items():
        if group not in listed:
            passed.append(f"+{group}={chosen.get(group, default)}")
    return load_config(passed)


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    learner, overrides = split_learner(argv)
    cfg = compose(overrides)
    from robot_rl.session.runner import run_session

    try:
        return run_session(cfg, learner)
    except (ValueError, TimeoutError, ConnectionError, FileNotFoundError) as exc:
        print(f"robot-rl session: {exc}", file=sys.stderr)
        return 2
