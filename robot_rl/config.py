"""Hydra configuration: one composed tree from ``configs/`` plus command-line overrides.

Every YAML group mirrors a dataclass next to the code it configures
(``SimConfig``, ``FlowVLAConfig``, ``EdgeConfig`` ...); ``to_dataclass`` turns a
group into that dataclass and names any key the dataclass does not know, so a
typo in an override fails loudly instead of being ignored.
"""

from __future__ import annotations

import dataclasses
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

# Package data (configs/ in the source tree): found the same way in an editable and a wheel install.
CONFIG_DIR = Path(str(files("robot_rl.configs")))

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration that cannot be used, with what to change."""


def load_config(overrides: list[str] | None = None, config_name: str = "config") -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with Hydra overrides like ``robot.fps=30``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    if not CONFIG_DIR.is_dir():
        raise ConfigError(
            f"config directory {CONFIG_DIR} not found; robot_rl must be installed from its "
            "source tree (pip install -e .) so that configs/ sits beside the package"
        )
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides or []))
    except HydraException as exc:
        raise ConfigError(f"bad configuration override: {exc}") from exc


def to_dataclass(node: DictConfig | dict[str, Any] | None, cls: type[T], **extra: Any) -> T:
    """Build dataclass ``cls`` from a config group, refusing unknown keys."""
    values: dict[str, Any] = {}
    if node is not None:
        raw = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        values.update({k: v for k, v in raw.items() if k != "_name"})
    values.update(extra)
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field(s) {unknown}; known fields: {sorted(known)}")
    for name, value in list(values.items()):
        # YAML gives lists where dataclasses declare tuples (camera names, joint limits).
        if isinstance(value, list) and isinstance(known[name].default, tuple):
            values[name] = tuple(value)
    return cls(**values)


def split_learner_address(overrides: list[str]) -> tuple[str | None, list[str]]:
    """Take ``learner=tcp://host:port`` out of the overrides.

    ``learner`` is also the Hydra group that selects the learning algorithm
    (``learner=rwr``); an override whose value is an address (has ``://``) names the
    learner to connect to instead, so operators can type what the README shows.
    """
    address = None
    rest = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.lstrip("+") in ("learner", "learner_address") and "://" in value:
            address = value
        else:
            rest.append(item)
    return address, rest
