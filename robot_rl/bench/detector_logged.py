"""``robot-rl bench detector bench.episodes_from=DATASET``: the success detector on episodes a robot really ran.

Why: the sim bench's failures are an expert stopped or shaken, easier to tell from a success than a
policy's own near misses, rescued successes and episodes that ran on past their success; a lab's
question is how the detector judges its own robots' episodes. Any LeRobotDataset whose episodes carry
who judged them (``next.success_source``: a learner's store, a robot's own dataset) serves: per task
(``judging.task_of`` its instruction), the episodes an operator or the task judged, in the order they
were stored, are the labelled ones first and the test ones after, as the learner would have met them.
Episodes nobody judged, or only the detector did, have no verdict to be measured against and are left
out (counted). The frames of each episode are decoded whole (LeRobot's reader), then reduced to what
the detector reads.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from robot_rl.core.errors import ConfigError
from robot_rl.core.types import SUCCESS_SOURCES, VerdictSource
from robot_rl.data.reader import iter_episode_arrays
from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import LabelledEpisode, PreparedEpisode, prepare
from robot_rl.learner.judging import task_of

log = logging.getLogger(__name__)

TEACHING_SOURCES = (VerdictSource.operator.value, VerdictSource.task.value)


@dataclass
class LoggedEpisodes:
    """A dataset's judged episodes, prepared for the detector, per task in stored order."""

    by_task: dict[str, list[PreparedEpisode]] = field(default_factory=dict)
    left_out: Counter[str] = field(default_factory=Counter)  # why episodes were not used -> how many


def read_judged(root: str | Path, config: DetectorConfig) -> LoggedEpisodes:
    """Every episode of ``root`` that an operator or the task judged (see the module doc)."""
    root = Path(root)
    if not (root / "meta" / "info.json").exists():
        raise ConfigError(f"bench.episodes_from: {root} is not a LeRobotDataset (no meta/info.json)")
    logged = LoggedEpisodes()

    def unreadable(index: int, path: Path, exc: Exception) -> None:
        log.warning("bench detector: episode %d does not read (%s: %s); left out", index, path, exc)
        logged.left_out["unreadable"] += 1

    for episode in iter_episode_arrays(root, on_unreadable=unreadable):
        if "next.success_source" not in episode:
            raise ConfigError(f"bench.episodes_from: {root} records no next.success_source (who judged each "
                              "episode); only a dataset robot_rl recorded says which verdicts a person gave")
        source = SUCCESS_SOURCES[int(np.asarray(episode["next.success_source"]).reshape(-1)[-1])]
        if source not in TEACHING_SOURCES:
            logged.left_out[f"judged by {source or 'nobody'}"] += 1
            continue
        frames = {cam: episode[f"images.{cam}"] for cam in config.cameras if f"images.{cam}" in episode}
        if len(frames) != len(config.cameras):
            raise ConfigError(f"bench.episodes_from: the detector reads cameras {list(config.cameras)}; {root} "
                              f"records {sorted(k[len('images.'):] for k in episode if k.startswith('images.'))}")
        flags = episode.get("is_intervention")
        labelled = LabelledEpisode(task_of(episode["instruction"]), frames,
                                   bool(np.asarray(episode["next.success"]).reshape(-1)[-1]),
                                   None if flags is None else np.asarray(flags, dtype=bool).reshape(-1))
        logged.by_task.setdefault(labelled.task, []).append(prepare(labelled, config))
    if not logged.by_task:
        raise ConfigError(f"bench.episodes_from: no episode of {root} was judged by an operator or the task "
                          f"({dict(logged.left_out)})")
    return logged


def split(episodes: list[PreparedEpisode], most_labelled: int, task: str) -> tuple[list[PreparedEpisode],
                                                                                  list[PreparedEpisode]]:
    """The first ``most_labelled`` episodes to learn from, the rest to test on."""
    if len(episodes) < most_labelled + 2:
        raise ConfigError(f"bench.episodes_from: task {task!r} has {len(episodes)} judged episodes; bench.labelled "
                          f"up to {most_labelled} leaves fewer than 2 to test on (lower bench.labelled)")
    return episodes[:most_labelled], episodes[most_labelled:]
