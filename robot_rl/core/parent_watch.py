"""A child process that ends when the process that started it dies.

Why: a learner or edge killed with SIGKILL cannot tell its children to stop. A dataset writer left
running would keep appending to a dataset the restarted learner is opening (two writers, one
dataset); a policy process would keep its GPU memory. Linux's PR_SET_PDEATHSIG fires when the
creating *thread* exits, not the process, and these children are started from worker threads,
so the child watches its parent id instead: when the parent dies, the child is re-parented and
``os.getppid()`` changes.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

POLL_S = 0.5  # how long an orphan may outlive its parent


def exit_when_parent_dies(what: str, poll_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that ends this process (``os._exit``, nothing flushed or finalized:
    whatever was half done is rolled back by whoever opens the files next) once its parent is gone."""
    parent = os.getppid()

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if os.getppid() != parent:
                log.error("%s: the process that started it (%d) is gone; exiting", what, parent)
                os._exit(3)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread
