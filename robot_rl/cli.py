"""The one ``robot-rl`` command.

Each subcommand lives in its own module under ``robot_rl.commands`` and is
imported only when called, so ``robot-rl --help`` answers instantly instead of
waiting for torch and MuJoCo to import. Hydra overrides follow the subcommand:
``robot-rl run robot.fps=15 policy.chunk_size=10``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module under robot_rl.commands, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "the main job: learner + simulated robots + simulated operator (embedded default)"),
    "demo-sim": ("demo_sim", "run the sim with the scripted expert and show the tasks"),
    "record-demos": ("record_demos", "record scripted-expert demonstrations in the sim (LeRobotDataset v3)"),
    "train-bc": ("train_bc", "behaviour-clone the flow VLA from recorded demonstrations"),
    "edge": ("edge", "start an edge node against a learner address"),
    "learner": ("learner", "start the learner service"),
    "session": ("session", "operator session on a robot (real or sim)"),
    "eval": ("evaluate", "closed-loop evaluation of checkpoints in the sim"),
    "replay": ("replay", "replay a logged dataset in the sim"),
    "bench": ("bench", "benchmarks: sim, async, transport, learning"),
    "keys": ("keys", "generate CURVE key pairs for the wire"),
    "calibrate": ("calibrate", "camera, latency and motor calibration"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="robot-rl",
        description="Real-robot asynchronous VLA learning. Hydra overrides follow the subcommand.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if args.command is None:
        parser.print_help()
        return 0
    module_name, _ = SUBCOMMANDS[args.command]
    module = importlib.import_module(f"robot_rl.commands.{module_name}")
    from robot_rl.config import ConfigError

    try:
        return int(module.main(rest) or 0)
    except ConfigError as exc:
        print(f"robot-rl {args.command}: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        # A checkpoint, dataset or key file that is not there: say which, without a traceback.
        print(f"robot-rl {args.command}: {exc} (check the path in your overrides)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"robot-rl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
