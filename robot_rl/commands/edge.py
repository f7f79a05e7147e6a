"""`robot-rl edge learner=tcp://HOST:PORT [options] OVERRIDES`: one edge node streaming to a learner.

The learner's PUB (weights) endpoint defaults to PORT+1 (``robot-rl learner``'s default
layout: 5555 / 5556). A sim robot is used unless the robot config says otherwise.
Off loopback, CURVE keys are required: ``--secret-key keys/robots/NAME.key_secret
--learner-key keys/learner.key`` (from ``robot-rl keys``).
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def pub_endpoint_for(router: str) -> str:
    """tcp://host:5555 -> tcp://host:5556."""
    head, _, port = router.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"learner endpoint {router!r} needs an explicit port, e.g. tcp://learner:5555")
    return f"{head}:{int(port) + 1}"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="robot-rl edge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learner", required=False, help="learner ROUTER endpoint (or learner=...)")
    parser.add_argument("--pub", default=None, help="learner PUB endpoint (default: ROUTER port + 1)")
    parser.add_argument("--robot-id", default="sim-0")
    parser.add_argument("--spool", default=None, help="spool directory (default outputs/edge/ROBOT_ID/spool)")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--checkpoint", default=None, help="initial FlowVLA weights (save_pretrained dir)")
    parser.add_argument("--secret-key", default=None, help="this robot's NAME.key_secret (CURVE)")
    parser.add_argument("--learner-key", default=None, help="the learner's learner.key (CURVE)")
    # Accept the Hydra-looking form `learner=tcp://host:port` too.
    argv = [f"--learner={a.split('=', 1)[1]}" if a.startswith("learner=") else a for a in argv]
    return parser.parse_known_args(argv)


def main(argv: list[str]) -> int:
    args, overrides = parse(argv)
    if not args.learner:
        print("robot-rl edge: say where the learner is: robot-rl edge learner=tcp://HOST:5555")
        return 2
    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.bridges.zmq.keys import ClientCurve
    from robot_rl.commands.learner import build_policy
    from robot_rl.config import load_config
    from robot_rl.learner.local import LocalRunConfig, run_edge, sim_robot_factory

    cfg = load_config(overrides)
    policy = build_policy(cfg, args.checkpoint)
    curve = None
    if args.secret_key or args.learner_key:
        if not (args.secret_key and args.learner_key):
            print("robot-rl edge: CURVE needs both --secret-key and --learner-key (see `robot-rl keys`)")
            return 2
        curve = ClientCurve.from_files(args.secret_key, args.learner_key)
    client = ClientConfig(robot_id=args.robot_id, router_endpoint=args.learner,
                          pub_endpoint=args.pub or pub_endpoint_for(args.learner),
                          spool_dir=args.spool or f"outputs/edge/{args.robot_id}/spool",
                          config_hash=policy.config_hash(), policy_version=0, curve=curve)
    run = LocalRunConfig(num_robots=1, episodes_per_robot=args.episodes, max_steps=args.max_steps)
    parts = sim_robot_factory(0)
    try:
        episodes, steps, successes = run_edge(client, policy, run, parts)
    finally:
        parts[0].disconnect()  # frees the sim's GL context before exit
    print(f"edge {args.robot_id}: {episodes} episodes, {steps} steps, {successes} successes")
    return 0
