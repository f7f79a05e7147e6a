"""`robot-rl edge`: one edge node streaming to a learner."""

from __future__ import annotations

import dataclasses
import logging

log = logging.getLogger(__name__)

HELP = """\
one edge node that streams its episodes to a learner and runs the weights it publishes.

It runs session.episodes episodes of session.max_episode_steps ticks, streams every step to
link.learner and swaps in the weights published on link.weights (default: the learner's port + 1),
starting from policy.path, else the BC checkpoint, else the shipped one. Off loopback the link
needs CURVE keys from `robot-rl keys`: link.secret_key and link.learner_key. The robot is the sim
(robot=sim_so101 and its settings).

examples:
  robot-rl edge link.learner=tcp://127.0.0.1:5555 session.episodes=5
  robot-rl edge link.learner=tcp://learner.lab:5555 link.robot_id=robot-0 \\
      link.secret_key=keys/robots/robot-0.key_secret link.learner_key=keys/learner.key
"""

# The root config groups this command reads.
GROUPS: tuple[str, ...] = ("robot", "policy", "edge", "link", "session")


def main(argv: list[str]) -> int:
    """``argv``: configuration overrides only."""
    from robot_rl.app.sim import sim_config, task_families
    from robot_rl.config import ConfigError, load_config
    from robot_rl.policies.flow_vla.config import FlowVLAPolicyConfig

    cfg = load_config(argv)
    if cfg.link.learner is None:
        raise ConfigError("say where the learner is: robot-rl edge link.learner=tcp://HOST:5555")
    if not isinstance(cfg.policy, FlowVLAPolicyConfig):
        from robot_rl.core.registry import POLICIES

        raise ConfigError(f"robot-rl edge streams to a learner, which trains policy=flow_vla, "
                          f"not policy={POLICIES.name_of(cfg.policy)}")
    sim = sim_config(cfg)
    families = task_families(cfg)
    from robot_rl.app.local_run import LocalRunConfig, make_sim_robot_factory, run_edge
    from robot_rl.app.policies import load_policy

    try:
        client = cfg.link.client_config(sim.name, cfg.output_dir)
    except ValueError as exc:  # an address off loopback without keys
        raise ConfigError(str(exc)) from exc
    policy = load_policy(cfg)
    client = dataclasses.replace(client, config_hash=policy.config_hash())
    run = LocalRunConfig(num_robots=1, episodes_per_robot=cfg.session.episodes,
                         max_steps=cfg.session.max_episode_steps, spool_dir=str(client.spool_dir), edge=cfg.edge)
    parts = make_sim_robot_factory(sim, families, seed_base=sim.seed)(0)
    try:
        episodes, steps, successes = run_edge(client, policy, run, parts)
    finally:
        parts[0].disconnect()  # frees the sim's GL context before exit
    print(f"edge {client.robot_id}: {episodes} episodes, {steps} steps, {successes} successes")
    return 0
