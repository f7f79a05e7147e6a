"""What the learner's store holds after a fault (``robot-rl bench faults``): the suite and the
full-disk check both count it, so that a fault that lost, doubled or corrupted a step shows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from robot_rl.bench.transport import CAMERAS
from robot_rl.bridges.zmq.spool import Spool
from robot_rl.learner.config import StoreConfig


def stored_rows(store_root: Path) -> tuple[list[tuple[int, int, int]], int, int]:
    """(robot, episode, tick) of every stored step (dataset and staged), the non-finite rows, and the
    segments a cleanly stopped learner left staged (its dataset writer failed: they are written now)."""
    from robot_rl.learner.store import ReplayStore  # torch and pyarrow: not for the suite's edge processes

    with Spool(store_root / "staging") as staging:
        left_staged = len(staging)
    with ReplayStore(StoreConfig(root=str(store_root), background_commit=False), train_cameras=CAMERAS) as store:
        if not store.index.num_entries:
            return [], 0, left_staged
        states, actions = store.index.states_and_actions()
    finite = np.isfinite(states).all(axis=1) & np.isfinite(actions.reshape(len(actions), -1)).all(axis=1)
    rows = [(int(row[0]), int(row[1]), int(row[2])) for row in np.nan_to_num(states)]
    return rows, int((~finite).sum()), left_staged
