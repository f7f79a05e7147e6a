"""OS scheduling priority of background threads (Linux gives each thread its own nice value).

Why: on a machine shared by a robot's control loop and background work (a learner training
next to simulated robots, a weights loader next to the controller), the scheduler should run
the real-time threads first. A raised nice value costs the background thread nothing when the
CPU is idle and no privilege is needed to raise it.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)


def lower_thread_priority(thread: threading.Thread, nice: int) -> bool:
    """Raise ``thread``'s nice value by ``nice`` (max 19). Returns False where this is not supported."""
    tid = thread.native_id
    if nice <= 0 or tid is None or not hasattr(os, "setpriority"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        return True
    except OSError as exc:
        log.debug("could not lower the priority of thread %s: %s", thread.name, exc)
        return False


def lower_own_priority(nice: int) -> bool:
    """``lower_thread_priority`` for the calling thread. Call it first thing in the thread: the
    worker threads it starts later (PyTorch's intra-op pool) inherit its nice value."""
    return lower_thread_priority(threading.current_thread(), nice)
