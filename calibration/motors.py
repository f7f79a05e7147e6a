"""Motor calibration through LeRobot's own flow (homing offsets and ranges of motion).

LeRobot owns the procedure and the file format (``~/.cache/huggingface/lerobot/calibration``),
so a robot calibrated here works in LeRobot's tools and the other way round. This only
connects to the bus without triggering LeRobot's automatic calibration, runs
``robot.calibrate()`` (interactive: it asks the operator to move the arm), and disconnects.
"""

from __future__ import annotations

import logging

from robot_rl.hardware.lerobot_robot import LeRobotRobot

log = logging.getLogger(__name__)


class NoRobotError(ConnectionError):
    """No robot answered on the configured port."""


def calibrate_motors(robot: LeRobotRobot) -> str:
    """Run LeRobot's calibration on ``robot``; returns the calibration file path."""
    device = robot.robot
    try:
        device.connect(calibrate=False)
    except Exception as exc:  # pyserial / the SDK raise many types for "nothing there"
        raise NoRobotError(
            f"no {robot.config.type} answered on {robot.config.port}: {exc}. Is it plugged in and powered? "
            "Find the port with `lerobot-find-port` and pass robot.port=..."
        ) from exc
    try:
        device.calibrate()
    finally:
        device.disconnect()
    path = str(getattr(device, "calibration_fpath", ""))
    log.info("calibration of %s saved to %s", robot.name, path)
    return path
