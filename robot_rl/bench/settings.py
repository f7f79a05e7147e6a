"""``bench.NAME=VALUE`` command-line settings of a benchmark, split from the config overrides.

Each benchmark keeps its own settings dataclass (its fields are the names it accepts); the
rest of the command line goes to the Hydra config unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from robot_rl.config import ConfigError


def split_bench_settings(overrides: Sequence[str], settings_class: type,
                         list_fields: Sequence[str] = ()) -> tuple[dict[str, Any], list[str]]:
    """({NAME: value parsed as YAML} for ``bench.*`` items, the other overrides).

    A field in ``list_fields`` also takes a comma list (``bench.arms=rwr,awr``). An unknown
    NAME or a missing ``=`` is refused with the names the benchmark knows.
    """
    import yaml

    known = {f.name for f in dataclasses.fields(settings_class)}
    explicit: dict[str, Any] = {}
    rest: list[str] = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not key.lstrip("+").startswith("bench."):
            rest.append(item)
            continue
        name = key.lstrip("+")[len("bench."):]
        if not sep or name not in known:
            raise ConfigError(f"{item!r}: expected bench.NAME=VALUE with NAME one of {sorted(known)}")
        value = yaml.safe_load(raw)
        if name in list_fields and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        explicit[name] = value
    return explicit, rest
