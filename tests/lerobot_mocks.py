"""LeRobot's SO-101 follower with its motor bus mocked, as LeRobot's own tests do it.

Everything above the Feetech bus is LeRobot's real ``SOFollower`` (calibration files,
normalisation, cameras); the bus remembers goal positions and reports them back as present
positions. ``python -m tests.lerobot_mocks robot-rl ARGS`` runs a robot-rl command against such
an arm in a process of its own (the end-to-end tests start sessions that way).
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import MagicMock, patch

JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
# Calibrated ranges (encoder ticks): shoulder_pan spans 1000..3000 -> +-87.9 degrees.
RANGES = {j: (1000, 3000) for j in JOINTS}
RANGES["wrist_roll"] = (0, 4095)


def feetech_bus_mock() -> MagicMock:
    """A Feetech bus that remembers goal positions and reports them as present positions."""
    from lerobot.motors.feetech import FeetechMotorsBus

    bus = MagicMock(name="FeetechBusMock")
    bus.is_connected = False
    bus.is_calibrated = True
    bus.model_resolution_table = FeetechMotorsBus.model_resolution_table
    bus.present = {}

    def connect(*_a, **_k):
        bus.is_connected = True

    def disconnect(*_a, **_k):
        bus.is_connected = False

    def sync_read(register, *_a, **_k):
        assert register == "Present_Position"
        return dict(bus.present)

    def sync_write(register, values, *_a, **_k):
        assert register == "Goal_Position"
        bus.present.update(values)

    @contextmanager
    def torque_disabled(*_a, **_k):
        yield

    bus.connect.side_effect = connect
    bus.disconnect.side_effect = disconnect
    bus.sync_read.side_effect = sync_read
    bus.sync_write.side_effect = sync_write
    bus.torque_disabled.side_effect = torque_disabled
    return bus


def write_calibration(directory: str | Path, robot_id: str) -> None:
    data = {
        j: {"id": i + 1, "drive_mode": 0, "homing_offset": 0, "range_min": lo, "range_max": hi}
        for i, (j, (lo, hi)) in enumerate(RANGES.items())
    }
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"{robot_id}.json").write_text(json.dumps(data))


@contextmanager
def mocked_so101_bus(bus: MagicMock | None = None):
    """Inside: every SO-101 follower LeRobot builds talks to ``bus`` (a fresh mock by default)."""
    bus = bus if bus is not None else feetech_bus_mock()

    def make_bus(*_args, **kwargs):
        bus.motors = kwargs["motors"]
        bus.present = {m: 0.0 for m in bus.motors}
        return bus

    with (
        patch("lerobot.robots.so_follower.so_follower.FeetechMotorsBus", side_effect=make_bus),
        patch("lerobot.robots.so_follower.so_follower.SOFollower.configure", lambda self: None),
    ):
        yield bus


def main(argv: list[str]) -> int:
    """``robot-rl ARGS`` with the SO-101's bus mocked (argv[0] is "robot-rl")."""
    from robot_rl.cli import main as robot_rl_main

    with mocked_so101_bus():
        return robot_rl_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
