"""A benchmark run from the command line: progress lines stamped with the seconds since it began."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Progress = Callable[[str], None]


def timed_run(run: Callable[[Progress], dict[str, Any]]) -> dict[str, Any]:
    """``run(progress)``, printing each progress line as ``[  12 s] message``; the report gets ``duration_s``."""
    started = time.monotonic()
    report = run(lambda message: print(f"[{time.monotonic() - started:5.0f} s] {message}", flush=True))
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report
