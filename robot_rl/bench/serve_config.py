"""``ServeBenchConfig``: the settings of ``robot-rl bench serve`` (``robot_rl.bench.serve``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServeBenchConfig:
    """``bench serve``: robots against one policy server, batched and serial side by side."""

    robots: list[int] = field(default_factory=lambda: [1, 4, 16])  # synthetic edges asking at once
    seconds: float = 10.0  # each cell's duration (after a warm-up chunk per robot)
    swaps: int = 5  # versions published while one robot asks, for swap_to_serve
    serial: bool = True  # also run every robot count with serve.max_batch=1
    fleet: bool = True  # the cells above; false: only the LeRobot baseline
    # LeRobot's PolicyServer with its own RobotClients beside our server, on one tiny ACT saved here
    # (robot_rl.bench.serve_lerobot); needs LeRobot's gRPC transport (the dev extra lerobot[async]).
    # Off by default: about 75 s on a 2-core box, most of it three processes importing LeRobot.
    lerobot_baseline: bool = False
    lerobot_robots: list[int] = field(default_factory=lambda: [1, 4])
    lerobot_seconds: float = 4.0  # each baseline cell's window, after its warm-up

    def __post_init__(self) -> None:
        if not self.robots or min(self.robots) < 1 or self.seconds <= 0 or self.swaps < 0:
            raise ValueError("bench serve: robots >= 1 (a list), seconds > 0, swaps >= 0")
        if not self.lerobot_robots or min(self.lerobot_robots) < 1 or self.lerobot_seconds <= 0:
            raise ValueError("bench serve: lerobot_robots >= 1 (a list), lerobot_seconds > 0")
