"""Lazy package exports: a package's names resolved on first use, not when the package is imported.

Why: importing one small module of a package (a config dataclass, the dataset reader) must not
pull in what its siblings import (MuJoCo, LeRobot's dataset code, pyarrow, PyTorch), which costs
about a second per process and is work an edge PC or the CLI's ``--help`` never needs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``package.<exports[name]>`` when
    ``name`` is first read. Use it as ``__getattr__ = lazy_exports(__name__, {...})``."""

    def __getattr__(name: str) -> object:  # noqa: N807 - the module hook Python looks for
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
