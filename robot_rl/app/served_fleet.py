"""The main job's robots served by its learner (``robot-rl run edge.inference_runner=remote``).

A robot PC without a GPU asks the learner's GPU box for its chunks; the main job does the same on
one machine: its learner serves (``learner.serve_policy``, at ``serve.endpoint``) and every robot
asks that server instead of running a copy of its own (``robot_rl.app.local_run``). The robots
reach the server as they reach the learner's link, on loopback without keys, at the address the
server bound; so a setting that would send them elsewhere, ask them for keys, or ask of the served
policy what a request cannot carry is refused here, in one line, before anything is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_rl.bridges.zmq.keys import is_loopback
from robot_rl.core.errors import ConfigError

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


def serves_robots(cfg: RobotRLConfig) -> bool:
    """The run's robots ask its learner for their chunks."""
    return cfg.edge.inference_runner == "remote"


def check_served_fleet(cfg: RobotRLConfig) -> None:
    """``ConfigError`` where ``edge.inference_runner=remote`` cannot work in the main job; nothing otherwise."""
    if not serves_robots(cfg):
        return
    endpoint = cfg.serve.endpoint
    if cfg.link.policy_server is not None and cfg.link.policy_server != endpoint:
        raise ConfigError(f"edge.inference_runner=remote: the robots ask the run's own learner, which "
                          f"serves at serve.endpoint={endpoint}, not link.policy_server={cfg.link.policy_server}; "
                          "unset link.policy_server (or use robot-rl edge for robots of another server)")
    if not is_loopback(endpoint):
        raise ConfigError(f"edge.inference_runner=remote: the robots ask the learner on this machine, "
                          f"so serve.endpoint must be a loopback address (tcp://127.0.0.1:PORT), not {endpoint}")
    if cfg.serve.secret_key is not None:
        raise ConfigError("edge.inference_runner=remote: the robots ask on loopback without CURVE "
                          "keys, so the learner's server takes none; unset serve.secret_key and serve.robot_keys_dir")
    service = cfg.learner.service
    any_port = endpoint.endswith((":*", ":0"))  # the system picks a free one: never the learner's
    if not any_port and endpoint in (service.router_endpoint, service.pub_endpoint):
        raise ConfigError(f"serve.endpoint={endpoint} is also the learner's link (learner.service); give the policy "
                          "server a port of its own")
    if cfg.edge.real_time_chunking:
        raise ConfigError("edge.real_time_chunking=true with edge.inference_runner=remote: a request to the policy "
                          "server carries no frozen prefix to guide the chunk by; turn one of them off")
    if cfg.edge.max_inflight > cfg.serve.max_queued_per_robot:
        raise ConfigError(f"edge.max_inflight={cfg.edge.max_inflight} but the policy server queues at most "
                          f"serve.max_queued_per_robot={cfg.serve.max_queued_per_robot} requests per robot and "
                          "refuses the rest; raise it or lower edge.max_inflight")
