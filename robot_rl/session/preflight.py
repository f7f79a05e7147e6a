"""The files a session or an edge reads at start, checked before it imports PyTorch and LeRobot.

The session's own dataset and the checkpoint its policy loads: a damaged one is the same one line
naming it (``CorruptFileError``) about a second after ``robot-rl session`` or ``robot-rl edge``,
not after the ~10 s of imports the runtime brings and the robot's connection. The recorder and the
policy loaders check again when they open the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from robot_rl.app.policies import policy_source
from robot_rl.data.validation import check_dataset
from robot_rl.policies.checkpoint_files import check_checkpoint_files

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


def check_session_files(cfg: RobotRLConfig) -> None:
    """``CorruptFileError`` for the first damaged file of ``session.dataset_root`` or of the local
    checkpoint the policy loads (none is loaded here when a policy server computes the chunks)."""
    check_dataset(cfg.session.dataset_root)
    if cfg.edge.inference_runner == "remote":
        return
    source = policy_source(cfg)
    if source is not None and Path(source).is_dir():  # else a Hub id: LeRobot downloads and checks it
        check_checkpoint_files(source)
