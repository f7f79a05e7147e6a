"""Config loading for `robot-rl replay` and `robot-rl eval`: short keys and their group.

Researchers type ``dataset=... episodes=[0,2]``; those live in the ``replay`` (or
``eval``) config group, so the short keys are rewritten to ``replay.dataset=...``
before Hydra sees them. The group is added to the composition when the root config
does not list it yet.
"""

from __future__ import annotations

from collections.abc import Iterable

from omegaconf import DictConfig, OmegaConf

from robot_rl.config import CONFIG_DIR, load_config


def expand_aliases(argv: Iterable[str], group: str, aliases: Iterable[str]) -> list[str]:
    """``episodes=[0,2]`` -> ``replay.episodes=[0,2]`` for the given short keys (also ``compare.path``)."""
    short = tuple(aliases)
    out = []
    for item in argv:
        key, sep, value = item.partition("=")
        bare = key.lstrip("+~")
        if sep and any(bare == a or bare.startswith(a + ".") for a in short):
            out.append(f"{key[: len(key) - len(bare)]}{group}.{bare}={value}")
        else:
            out.append(item)
    return out


def load_group_config(argv: list[str], group: str, aliases: Iterable[str]) -> DictConfig:
    """Compose the root config plus ``group`` (default option unless chosen) with the user's overrides."""
    overrides = expand_aliases(argv, group, aliases)
    chose_option = any(o.partition("=")[0].lstrip("+") == group for o in overrides)
    if not _root_lists_group(group) and not chose_option:
        overrides = [f"+{group}=default", *overrides]
    elif not _root_lists_group(group):
        overrides = [("+" + o if o.partition("=")[0] == group else o) for o in overrides]
    return load_config(overrides)


def _root_lists_group(group: str) -> bool:
    root = OmegaConf.load(CONFIG_DIR / "config.yaml")
    for entry in root.get("defaults", []):
        if isinstance(entry, str) and entry.split("@")[0] == group:
            return True
        if isinstance(entry, DictConfig) and group in entry:
            return True
    return False
