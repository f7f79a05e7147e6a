"""The operator session (``robot-rl session``): episodes on a robot with a policy, takeovers,
verdicts, e-stop and local recording. ``OperatorSession`` (loop.py) runs it; factory.py
builds its parts from the Hydra config; status.py is what the operator sees."""

from robot_rl.session.config import SessionConfig, TeleopConfig
from robot_rl.session.loop import EXIT_ESTOP, OperatorSession, SessionResult

__all__ = ["EXIT_ESTOP", "OperatorSession", "SessionConfig", "SessionResult", "TeleopConfig"]
