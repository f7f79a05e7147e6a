"""Settings of an operator session (the ``session`` group). The teleop device's are its own
config's (``teleop=NAME``, ``robot_rl.hardware.teleop``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from robot_rl.data.frame_storage import FrameStorageConfig

KEY_MODES = ("auto", "terminal", "script", "none")


@dataclass
class SessionConfig:
    """One sitting at a robot: how many episodes, how long, where they are recorded.

    keys: "auto" reads the terminal when stdin is one, else plays ``key_script``;
        "script" always plays ``key_script`` (entries "EPISODE:TICK:KEY", episodes counted
        from 0, e.g. "1:40:e": e-stop at tick 40 of the second episode).
    realtime: false runs a simulated robot on a virtual clock (as fast as the CPU allows);
        a real robot always runs on the wall clock.
    """

    episodes: int = 10
    # 30 s at 30 Hz: time for the policy's attempt and for an operator to see it go wrong,
    # take over, correct it with the jog keys or a leader arm and hand back (a keyboard
    # correction alone takes 5-15 s). An operator ends an episode early with s or f.
    max_episode_steps: int = 900
    reset_time_s: float = 5.0  # between episodes: time to put the scene back (real robots)
    instruction: str = ""  # real robots: what the policy is asked to do (the sim makes its own)
    dataset_root: str = "${output_dir}/session"
    repo_id: str = "local/robot_rl_session"
    # How the session's dataset stores camera frames (PNG, or video for camera-size frames).
    frames: FrameStorageConfig = field(default_factory=FrameStorageConfig)
    realtime: bool = True
    keys: str = "auto"
    key_script: list[str] = field(default_factory=list)
    ask_outcome: bool = True  # at an episode's end without a verdict, ask s/f/r (unless the detector is sure)
    # The learner's success detector judges each running episode (its guess comes back with the acks):
    # a sure success ends the episode there, with the detector's verdict, instead of running out the
    # time (an unattended arm would otherwise go on acting on a finished scene).
    end_on_detected_success: bool = True
    # At an episode's end, how long to wait for the learner's acks, which bring the detector's guess on
    # the episode; a sure guess is the verdict, else the operator is asked (and shown it).
    detector_wait_s: float = 2.0
    status_interval_s: float = 0.25
    # Sim sessions: the first scene's seed (episode k gets seed + k); null = drawn from the
    # clock, so sessions do not all practise on the same scenes. Recorded with every episode.
    seed: int | None = None
    # After saving an episode, wait at most this long for the learner's ack before saying
    # whether it got it (the episode is in the local dataset and the spool either way).
    ack_timeout_s: float = 10.0
    # At the session's end, wait at most this long for the learner to ack everything recorded;
    # what is still unacked stays in the spool and goes with the next session.
    final_ack_timeout_s: float = 30.0
    log_path: str = "${output_dir}/session_log.jsonl"  # one JSON line per episode: verdict, seed, learner ack

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.max_episode_steps < 1:
            raise ValueError("session.episodes and session.max_episode_steps must be >= 1")
        if self.keys not in KEY_MODES:
            raise ValueError(f"session.keys must be one of {KEY_MODES}, got {self.keys!r}")
        if min(self.reset_time_s, self.ack_timeout_s, self.final_ack_timeout_s, self.detector_wait_s) < 0:
            raise ValueError("session.reset_time_s, ack_timeout_s, final_ack_timeout_s and detector_wait_s "
                             "must be >= 0")
