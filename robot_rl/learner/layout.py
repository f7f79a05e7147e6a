"""What the learner's store records per step, and where that comes from.

Nobody has to tell ``robot-rl learner`` about robots: each edge says in its hello what it
records (control rate, joint names, cameras and their image sizes), the first robot's
layout is adopted and kept in ``STORE_ROOT/layout.json``, and every later robot must match
it, whatever its kind (an SO-101 through LeRobot, a ROS 2 arm, the sim). Settings given in
``learner.store`` pin a field instead. The policy decides which cameras are trained on: they
must be among the recorded ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from robot_rl.core.errors import CorruptFileError
from robot_rl.core.layout import RecordedLayout
from robot_rl.learner.config import StoreConfig

__all__ = ["RecordedLayout", "differences", "mismatch", "pinned_layout", "read_layout", "write_layout"]

LAYOUT_FILE = "layout.json"


def pinned_layout(config: StoreConfig) -> RecordedLayout | None:
    """The layout ``learner.store`` fixes completely (every field set), else None."""
    if None in (config.fps, config.joint_names, config.cameras, config.image_height, config.image_width):
        return None
    assert config.cameras is not None and config.joint_names is not None
    assert config.fps is not None and config.image_height is not None and config.image_width is not None
    return RecordedLayout(config.fps, tuple(config.joint_names),
                          {c: (config.image_height, config.image_width) for c in config.cameras})


def differences(config: StoreConfig, layout: RecordedLayout) -> list[str]:
    """The fields ``learner.store`` pins that ``layout`` does not match."""
    found = []
    if config.fps is not None and config.fps != layout.fps:
        found.append(f"fps {layout.fps} (the learner stores {config.fps})")
    if config.joint_names is not None and tuple(config.joint_names) != layout.joint_names:
        found.append(f"joints {list(layout.joint_names)} (the learner stores {list(config.joint_names)})")
    if config.cameras is not None and tuple(config.cameras) != layout.cameras:
        found.append(f"cameras {list(layout.cameras)} (the learner stores {list(config.cameras)})")
    sizes = {(h, w) for h, w in layout.camera_shapes.values()}
    for name, value, index in (("image_height", config.image_height, 0), ("image_width", config.image_width, 1)):
        if value is not None and any(size[index] != value for size in sizes):
            found.append(f"{name} {sorted(s[index] for s in sizes)} (the learner stores {value})")
    return found


def mismatch(stored: RecordedLayout, offered: RecordedLayout) -> str | None:
    """One line saying how a robot's layout differs from the store's, or None when it matches."""
    if offered == stored:
        return None
    parts = []
    if offered.fps != stored.fps:
        parts.append(f"{offered.fps} fps, the store records {stored.fps}")
    if offered.joint_names != stored.joint_names:
        parts.append(f"joints {list(offered.joint_names)}, the store records {list(stored.joint_names)}")
    if offered.camera_shapes != stored.camera_shapes:
        parts.append(f"cameras {offered.cameras_text()}, the store records {stored.cameras_text()}")
    return "; ".join(parts)


def read_layout(root: str | Path) -> RecordedLayout | None:
    path = Path(root) / LAYOUT_FILE
    if not path.exists():
        return None
    try:
        return RecordedLayout.from_document(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise CorruptFileError(path, f"unreadable ({exc})", "it says what the store records: restore it, or "
                               "start a new store (another learner.store.root)") from exc


def write_layout(root: str | Path, layout: RecordedLayout) -> None:
    """Atomically (write, fsync, rename): a store's layout is never half-written."""
    path = Path(root) / LAYOUT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as out:
        json.dump(layout.to_document(), out)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
