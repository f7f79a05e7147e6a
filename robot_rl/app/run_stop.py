"""Ctrl-C (or SIGTERM) during the main job: a clean early end instead of a wall of tracebacks.

While the robots run, a robot cut mid-episode leaves that episode half streamed, and the learner
cut mid-write leaves the dataset behind its robots. So the first signal only asks: each robot ends
the episode it is in and starts no other, the learner writes their episodes and its checkpoint
(training on after the robots, ``run.min_updates``, stops too), and the summary says what the run
did (without the held-out check of the final weights, minutes of simulation the operator just
declined). A second Ctrl-C stops at once, as in any program; so does one during the held-out check
or the summary.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

STOPPING = ("robot-rl run: stopping early: each robot ends the episode it is in, the learner writes the episodes "
            "and its checkpoint (no training on after the robots), and the summary follows (no held-out check); "
            "Ctrl-C again stops at once")


class RunStop:
    """The run's stop request (``requested``), set by SIGINT or SIGTERM while the robots run."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._previous: dict[int, Any] = {}

    def install(self) -> RunStop:
        """As the robots start; only the main thread may handle signals (elsewhere this does nothing, and
        the request is only ever set by the caller)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def robots_done(self) -> None:
        """Back to the signals' earlier handlers: nothing is left that a request could end cleanly."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested.is_set():
            raise KeyboardInterrupt
        self.requested.set()
        print(STOPPING, file=sys.stderr, flush=True)
