"""``ServeConfig``: the policy server's settings (``robot_rl.learner.serving``), ``serve.*`` on the command line."""

from __future__ import annotations

from dataclasses import dataclass

from robot_rl.bridges.zmq.keys import ServerCurve


@dataclass
class ServeConfig:
    """``robot-rl serve`` and a learner that serves: where, how requests are batched, what stays resident."""

    endpoint: str = "tcp://127.0.0.1:5557"  # the server's ROUTER; edges set link.policy_server to it
    # A request waits at most this long for other robots to join its forward. On a GPU a forward of
    # 16 costs little more than one of 1, so a few ms buy up to 16x the chunks per second.
    batch_window_ms: float = 4.0
    max_batch: int = 16  # robots per forward (GPU memory and a forward's time bound it)
    max_queued_per_robot: int = 2  # an edge's requests in flight (edge.max_inflight); more are refused busy
    resident_versions: int = 2  # replaced versions kept for robots pinned to them (each a copy of the weights)
    noise_seed: int = 0  # each robot's noise generator is seeded from this and its id
    image_size: int = 224  # frames the edges send, where the policy does not say its input size
    # CURVE (robot-rl keys), required off loopback: the server's secret key and the robots' public keys.
    secret_key: str | None = None
    robot_keys_dir: str | None = None
    allow_insecure: bool = False  # plain TCP off loopback (an isolated network only)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queued_per_robot < 1 or self.resident_versions < 0:
            raise ValueError("serve: max_batch and max_queued_per_robot must be >= 1, resident_versions >= 0")
        if not 0.0 <= self.batch_window_ms <= 1000.0:
            raise ValueError(f"serve.batch_window_ms must be in [0, 1000], got {self.batch_window_ms}")
        if (self.secret_key is None) != (self.robot_keys_dir is None):
            raise ValueError("serve: CURVE needs both serve.secret_key and serve.robot_keys_dir (`robot-rl keys`)")

    def curve(self) -> ServerCurve | None:
        if self.secret_key is None or self.robot_keys_dir is None:
            return None
        return ServerCurve.from_files(self.secret_key, self.robot_keys_dir)
