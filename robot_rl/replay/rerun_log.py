"""Optional Rerun recording of a replay (logged vs sim images and joints on one timeline).

Rerun is not a dependency: without ``rerun-sdk`` installed, ``open_rerun`` says so once
and returns None, and the replay goes on with its MP4 and plots.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


class RerunLogger:
    """Writes a ``.rrd`` file: per step, sim and logged images and both joint vectors."""

    def __init__(self, rr, path: Path) -> None:
        self._rr = rr
        self.path = path

    def step(self, episode: int, t: int, logged: dict[str, np.ndarray], sim: dict[str, np.ndarray],
             logged_state: np.ndarray, sim_state: np.ndarray, joint_names: tuple[str, ...]) -> None:
        rr = self._rr
        if hasattr(rr, "set_time"):  # rerun >= 0.23
            rr.set_time("step", sequence=t)
        else:
            rr.set_time_sequence("step", t)
        for cam, image in logged.items():
            rr.log(f"episode_{episode}/logged/{cam}", rr.Image(image))
        for cam, image in sim.items():
            rr.log(f"episode_{episode}/sim/{cam}", rr.Image(image))
        for j, name in enumerate(joint_names):
            rr.log(f"episode_{episode}/joints/{name}/logged", rr.Scalars(float(logged_state[j]))
                   if hasattr(rr, "Scalars") else rr.Scalar(float(logged_state[j])))
            rr.log(f"episode_{episode}/joints/{name}/sim", rr.Scalars(float(sim_state[j]))
                   if hasattr(rr, "Scalars") else rr.Scalar(float(sim_state[j])))


def open_rerun(path: str | Path, app_id: str = "robot_rl_replay") -> RerunLogger | None:
    """A logger saving to ``path`` if rerun-sdk is installed, else None (with one log line)."""
    try:
        import rerun as rr
    except ImportError:
        log.warning("rerun=true but rerun-sdk is not installed (pip install rerun-sdk); writing MP4s only")
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rr.init(app_id, spawn=False)
    rr.save(str(path))
    return RerunLogger(rr, path)
