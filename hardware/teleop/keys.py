"""Key presses without a display: a terminal in cbreak mode, or a script for automatic runs.

Robot PCs are often reached over SSH, with no X server, so pynput-style global key
capture is not available. The session reads the controlling terminal instead, one key at
a time (cbreak mode: no Enter needed, Ctrl-C still interrupts), polled without blocking
once per control tick. ``ScriptedKeys`` replays keys at given (episode, tick) moments so
a session can run unattended (tests, demos) through exactly the same code path.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import termios
import tty
from dataclasses import dataclass
from typing import Protocol, TextIO

log = logging.getLogger(__name__)

# Names for keys that do not print, as used in key scripts and in the help line.
KEY_NAMES = {" ": "space", "\x1b": "esc", "\n": "enter", "\r": "enter"}


def key_name(char: str) -> str:
    return KEY_NAMES.get(char, char)


class KeySource(Protocol):
    """Keys pressed since the last poll; never blocks."""

    def poll(self, episode: int, tick: int) -> list[str]: ...

    def close(self) -> None: ...


class TerminalKeys:
    """Reads the terminal on stdin in cbreak mode; restores the terminal on close."""

    interactive = True  # a person can answer questions

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdin
        self.fd = self.stream.fileno()
        if not os.isatty(self.fd):
            raise RuntimeError("stdin is not a terminal; use a key script (session.key_script) instead")
        self._saved = termios.tcgetattr(self.fd)
        tty.setcbreak(self.fd)

    def poll(self, episode: int, tick: int) -> list[str]:
        keys: list[str] = []
        while select.select([self.fd], [], [], 0)[0]:
            data = os.read(self.fd, 32).decode(errors="ignore")
            if not data:
                break
            keys.extend(key_name(c) for c in data)
        return keys

    def close(self) -> None:
        termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)


@dataclass(frozen=True)
class ScriptedKey:
    episode: int
    tick: int
    key: str

    @staticmethod
    def parse(text: str) -> ScriptedKey:
        """``"EPISODE:TICK:KEY"``, e.g. ``"1:40:e"`` (e-stop at tick 40 of episode 1)."""
        parts = str(text).split(":")
        if len(parts) != 3:
            raise ValueError(f"key script entry {text!r} must look like EPISODE:TICK:KEY, e.g. 1:40:e")
        episode, tick, key = parts
        return ScriptedKey(int(episode), int(tick), key)


class ScriptedKeys:
    """Presses each scripted key once, at the first poll at or after its (episode, tick)."""

    interactive = False

    def __init__(self, script: list[str] | tuple[str, ...]) -> None:
        self.pending = sorted((ScriptedKey.parse(s) for s in script), key=lambda k: (k.episode, k.tick))

    def poll(self, episode: int, tick: int) -> list[str]:
        due = [k for k in self.pending if (k.episode, k.tick) <= (episode, tick)]
        self.pending = [k for k in self.pending if k not in due]
        for k in due:
            log.info("scripted key %r at episode %d tick %d", k.key, episode, tick)
        return [k.key for k in due]

    def close(self) -> None:
        pass


class NoKeys:
    """No keyboard at all (stdin is not a terminal and there is no script)."""

    interactive = False

    def poll(self, episode: int, tick: int) -> list[str]:
        return []

    def close(self) -> None:
        pass
