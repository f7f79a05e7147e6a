"""CPU time of benchmark processes (psutil): what a machine's cores spent, beside the wall clock."""

from __future__ import annotations

import psutil


def process_cpu_seconds(pid: int | None = None, *, children: bool = False) -> float:
    """User and system CPU time of process ``pid`` (None: this one) so far, every thread; with
    ``children``, also that of its children that have exited. 0 for a process that is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    spent = times.user + times.system
    return spent + times.children_user + times.children_system if children else spent
