"""The typed configuration every command composes: one root dataclass, Hydra, strict.

Every setting is a field of a dataclass beside the code it configures (``SimConfig`` beside the
sim, ``EdgeConfig`` beside the edge runtime, ``LearnerConfig`` beside the learner ...), with its
default and its comment there and nowhere else. ``RobotRLConfig`` below puts them together and is
stored in Hydra's ConfigStore; the choices of a kind (robots, policies, teleop devices, learning
algorithms, benchmarks) are stored by their registries under their group. ``configs/`` holds only
presets (``configs/robot/so101.yaml`` says what differs from LeRobot robots' defaults) and
``configs/config.yaml``, which picks the default choices and wires groups together
(``edge.fps: ${robot.fps}``).

Composition is strict: an override that names no setting, or gives a value of the wrong type,
is refused with one line that names the valid settings (``ConfigError``); a value a dataclass
rejects in ``__post_init__`` is refused the same way.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from robot_rl.app.config import BCConfig, DemosConfig, DemoSimConfig, EvalConfig, RunConfig, Seeds
from robot_rl.bridges.zmq.link import LinkConfig
from robot_rl.core.errors import ConfigError
from robot_rl.edge.config import EdgeConfig
from robot_rl.learner.config import LearnerConfig
from robot_rl.learner.serving_config import ServeConfig
from robot_rl.policies.lerobot_config import with_recognised_policy
from robot_rl.replay.config import ReplayConfig
from robot_rl.session.config import SessionConfig

# Package data (configs/ in the source tree): found the same way in an editable and a wheel install.
CONFIG_DIR = Path(str(files("robot_rl.configs")))

__all__ = ["CONFIG_DIR", "ConfigError", "RobotRLConfig", "compose_config", "config_yaml", "load_config"]

# Modules whose import registers the choices of a kind in Hydra's ConfigStore (robot=, policy=,
# teleop=, learner/algorithm=, bench=). They hold config dataclasses only: importing them
# pulls in no driver, simulator or learner stack.
CHOICE_MODULES = (
    "robot_rl.hardware.sim.config",
    "robot_rl.hardware.lerobot_robot_config",
    "robot_rl.bridges.ros2.config",
    "robot_rl.hardware.teleop.base",
    "robot_rl.hardware.teleop.keyboard",
    "robot_rl.hardware.teleop.gamepad",
    "robot_rl.hardware.teleop.leader",
    "robot_rl.hardware.teleop.scripted",
    "robot_rl.policies.flow_vla.config",
    "robot_rl.policies.lerobot_config",
    "robot_rl.policies.hold",
    "robot_rl.learner.algorithms.config",
    "robot_rl.bench.config",
    "robot_rl.edge.viewer_config",
)


@dataclass
class RobotRLConfig:
    """Everything a ``robot-rl`` command can be configured with (``robot-rl CMD --cfg job`` prints it).

    The four component groups are choices (``robot=so101``, ``policy=lerobot``, ``teleop=leader``,
    ``learner=rwr``); the rest are plain settings (``run.episodes=50``). ``configs/config.yaml``
    picks the default choices.
    """

    robot: Any = MISSING  # the arm: sim_so101 | so101 | lerobot | ros2_arm
    policy: Any = MISSING  # what drives it: flow_vla | lerobot | hold
    teleop: Any = MISSING  # how an operator takes over: keyboard | leader | gamepad | scripted | none
    learner: LearnerConfig = MISSING  # store, trainer and algorithm: hgdagger | bc | rwr | awr | rl
    viewer: Any = MISSING  # a live view of every robot: none | rerun
    edge: EdgeConfig = field(default_factory=EdgeConfig)  # the edge runtime's timing contract
    link: LinkConfig = field(default_factory=LinkConfig)  # where an edge finds its learner
    serve: ServeConfig = field(default_factory=ServeConfig)  # robot-rl serve: a policy server for the fleet
    session: SessionConfig = field(default_factory=SessionConfig)  # robot-rl session
    run: RunConfig = field(default_factory=RunConfig)  # robot-rl run: the main job
    demos: DemosConfig = field(default_factory=DemosConfig)  # robot-rl record-demos
    bc: BCConfig = field(default_factory=BCConfig)  # robot-rl train-bc
    eval: EvalConfig = field(default_factory=EvalConfig)  # robot-rl eval
    replay: ReplayConfig = MISSING  # robot-rl replay (presets: default | radians_6dof)
    demo_sim: DemoSimConfig = field(default_factory=DemoSimConfig)  # robot-rl demo-sim
    bench: Any = None  # robot-rl bench NAME: that benchmark's own settings
    seeds: Seeds = field(default_factory=Seeds)  # the scene ranges each job draws from
    seed: int = 0  # shifts every seeded range above, and seeds training
    output_dir: str = "outputs"  # where every command writes, unless told otherwise
    # Task families (pick, push, place) that the demonstrations, the BC start, the main job, eval
    # and the benchmarks use; null = every family of the sim. Push (3 colours x left/right) is the
    # one a CPU-sized behaviour-cloned start learns (~65 % on unseen scenes; cloned on all three:
    # pick 0 %, push 45 %, place 10 %: its small errors compound on the way to a cube it must grasp).
    task_families: list[str] | None = field(default_factory=lambda: ["push"])


def register_configs() -> None:
    """Store the root schema and every choice in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    for module in CHOICE_MODULES:
        importlib.import_module(module)
    store = ConfigStore.instance()
    store.store(name="robot_rl", node=RobotRLConfig)
    store.store(group="replay", name="default", node=ReplayConfig)
    # learner/base: the LearnerConfig schema with the algorithm left to its group (learner/algorithm),
    # as Hydra cannot replace a node typed as one algorithm's dataclass by another's. None, not
    # MISSING: merged into the root's MISSING ``learner`` node, which OmegaConf first fills with
    # LearnerConfig's defaults, a MISSING value would leave the default WeightedBCConfig in place.
    learner_schema = OmegaConf.structured(LearnerConfig)
    learner_schema.algorithm = None
    ConfigStore.instance().store(group="learner", name="base", node=learner_schema)


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """``configs/config.yaml`` composed with Hydra overrides (``robot.fps=15``), checked strictly."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    overrides = with_recognised_policy(overrides)  # policy.path alone may name a LeRobot checkpoint
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(describe_error(exc, overrides)) from exc
    unknown = sorted(unknown_keys(cfg))
    if unknown:
        raise ConfigError(_unknown_key_message(unknown[0], overrides))
    return cfg


def load_config(overrides: Sequence[str] = ()) -> RobotRLConfig:
    """The composed config as dataclasses, interpolations resolved and every ``__post_init__`` run."""
    from omegaconf.errors import OmegaConfBaseException

    cfg = compose_config(overrides)
    try:
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(describe_error(exc)) from exc
    except (ValueError, TypeError) as exc:  # a dataclass's own check (__post_init__)
        raise ConfigError(str(exc)) from exc
    assert isinstance(config, RobotRLConfig)
    return config


def config_yaml(overrides: Sequence[str] = (), resolve: bool = False) -> str:
    """The composed config as YAML (``--cfg job``; ``--resolve`` fills in interpolations)."""
    return OmegaConf.to_yaml(compose_config(overrides), resolve=resolve)


def group_choices(overrides: Sequence[str] = ()) -> dict[str, str]:
    """The option each config group got (``robot: so101``), as Hydra chose it (``--info``)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=with_recognised_policy(overrides), return_hydra_config=True)
    except Exception as exc:
        raise ConfigError(describe_error(exc)) from exc
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    assert isinstance(choices, dict)
    return {str(group): str(option) for group, option in choices.items()
            if option is not None and not str(group).startswith("hydra")}


