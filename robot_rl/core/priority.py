"""OS scheduling priority: background threads yield, the control loop comes first.

Why: on a machine shared by a robot's control loop and background work (a learner training
next to simulated robots, a weights loader next to the controller, the link hashing a download),
the scheduler should run the control loop the moment its tick is due. A raised nice value costs a
background thread nothing when the CPU is idle and needs no privilege. Nice values alone still
let any runnable thread of normal priority delay a waking tick by a scheduler slice (a few ms)
when every core is busy; a real-time policy (``SCHED_FIFO``, what ros2_control's controller
thread asks for) runs the control thread ahead of all of them. Linux gives each thread its own
nice value and policy. Within one Python process the interpreter lock is the other queue: a thread
that wakes up waits for it until the thread holding it has run ``sys.getswitchinterval()`` (5 ms by
default), so one busy thread of the control process (the link decoding messages, the recorder) made
every tick ~5.2 ms late; at 1 ms, ~1.2 ms (measured with SCHED_FIFO, one pure-Python thread beside).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)
_refused: list[str] = []  # why real-time scheduling was refused, said once per process


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


@contextlib.contextmanager
def realtime_thread(priority: int) -> Iterator[bool]:
    """Run the calling thread under ``SCHED_FIFO`` at ``priority`` (1-99) for the block; yields
    whether it does. Needs root, ``CAP_SYS_NICE`` or an ``rtprio`` limit (``ulimit -r``,
    /etc/security/limits.conf); without it the thread keeps its normal policy and a warning says
    so once. Threads and processes started inside the block get the normal policy
    (``SCHED_RESET_ON_FORK``): a recorder's writer must not run ahead of the tick. The previous
    policy is restored on exit. ``priority`` 0: nothing changes."""
    if priority <= 0 or not hasattr(os, "SCHED_FIFO"):
        yield False
        return
    previous = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except OSError as exc:
        refusal: OSError | None = exc
    else:
        refusal = None
    if refusal is not None:  # outside the handler: an error of the block is not chained to this one
        if not _refused:
            _refused.append(str(refusal))
            log.warning("the control loop runs at normal priority: SCHED_FIFO %d was refused (%s); allow it "
                        "with CAP_SYS_NICE or an rtprio limit of at least %d (ulimit -r), or set "
                        "edge.realtime_priority=0 to silence this", priority, refusal, priority)
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, *previous)


@contextlib.contextmanager
def interpreter_switch_interval(seconds: float) -> Iterator[None]:
    """Make the interpreter hand its lock to a waiting thread after ``seconds`` (``sys.setswitchinterval``;
    interpreter-wide) for the block, then restore the previous interval. 0: leave it as it is."""
    previous = sys.getswitchinterval()
    if seconds <= 0:
        yield
        return
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
