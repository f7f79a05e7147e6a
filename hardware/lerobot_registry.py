"""Find LeRobot robot, teleoperator and camera config classes by their registry names.

LeRobot registers a config class (``so101_follower``, ``koch_leader``, ``opencv`` ...)
only when its module is imported, and the module name is not always the type name
(``so101_follower`` lives in ``robots.so_follower``). This imports the likely module,
then asks LeRobot's own draccus registry, so any installed LeRobot device is reachable
by name without a table of our own to keep in sync.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

# LeRobot packages whose module name differs from the registered type name.
_ALIASES = {
    "so100_follower": "so_follower",
    "so101_follower": "so_follower",
    "bi_so100_follower": "bi_so_follower",
    "so100_leader": "so_leader",
    "so101_leader": "so_leader",
    "intelrealsense": "realsense",
    "keyboard_ee": "keyboard",
    "keyboard_rover": "keyboard",
}


def _candidate_modules(package: str, type_name: str) -> list[str]:
    names = [_ALIASES.get(type_name, type_name), type_name, re.sub(r"\d+", "", type_name)]
    return [f"lerobot.{package}.{name}" for name in dict.fromkeys(names)]


def config_class(package: str, base: Any, type_name: str) -> type:
    """The LeRobot config class registered as ``type_name`` under ``base`` (RobotConfig, ...)."""
    for module in _candidate_modules(package, type_name):
        try:
            importlib.import_module(module)
            break
        except ImportError:
            continue
    try:
        return base.get_choice_class(type_name)
    except KeyError as exc:
        known = sorted(base.get_known_choices())
        raise ValueError(
            f"LeRobot has no {package[:-1]} type {type_name!r} (is its extra installed?); "
            f"registered so far: {known}"
        ) from exc
