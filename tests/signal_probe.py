"""A spawned child's report of how it would take a Ctrl-C; a module of its own so that the child
imports nothing else (a test module's imports take seconds)."""

from __future__ import annotations

import signal
from typing import Any


def report_sigint_handler(answer: Any) -> None:
    answer.put(str(signal.getsignal(signal.SIGINT)))
