"""The ``latest`` pointer of a trainer's checkpoint directory: the complete checkpoint ``--resume`` reads.

Apart from ``checkpoint.py`` because it needs no PyTorch: a learner reads it before its slow imports
(``robot_rl.app.preflight``), so a garbled pointer is one line a second after ``--resume``.
"""

from __future__ import annotations

from pathlib import Path

from robot_rl.core.errors import CorruptFileError

LATEST = "latest"
STATE_JSON = "trainer.json"  # step, version and optimiser scalars: every complete checkpoint holds one


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None if there is none."""
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    try:
        path = Path(root) / pointer.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError as exc:
        raise CorruptFileError(pointer, f"not the name of a checkpoint ({exc})",
                               f"write the name of one of {sorted(p.name for p in Path(root).glob('step-*'))} "
                               "into it") from exc
    if not (path / STATE_JSON).is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is incomplete or missing; "
                                f"point it at one of {sorted(p.name for p in Path(root).glob('step-*'))}")
    return path
