"""The operator session (``robot-rl session``): episodes on a robot with a policy, takeovers,
verdicts, e-stop and local recording. ``OperatorSession`` (loop.py) runs it; runner.py builds
its parts from the configuration; status.py is what the operator sees."""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_rl.core.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what the lazy exports below are, for type checkers
    from robot_rl.session.config import SessionConfig
    from robot_rl.session.loop import EXIT_ESTOP, OperatorSession, SessionResult

# Exported lazily: the root configuration reads SessionConfig, and must not wait ~1 s for the
# recorder's and the edge's imports (pyarrow, LeRobot's dataset code) to do so.
_EXPORTS = {
    "SessionConfig": "config",
    "EXIT_ESTOP": "loop",
    "OperatorSession": "loop",
    "SessionResult": "loop",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["EXIT_ESTOP", "OperatorSession", "SessionConfig", "SessionResult"]
