"""Child processes that leave a Ctrl-C to their parent."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def ctrl_c_left_to_the_parent() -> Iterator[None]:
    """Processes started inside begin with SIGINT ignored (a Python started with it ignored keeps it so).

    A Ctrl-C at the terminal reaches every process of the group. A child killed by it dies mid-work
    with a traceback on the operator's screen: a robot of the main job mid-episode, its episode half
    streamed; an edge's policy process while the session e-stops the arm. Its parent ends it instead
    (the robot after its episode, the policy process with its session). Ignored from the start, not
    in the child's own code, which runs only after seconds of imports. Only the main thread may
    change a handler; elsewhere the processes start as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ignore_ctrl_c() -> None:
    """Ignore SIGINT from here on in this process: the first thing a pool's worker runs (its initializer).

    A pool may start a worker from any thread, where ``ctrl_c_left_to_the_parent`` cannot change the
    handler. A worker that takes the terminal's Ctrl-C dies mid-read with a traceback and breaks its
    pool; its parent shuts the pool down in its own stop instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
