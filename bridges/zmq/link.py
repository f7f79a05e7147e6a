"""``LinkConfig``: where an edge node (``robot-rl edge`` / ``robot-rl session``) finds its learner.

The user-facing half of ``ClientConfig``: addresses, identity, spool and keys. The wire's own
timing (acks, heartbeats, weight chunks) stays in ``ClientConfig``'s defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from robot_rl.bridges.zmq.spool import DEFAULT_SPOOL_MAX_BYTES

if TYPE_CHECKING:
    from robot_rl.bridges.zmq.client import ClientConfig


@dataclass
class LinkConfig:
    """``link.learner=tcp://HOST:5555`` streams to that learner; null records locally only."""

    learner: str | None = None  # the learner's segment endpoint (its ROUTER), e.g. tcp://learner.lab:5555
    weights: str | None = None  # its weights endpoint (PUB); null = the same host, port + 1
    robot_id: str | None = None  # the id this robot streams as; null = the robot's name
    spool_dir: str | None = None  # unacked segments on disk; null = ${output_dir}/edge/ROBOT_ID/spool
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES  # bytes of unacked segments kept (spool.py says why)
    # CURVE keys (robot-rl keys), required whenever the learner is not on loopback:
    secret_key: str | None = None  # this robot's keys/robots/ROBOT_ID.key_secret
    learner_key: str | None = None  # the learner's public keys/learner.key
    # edge.inference_runner=remote: the policy server (robot-rl serve) that computes the chunks, and
    # its public key (null = link.learner_key: a learner that serves); this robot's key is secret_key.
    policy_server: str | None = None  # e.g. tcp://gpu.lab:5557
    policy_server_key: str | None = None

    def __post_init__(self) -> None:
        if self.learner is not None and "://" not in self.learner:
            raise ValueError(f"link.learner must be an address like tcp://HOST:5555, got {self.learner!r}")
        if (self.secret_key is None) != (self.learner_key is None):
            raise ValueError("link: CURVE needs both link.secret_key and link.learner_key (see `robot-rl keys`)")

    def weights_endpoint(self) -> str:
        """``link.weights``, else the learner's port + 1 (``robot-rl learner``'s layout: 5555 / 5556)."""
        if self.weights is not None:
            return self.weights
        if self.learner is None:
            raise ValueError("no learner address: set link.learner=tcp://HOST:5555")
        head, _, port = self.learner.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"link.learner {self.learner!r} needs an explicit port, e.g. tcp://learner:5555")
        return f"{head}:{int(port) + 1}"

    def client_config(self, robot_name: str, output_dir: str, config_hash: str = "") -> ClientConfig:
        """The link's ``ClientConfig`` for a robot called ``robot_name`` (the id when ``link.robot_id``
        is null), spooling under ``output_dir`` unless ``link.spool_dir`` says where; ``config_hash``
        is the running policy's, so the learner refuses a robot whose model it cannot train.

        CURVE keys are loaded here, and an address off loopback without them is refused here
        (``InsecureEndpointError``, before anything starts): segments and weights never cross a
        network in clear.
        """
        from robot_rl.bridges.zmq.client import ClientConfig
        from robot_rl.bridges.zmq.keys import ClientCurve, InsecureEndpointError, is_loopback

        if self.learner is None:
            raise ValueError("no learner address: set link.learner=tcp://HOST:5555")
        robot_id = self.robot_id or robot_name
        curve = None
        if self.secret_key is not None and self.learner_key is not None:
            curve = ClientCurve.from_files(self.secret_key, self.learner_key)
        outside = [e for e in (self.learner, self.weights_endpoint()) if not is_loopback(e)]
        if curve is None and outside:
            raise InsecureEndpointError(
                f"{outside[0]} is not on loopback, so the link needs CURVE keys (`robot-rl keys`): "
                f"link.secret_key=keys/robots/{robot_id}.key_secret link.learner_key=keys/learner.key")
        return ClientConfig(robot_id=robot_id, router_endpoint=self.learner, pub_endpoint=self.weights_endpoint(),
                            spool_dir=self.spool_dir or Path(output_dir) / "edge" / robot_id / "spool",
                            spool_max_bytes=self.spool_max_bytes, config_hash=config_hash, policy_version=0,
                            curve=curve)
