"""Teleoperation: one ``Teleop`` protocol (actions + events) and its devices.

Devices: a LeRobot leader arm (``leader``), LeRobot's gamepad (``gamepad``), terminal
keyboard jog (``keyboard``) and the scripted operator for the sim (``scripted``).
``TeleopIntervention`` plugs any of them into the EdgeNode; ``TakeoverBlender`` keeps a
takeover from jerking the follower. Device modules import their drivers lazily, so this
package imports cleanly on a headless machine.
"""

from robot_rl.hardware.teleop.base import EPISODE_ENDING, NullTeleop, Teleop, TeleopEvent, TeleopReading
from robot_rl.hardware.teleop.blend import TakeoverBlender
from robot_rl.hardware.teleop.intervention import TeleopIntervention

__all__ = [
    "EPISODE_ENDING",
    "NullTeleop",
    "TakeoverBlender",
    "Teleop",
    "TeleopEvent",
    "TeleopIntervention",
    "TeleopReading",
]
