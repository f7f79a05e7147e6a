"""A local policy checkpoint's files read as files, without PyTorch: ``check_checkpoint_files``.

Each JSON file is parsed and each safetensors file's header is read against the file's size, and
the first that fails is one ``CorruptFileError`` naming it. LeRobot itself reports a garbled
config.json as a decoding traceback naming no file, and a truncated model.safetensors as a Rust
error from deep inside ``from_pretrained``. Needing neither torch nor LeRobot, the check also runs
before a learner's or an edge's slow imports (~10 s on a robot PC), so a damaged checkpoint is
one line a second after the command.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from robot_rl.core.errors import CorruptFileError

# What to do about a damaged checkpoint, whichever setting (policy.path, learner.init_checkpoint) led to it.
RESTORE = "the checkpoint is corrupt: save or download it again, or point to another checkpoint"


def check_checkpoint_files(directory: str | Path) -> None:
    """``CorruptFileError`` for the first JSON or safetensors file of ``directory`` that does not read."""
    directory = Path(directory)
    for path in sorted(directory.glob("*.json")):
        try:
            json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptFileError(path, f"not valid JSON ({exc})", RESTORE) from exc
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(path), "numpy"):
                pass
        except (SafetensorError, OSError) as exc:
            raise CorruptFileError(path, f"not a readable safetensors file ({exc})", RESTORE) from exc
