"""Reading a Rerun log back with rerun's own RRD reader, for the tests of the live views."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def read_rrd(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Entity path (without the leading /) -> its temporal rows in log order, each a dict of columns."""
    from rerun.experimental import RrdReader

    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for chunk in RrdReader(path).store().stream().to_chunks():
        if not chunk.is_static:
            rows[chunk.entity_path.lstrip("/")].extend(chunk.to_record_batch().to_pylist())
    return rows


def component(row: dict[str, Any], name: str) -> Any:
    """The value of the column whose name ends in ``name`` (e.g. ``Scalars:scalars``)."""
    return next(value for key, value in row.items() if key.endswith(name))
