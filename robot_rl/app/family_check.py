"""Every task family a run is asked to learn needs demonstrations and held-out scenes: checked
before anything trains.

Why: a family the demonstrations lack is one the start never learnt and the learner's
demonstration stream never shows, so the run would spend its time on the families it has and
report the missing one at 0 %; a family without held-out scenes gets no start -> final figure, so
nobody would see whether it learnt. Either is refused in one line that names the family and the fix,
before a BC start is trained or a robot starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from robot_rl.core.errors import ConfigError
from robot_rl.data.reader import recorded_tasks
from robot_rl.learner.family_balance import family_of

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


class MissingFamilyError(ConfigError):
    """A family in ``task_families`` has no demonstrations or no held-out scenes."""


def demonstrations_dir(cfg: RobotRLConfig) -> Path:
    """The demonstrations the run learns from: ``learner.store.demonstrations``, else ``demos.dir``
    (the BC start's data, recorded there for ``task_families`` when missing)."""
    return Path(cfg.learner.store.demonstrations or cfg.demos.dir)


def check_task_families(cfg: RobotRLConfig, families: Sequence[str]) -> None:
    """Refuse (``MissingFamilyError``, one line) a family of ``families`` that the recorded
    demonstrations lack, or that the held-out scenes (``run.eval_episodes``, ``run.heldout_scenes``:
    the families rotate over them) would leave out."""
    demos = demonstrations_dir(cfg)
    tasks = recorded_tasks(demos)
    if tasks:  # none recorded yet: they will be, for every family of task_families
        held = sorted({family_of(task) for task in tasks})
        missing = [family for family in families if family not in held]
        if missing:
            wanted = ",".join(families)
            raise MissingFamilyError(
                f"task_families: no demonstrations of {', '.join(missing)} in {demos} (it holds {', '.join(held)}); "
                f"record them with `robot-rl record-demos 'task_families=[{wanted}]' demos.dir=NEW_DIR`, train the "
                f"start on them with `robot-rl train-bc` (same overrides), or leave {', '.join(missing)} out of "
                "task_families")
    for setting, scenes in (("run.eval_episodes", cfg.run.eval_episodes),
                            ("run.heldout_scenes", cfg.run.heldout_scenes)):
        if 0 < scenes < len(families):
            unscored = families[scenes:]
            raise MissingFamilyError(
                f"task_families: {', '.join(unscored)} would get no held-out scene: {setting}={scenes} rotates over "
                f"{len(families)} families; set {setting} to a multiple of {len(families)} (one per family at least)")