def setting_names(group: str) -> list[str]:
    """The settings (field names) of a plain group such as ``edge`` or ``run``."""
    return _declared_fields(_reference_config(()), group)


def group_options() -> dict[str, list[str]]:
    """Every config group and its options (stored and YAML presets), for ``--help``."""
    from hydra.core.config_store import ConfigStore

    register_configs()
    options: dict[str, set[str]] = {}

    def walk(node: dict, prefix: str) -> None:
        for name, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{name}/")
            elif prefix:
                options.setdefault(prefix.rstrip("/"), set()).add(name.removesuffix(".yaml"))

    walk(ConfigStore.instance().repo, "")
    for preset in CONFIG_DIR.rglob("*.yaml"):
        group = preset.parent.relative_to(CONFIG_DIR).as_posix()
        if group != ".":
            options.setdefault(group, set()).add(preset.stem)
    return {group: sorted(names) for group, names in sorted(options.items())}


# ---------------------------------------------------------------- strictness and its messages


def unknown_keys(cfg: DictConfig, prefix: str = "") -> Iterator[str]:
    """Full keys present in ``cfg`` that its dataclass schema does not declare.

    Hydra lets ``+key=value`` add a key anywhere; a key no dataclass declares would be dropped
    without a word when the config becomes dataclasses, so it is refused instead.
    """
    schema = OmegaConf.get_type(cfg)
    declared = {f.name for f in fields(schema)} if schema is not None and is_dataclass(schema) else None
    for key in cfg:
        name = f"{prefix}{key!s}"  # keys of a DictConfig may be typed as bytes too; ours are str
        if declared is not None and key not in declared:
            yield name
            continue
        node = cfg._get_node(key)  # noqa: SLF001 - OmegaConf's way to look at a node without resolving it
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():  # noqa: SLF001 - same
            yield from unknown_keys(node, f"{name}.")


