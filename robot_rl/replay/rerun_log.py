"""The Rerun view of a replay (``robot-rl replay viewer=rerun``): logged and simulated cameras and
joints of every episode on one ``step`` timeline, with the edge's entity names
(``robot_rl.edge.rerun_view``) under ``episode_K/logged`` and ``episode_K/sim``, so a replay and
a live robot read alike. A replay runs no control loop, so it logs on its own thread."""

from __future__ import annotations

from typing import Any

import numpy as np

from robot_rl.edge.rerun_view import import_rerun, open_recording
from robot_rl.edge.viewer_config import RerunViewerConfig


class ReplayView:
    """Per replayed step: both camera sets and both joint vectors."""

    def __init__(self, config: RerunViewerConfig, joint_names: tuple[str, ...]) -> None:
        self._rr = import_rerun()
        self._recording = open_recording(config, "replay")
        self._joint_names = list(joint_names)
        self._compress = config.compress_images
        self._episodes: set[int] = set()

    def step(self, episode: int, t: int, logged: dict[str, np.ndarray], sim: dict[str, np.ndarray],
             logged_state: np.ndarray, sim_state: np.ndarray) -> None:
        rr, rec = self._rr, self._recording
        if episode not in self._episodes:
            self._episodes.add(episode)
            for source in ("logged", "sim"):
                rec.log(f"episode_{episode}/{source}/observation.state", rr.SeriesLines(names=self._joint_names),
                        static=True)
        rec.set_time("step", sequence=t)
        for source, images, state in (("logged", logged, logged_state), ("sim", sim, sim_state)):
            for camera, image in images.items():
                frame = rr.Image(np.asarray(image))
                rec.log(f"episode_{episode}/{source}/observation.images.{camera}",
                        frame.compress() if self._compress else frame)
            rec.log(f"episode_{episode}/{source}/observation.state", rr.Scalars(np.asarray(state, np.float64)))

    def close(self) -> None:
        self._recording.flush()
        self._recording.disconnect()


def open_replay_view(viewer: Any, joint_names: tuple[str, ...]) -> ReplayView | None:
    """The replay's view for ``viewer=`` (None: ``viewer=none``)."""
    return ReplayView(viewer, joint_names) if isinstance(viewer, RerunViewerConfig) else None
