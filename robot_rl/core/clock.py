"""Clocks: the only source of time for the edge runtime and the sim.

A robot runs on the wall clock. The simulator and the tests run on a virtual clock
that advances only when asked, so timing behaviour (ticks, inference latency,
stalls) is exact, deterministic and as fast as the CPU allows.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Monotonic time in seconds plus a way to wait until a given time."""

    is_virtual: bool

    def now(self) -> float: ...

    def sleep_until(self, t: float) -> None: ...


class WallClock:
    """Monotonic wall clock for real robots and real-time simulation."""

    is_virtual = False

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def sleep_until(self, t: float) -> None:
        # Sleep in one go, then spin the last half millisecond: time.sleep can
        # overshoot by a scheduler quantum, which would make 30 Hz ticks late.
        remaining = t - self.now()
        if remaining > 0.0015:
            time.sleep(remaining - 0.0005)
        while self.now() < t:
            pass


class VirtualClock:
    """Deterministic clock: time moves only through ``sleep_until`` / ``advance``."""

    is_virtual = True

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._t

    def sleep_until(self, t: float) -> None:
        with self._lock:
            if t > self._t:
                self._t = float(t)

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError(f"cannot move a clock backwards (dt={dt})")
        with self._lock:
            self._t += float(dt)