def describe_error(exc: BaseException, overrides: Sequence[str] = ()) -> str:
    """One line for a Hydra/OmegaConf error: what was wrong, and what is valid there (in the config
    the ``overrides``' group choices select)."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    if isinstance(exc, MissingConfigException):
        return _missing_option_message(str(exc))
    if "To append to your config use" in str(exc) and "'" in str(exc):
        key = str(exc).split("'")[1]
        if _is_free_dict(_reference_config(_choices(overrides)), key):  # new keys in a dict setting: need a +
            return (f"{key} gets new keys here, which Hydra adds only with a +: "
                    + str(exc).splitlines()[-1].removeprefix("To append to your config use ").strip())
    cause = exc
    while cause.__cause__ is not None and not isinstance(cause, (ConfigAttributeError, ConfigKeyError,
                                                                 ValidationError)):
        cause = cause.__cause__
    full_key = getattr(cause, "full_key", None)
    first_line = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and full_key:
        return _unknown_key_message(str(full_key), overrides)
    if isinstance(cause, ValidationError) and full_key:
        return f"{full_key}: {first_line}"
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip() and
                    not line.strip().startswith(("full_key:", "object_type=", "reference_type=")))


def _unknown_key_message(full_key: str, overrides: Sequence[str] = ()) -> str:
    reference = _reference_config(_choices(overrides))
    parent, _, leaf = full_key.rpartition(".")
    valid = _declared_fields(reference, parent)
    where = f"'{parent}'" if parent else "the top level"
    message = f"{full_key} is not a setting: {where} has {', '.join(valid) if valid else 'no settings'}"
    near = difflib.get_close_matches(leaf, valid, n=1)
    close = [f"{parent}.{near[0]}" if parent else near[0]] if near else _close_full_keys(reference, leaf)
    return message + (f" (did you mean {close[0]}?)" if close else "")


def _is_free_dict(reference: DictConfig, key: str) -> bool:
    """``key`` is a setting whose value is a plain dict (``robot.cameras``), not a dataclass: it
    takes any keys, which a Hydra override adds only with a leading ``+``."""
    node = OmegaConf.select(reference, key, default=None)
    if not isinstance(node, DictConfig):
        return False
    schema = OmegaConf.get_type(node)
    return schema is None or not is_dataclass(schema)


def _choices(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides that choose a group option (``robot=so101``, ``+bench=learning``), not a value."""
    groups = group_options()
    return tuple(item for item in overrides if "=" in item and item.partition("=")[0].lstrip("+") in groups)


def _declared_fields(reference: DictConfig, parent: str) -> list[str]:
    """The field names at ``parent`` (a dotted path) of ``reference``."""
    node: Any = OmegaConf.select(reference, parent) if parent else reference
    if not isinstance(node, DictConfig):
        return []
    schema = OmegaConf.get_type(node)
    if schema is not None and is_dataclass(schema):
        return [f.name for f in fields(schema)]
    return [str(k) for k in node]


def _close_full_keys(reference: DictConfig, leaf: str) -> list[str]:
    """Full keys elsewhere in the config whose last part looks like ``leaf`` (``episodes`` ->
    ``session.episodes``): the setting exists, under another group."""
    keys = list(_leaf_keys(reference))
    matches = [k for k in keys if k.rpartition(".")[2] == leaf]
    if not matches:
        by_leaf = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in keys], n=1)
        matches = [k for k in keys if by_leaf and k.rpartition(".")[2] == by_leaf[0]]
    return [" or ".join(matches[:6])] if matches else []


def _leaf_keys(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, DictConfig):
        for key in node:
            child = node._get_node(key)  # noqa: SLF001 - look without resolving interpolations
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():  # noqa: SLF001 - same
                yield from _leaf_keys(child, f"{prefix}{key!s}.")
            else:
                yield f"{prefix}{key!s}"


@functools.lru_cache(maxsize=8)
def _reference_config(choices: tuple[str, ...]) -> DictConfig:
    """The config of these group choices and no other override: where error messages look up what is valid."""
    from hydra import compose, initialize_config_dir

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(choices))
    except Exception:  # noqa: BLE001 - the choices themselves are wrong: fall back to the defaults
        return _reference_config(()) if choices else OmegaConf.create({})


def _missing_option_message(text: str) -> str:
    """``Could not find 'robot/nope'`` -> ``robot=nope: no such robot option; choose one of ...``."""
    import re

    found = re.search(r"Could not find '([^']+)'", text)
    if found is None:
        return text.splitlines()[0]
    options = group_options()
    wanted = found.group(1)
    group = max((g for g in options if wanted.startswith(g + "/")), key=len, default=wanted.rpartition("/")[0])
    option = wanted[len(group) + 1:]
    choices = options.get(group, [])
    hint = ""
    if "://" in option:
        hint = f" ({option} is an address: a learner's address is link.learner={option})"
    return f"{group}={option}: no such {group} option; choose one of {', '.join(choices)}{hint}"
