"""What the operator sees: the key bindings once, then one live status line.

On a terminal the line is redrawn in place (carriage return); when output goes to a
file or a pipe a full line is printed at most every few seconds, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

KEY_HELP = (
    "keys: [space] take over / hand back   [s] success   [f] failure   [r] rerecord   "
    "[e] E-STOP (Ctrl-C too)   [n] next (skip reset wait)   [q] quit after this episode"
)

# key -> session command
KEY_COMMANDS = {
    "space": "toggle",
    "s": "success",
    "f": "failure",
    "r": "rerecord",
    "e": "estop",
    "esc": "estop",
    "n": "next",
    "enter": "next",
    "q": "quit",
}


class StatusLine:
    def __init__(self, stream: TextIO | None = None, interval_s: float = 0.25, log_interval_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.interval_s = interval_s if self.live else log_interval_s
        self._last = -1e9

    def show(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        if self.live:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        """A message on its own line (the live line is redrawn after it)."""
        self.stream.write(("\r\x1b[2K" if self.live else "") + text + "\n")
        self.stream.flush()


def format_status(
    episode: int,
    episodes: int,
    successes: int,
    tick: int,
    hz: float,
    inference_ms: float | None,
    delay_ticks: int,
    policy_version: int,
    intervening: bool,
) -> str:
    inference = f"{inference_ms:6.1f} ms" if inference_ms is not None else "   -   "
    flag = "  INTERVENING" if intervening else ""
    return (
        f"ep {episode + 1}/{episodes}  ok {successes}  t {tick:4d}  {hz:5.1f} Hz  "
        f"infer {inference}  delay {delay_ticks} ticks  policy v{policy_version}{flag}"
    )
