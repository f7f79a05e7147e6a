"""Settings of an operator session (the ``session`` group). The teleop device's are its own
config's (``teleop=NAME``, ``robot_rl.hardware.teleop``)."""

from __future__ import annotations

from dataclasses import dataclass, field

KEY_MODES = ("auto", "terminal", "script", "none")


@dataclass
class SessionConfig:
    """One sitting at a robot: how many episodes, how long, where they are recorded.

    keys: "auto" reads the terminal when stdin is one, else plays ``key_script``;
        "script" always plays ``key_script`` (entries "EPISODE:TICK:KEY", e.g. "1:40:e").
    realtime: false runs a simulated robot on a virtual clock (as fast as the CPU allows);
        a real robot always runs on the wall clock.
    """

    episodes: int = 10
    max_episode_steps: int = 300  # 10 s at 30 Hz
    reset_time_s: float = 5.0  # between episodes: time to put the scene back (real robots)
    instruction: str = ""  # real robots: what the policy is asked to do (the sim makes its own)
    dataset_root: str = "${output_dir}/session"
    repo_id: str = "local/robot_rl_session"
    realtime: bool = True
    keys: str = "auto"
    key_script: list[str] = field(default_factory=list)
    ask_outcome: bool = True  # at an episode's end without a verdict, ask s/f/r
    status_interval_s: float = 0.25
    rerun: bool = False  # live view of cameras and actions, if rerun-sdk is installed
    seed: int = 0

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.max_episode_steps < 1:
            raise ValueError("session.episodes and session.max_episode_steps must be >= 1")
        if self.keys not in KEY_MODES:
            raise ValueError(f"session.keys must be one of {KEY_MODES}, got {self.keys!r}")
        if self.reset_time_s < 0:
            raise ValueError("session.reset_time_s must be >= 0")
