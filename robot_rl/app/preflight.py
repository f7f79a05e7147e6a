"""The files a command reads at start, checked before it imports PyTorch and LeRobot.

Those imports take ~10 s on a robot lab's PC. A damaged store, a garbled ``--resume`` pointer, a
truncated checkpoint or a damaged session dataset found only after them costs an operator that wait
on every retry; checked here first, each is the same one line naming the file (``CorruptFileError``)
about a second after ``robot-rl learner``, ``session`` or ``edge``. The store, the recorder and the
policy loaders check again when they open the files (they are also used without these), so
nothing here is the only guard.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from robot_rl.app.policies import learner_policy_config, policy_source
from robot_rl.data.validation import check_dataset
from robot_rl.learner.checkpoint_pointer import latest_checkpoint
from robot_rl.learner.layout import read_layout
from robot_rl.policies.checkpoint_files import check_checkpoint_files

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


def check_learner_files(config: RobotRLConfig, *, resume: bool) -> None:
    """``CorruptFileError`` for the first damaged file among those the learner reads at start: the
    store's layout and dataset, the demonstrations, the checkpoint pointer (with ``resume``) and the
    checkpoint the policy starts from."""
    store = config.learner.store
    read_layout(store.root)
    check_dataset(store.dataset_root)
    if store.demonstrations:
        check_dataset(store.demonstrations)
    if resume:
        latest_checkpoint(config.learner.trainer.checkpoint_dir)
    start = learner_policy_config(config).path
    if start and Path(start).is_dir():  # else a Hub id: LeRobot downloads and checks it
        check_checkpoint_files(start)


def check_session_files(cfg: RobotRLConfig) -> None:
    """``CorruptFileError`` for the first damaged file of ``session.dataset_root`` or of the local
    checkpoint the policy loads (none is loaded here when a policy server computes the chunks)."""
    check_dataset(cfg.session.dataset_root)
    if cfg.edge.inference_runner == "remote":
        return
    source = policy_source(cfg)
    if source is not None and Path(source).is_dir():  # else a Hub id: LeRobot downloads and checks it
        check_checkpoint_files(source)
