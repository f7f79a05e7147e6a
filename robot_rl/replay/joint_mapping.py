"""Map another robot's joint names and units onto the sim robot's joints.

A public LeRobotDataset logs its own joint names (``joint1``, ``shoulder_pan.pos`` ...)
and its own units (radians, degrees, 0..1 grippers). Replaying it in the sim needs each
sim joint to be fed from exactly one logged joint, converted to the sim's units
(SO-101: degrees, gripper 0..100): ``sim = logged * scale + offset``.

When the names do not fit, the error names the unmatched joints on both sides and shows
the override that fixes it, because guessing a mapping silently would replay nonsense.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robot_rl.core.errors import ConfigError
from robot_rl.core.robot_io import joint_base_name

log = logging.getLogger(__name__)



class JointMappingError(ConfigError):
    """The dataset's joints cannot be mapped onto the sim robot as configured (one line in the CLI)."""


@dataclass
class JointMapping:
    """How a dataset's joints (and cameras) become the sim robot's.

    names: dataset joint -> sim joint; joints not listed map to the sim joint of the
        same name (a ``.pos`` suffix is ignored on both sides).
    scale / offset: per joint (dataset or sim name) or one number for every joint;
        ``sim = logged * scale + offset``. Radians to degrees is ``scale: 57.29577951``.
    cameras: dataset camera -> sim camera (used for counterfactual replay, whose
        policy expects the sim's camera names). Unlisted cameras keep their names.
    """

    names: dict[str, str] = field(default_factory=dict)
    # One number or {joint: number} (typed Any: the config system has no union of a number and a mapping).
    scale: Any = 1.0
    offset: Any = 0.0
    cameras: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for label in ("scale", "offset"):
            value = getattr(self, label)
            numbers = list(value.values()) if isinstance(value, dict) else [value]
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in numbers):
                raise ValueError(f"mapping.{label} must be a number or {{joint: number}}, got {value!r}")


@dataclass(frozen=True)
class JointMapper:
    """A resolved mapping: which logged column feeds each sim joint, and how it is scaled."""

    source_names: tuple[str, ...]  # the dataset's joint names, in its column order
    sim_names: tuple[str, ...]
    columns: np.ndarray  # [len(sim_names)] index into the dataset vector
    scale: np.ndarray  # [len(sim_names)]
    offset: np.ndarray
    unused: tuple[str, ...] = ()  # dataset joints no sim joint reads

    def to_sim(self, values: np.ndarray) -> np.ndarray:
        """[..., len(source_names)] in dataset units -> [..., len(sim_names)] float32 in sim units."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape[-1] != len(self.source_names):
            raise JointMappingError(
                f"got vectors of width {values.shape[-1]} but the dataset names {len(self.source_names)} "
                f"joints {list(self.source_names)}"
            )
        return (values[..., self.columns] * self.scale + self.offset).astype(np.float32)

    @property
    def is_identity(self) -> bool:
        return (
            list(self.columns) == list(range(len(self.source_names)))
            and bool(np.all(self.scale == 1.0))
            and bool(np.all(self.offset == 0.0))
        )


def build_mapper(mapping: JointMapping, source_names: Sequence[str], sim_names: Sequence[str]) -> JointMapper:
    """Resolve ``mapping`` for a dataset's joints; raise JointMappingError naming what does not fit."""
    source = tuple(source_names)
    sim = tuple(sim_names)
    bare_source = [joint_base_name(n) for n in source]
    bare_sim = [joint_base_name(n) for n in sim]
    renamed = {joint_base_name(k): joint_base_name(v) for k, v in mapping.names.items()}
    _check_known(renamed, bare_source, bare_sim)

    target_of = {name: renamed.get(name, name) for name in bare_source}
    feeds: dict[str, list[str]] = {}
    for name, target in target_of.items():
        if target in bare_sim:
            feeds.setdefault(target, []).append(name)
    doubled = {t: f for t, f in feeds.items() if len(f) > 1}
    if doubled:
        raise JointMappingError(f"several dataset joints map onto the same sim joint: {doubled}")
    missing = [s for s in bare_sim if s not in feeds]
    if missing:
        unmatched = [n for n in bare_source if target_of[n] not in bare_sim]
        raise JointMappingError(_unmatched_message(missing, unmatched, bare_sim))

    columns = np.array([bare_source.index(feeds[s][0]) for s in bare_sim])
    scale = _per_joint(mapping.scale, "scale", bare_sim, [feeds[s][0] for s in bare_sim], default=1.0)
    offset = _per_joint(mapping.offset, "offset", bare_sim, [feeds[s][0] for s in bare_sim], default=0.0)
    unused = tuple(n for n in bare_source if target_of[n] not in feeds)
    if unused:
        log.warning("dataset joints %s have no sim joint and are ignored", list(unused))
    return JointMapper(source, sim, columns, scale, offset, unused)


def map_camera(name: str, mapping: JointMapping) -> str:
    return mapping.cameras.get(name, name)


# ----------------------------------------------------------------------------- internals


def _check_known(renamed: Mapping[str, str], source: list[str], sim: list[str]) -> None:
    bad_keys = [k for k in renamed if k not in source]
    bad_values = [v for v in renamed.values() if v not in sim]
    if bad_keys or bad_values:
        raise JointMappingError(
            f"mapping.names refers to joints that do not exist: dataset joints {bad_keys} "
            f"(the dataset has {source}), sim joints {bad_values} (the sim has {sim})"
        )


def _unmatched_message(missing: list[str], unused: list[str], sim: list[str]) -> str:
    example = ", ".join(f"{u}: {m}" for u, m in zip(unused, missing, strict=False)) or "DATASET_JOINT: SIM_JOINT"
    return (
        f"the dataset's joints do not fit the sim robot: sim joints {missing} have no dataset joint, "
        f"and dataset joints {unused} match no sim joint (the sim has {sim}). "
        f"Map them, e.g. 'replay.mapping.names={{{example}}}', and convert units with "
        f"replay.mapping.scale / replay.mapping.offset (radians -> degrees: scale 57.29577951)"
    )


def _per_joint(
    value: float | Mapping[str, float], what: str, sim: list[str], source: list[str], default: float
) -> np.ndarray:
    """One number per sim joint from a scalar or a dict keyed by sim or dataset joint name."""
    if isinstance(value, (int, float)):
        return np.full(len(sim), float(value))
    by_name = {joint_base_name(k): float(v) for k, v in value.items()}
    unknown = [k for k in by_name if k not in sim and k not in source]
    if unknown:
        raise JointMappingError(f"mapping.{what} names unknown joints {unknown}; "
                                f"use sim {sim} or dataset {source} names")
    out = []
    for sim_name, source_name in zip(sim, source, strict=True):
        out.append(by_name.get(sim_name, by_name.get(source_name, default)))
    return np.array(out)
