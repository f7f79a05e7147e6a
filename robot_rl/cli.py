"""The one ``robot-rl`` command.

Each subcommand lives in its own module under ``robot_rl.commands`` and is imported only when
called, so ``robot-rl --help`` answers at once instead of waiting for torch and MuJoCo. A command
that reads the configuration says so with two module attributes: ``HELP`` (what it does, with an
example) and ``GROUPS`` (the config groups it reads). For those, this module answers Hydra's own
flags after the subcommand before the command runs: ``-h``/``--help``, ``--cfg job`` (the composed
config, ``--resolve`` to fill in interpolations) and ``--info`` (which option each group got).
Everything else after the subcommand is the command's: Hydra overrides (``robot.fps=15``) and its
own flags.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import textwrap
from types import ModuleType

from robot_rl.bench.registry import BENCHMARKS

# name -> (module under robot_rl.commands, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "the main job: learner + simulated robots + simulated operator (embedded default)"),
    "demo-sim": ("demo_sim", "run the sim with the scripted expert and show the tasks"),
    "record-demos": ("record_demos", "record scripted-expert demonstrations in the sim (LeRobotDataset v3)"),
    "train-bc": ("train_bc", "behaviour-clone the policy from recorded demonstrations"),
    "edge": ("edge", "start an edge node against a learner address"),
    "learner": ("learner", "start the learner service"),
    "serve": ("serve", "serve the policy to robots without a GPU: one batched forward for the fleet"),
    "session": ("session", "operator session on a robot (real or sim)"),
    "eval": ("evaluate", "closed-loop evaluation of checkpoints in the sim"),
    "replay": ("replay", "replay a logged dataset in the sim"),
    "bench": ("bench", f"benchmarks: {', '.join(BENCHMARKS)}"),
    "keys": ("keys", "generate CURVE key pairs for the wire"),
    "calibrate": ("calibrate", "camera, latency and motor calibration"),
}

# Libraries that report at INFO what a user need not see (model load reports, GL back-ends).
QUIET_LOGGERS = ("transformers", "sentence_transformers", "OpenGL", "absl", "httpx", "huggingface_hub", "datasets",
                 "torch.distributed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="robot-rl",
        description="Real-robot asynchronous VLA learning. `robot-rl COMMAND --help` for a command's settings.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, third-party libraries included")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def configure_logging(verbose: bool) -> None:
    """One readable line per record; libraries' chatter only with ``-v``."""
    if not verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not verbose:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    verbose = args.verbose or any(a in ("-v", "--verbose") for a in rest)
    rest = [a for a in rest if a not in ("-v", "--verbose")]
    configure_logging(verbose)
    if args.command is None:
        parser.print_help()
        return 0
    from robot_rl.config import ConfigError

    module = importlib.import_module(f"robot_rl.commands.{SUBCOMMANDS[args.command][0]}")
    try:
        if hasattr(module, "GROUPS"):
            answered = answer_config_flags(args.command, module, rest)
            if answered is not None:
                return answered
        return run_command(module, rest)
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
    except BrokenPipeError:  # `robot-rl CMD --help | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0


def run_command(module: ModuleType, rest: list[str]) -> int:
    """The command itself, with log records written above any live progress bar, never through it."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm():
        return int(module.main(rest) or 0)


# ---------------------------------------------------------------- Hydra's flags, for every config command


def answer_config_flags(command: str, module: ModuleType, rest: list[str]) -> int | None:
    """``--help``, ``--cfg job [--resolve]`` or ``--info``, answered here (exit code), else None."""
    overrides = [a for a in rest if "=" in a and not a.startswith("-")]
    if "-h" in rest or "--help" in rest:
        print(command_help(command, module))
        return 0
    if "--cfg" in rest:
        from robot_rl.config import ConfigError, config_yaml

        position = rest.index("--cfg")
        part = rest[position + 1] if position + 1 < len(rest) else ""
        if part not in ("job", "all"):
            raise ConfigError(f"--cfg takes job (the composed config) or all, got {part or 'nothing'!r}")
        print(config_yaml(overrides, resolve="--resolve" in rest), end="")
        return 0
    if "--info" in rest:
        print(config_info(overrides))
        return 0
    return None


def command_help(command: str, module: ModuleType) -> str:
    """Purpose, example, and the config groups the command reads with their options or settings."""
    from robot_rl.config import group_options

    lines = [f"robot-rl {command}: {module.HELP.strip()}"]
    if not module.GROUPS:  # a command of flags only
        return "\n".join(lines)
    options, chosen = group_options(), default_choices()
    sections = {group: config_sections(group, module.GROUPS) for group in module.GROUPS if group in options}
    width = max(len(name) for name in [*module.GROUPS, *(s for found in sections.values() for s in found)]) + 1
    lines += ["", "Configuration (GROUP=OPTION chooses, GROUP.KEY=VALUE sets; `--cfg job` prints it all):"]
    for group in module.GROUPS:
        if group in options and group != "bench":
            listed = " | ".join(f"{o}*" if o == chosen.get(group) else o for o in options[group] if o != "base")
            lines.append(f"  {group:<{width}} {listed}   (* default)")
            lines += [settings_line(section, width) for section in sections[group]]
        else:
            lines.append(settings_line(group, width))
    lines += ["", "Flags: --cfg job [--resolve] prints the composed config; --info the option chosen in each group;",
              "       -v logs more (third-party libraries included)."]
    return "\n".join(lines)


def config_sections(group: str, groups: tuple[str, ...]) -> list[str]:
    """The settings blocks inside a chosen group (``learner.service``, ``learner.console``, ...), read from
    its dataclasses; a block that is a group of its own (``learner/algorithm``) is listed as that group."""
    from robot_rl.config import setting_names

    own_groups = {g.replace("/", ".") for g in groups}
    found = [f"{group}.{name}" for name in setting_names(group)]
    return [section for section in found if section not in own_groups and setting_names(section)]


def settings_line(where: str, width: int) -> str:
    """``where``'s setting names, wrapped under its name."""
    from robot_rl.config import setting_names

    names = ", ".join(setting_names(where)) or "a top-level setting"
    return textwrap.fill(names, 100, initial_indent=f"  {where:<{width}} ", subsequent_indent=" " * (width + 3))


def default_choices() -> dict[str, str]:
    from robot_rl.config import group_choices

    return group_choices([])


def config_info(overrides: list[str]) -> str:
    from robot_rl.config import CONFIG_DIR, group_choices

    lines = [f"config directory: {CONFIG_DIR}", "options chosen:"]
    lines += [f"  {group:<18} {option}" for group, option in sorted(group_choices(overrides).items())]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
