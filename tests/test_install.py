"""The wheel, installed the way a lab installs it (not editable, into a fresh virtualenv), runs the sim.

Catches what the editable install of the test suite hides: a config, checkpoint or subpackage
left out of the wheel, a module that finds its data by walking up from ``__file__``, a generic
top-level package (``hardware``, ``policies``) landing in site-packages, and an import that needs
more than the extras a machine installed. uv installs from its cache, filled by ``make test``'s set-up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")


# What the wheel is built from: a copy, so that setuptools' build/ of an earlier build (which keeps
# files deleted from the source since) can never leak into this one.
SOURCES = ("setup.py", "pyproject.toml", "README.md", "robot_rl", "hardware", "policies", "bridges", "calibration",
           "configs", "checkpoints")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)],
                   check=True, capture_output=True, text=True, timeout=300)
    (built,) = out.glob("robot_rl-*.whl")
    return built


def test_the_wheel_holds_one_namespace_with_its_configs_and_checkpoint(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"robot_rl"}
    assert "robot_rl/configs/config.yaml" in names and "robot_rl/configs/robot/so101.yaml" in names
    assert "robot_rl/checkpoints/bc_push/model.safetensors" in names
    assert "robot_rl/hardware/sim/robot.py" in names and "robot_rl/bridges/zmq/codec.py" in names


@pytest.mark.slow
@pytest.mark.skipif(not UV.exists(), reason="uv is installed by make test's set-up")
def test_the_wheel_with_the_sim_extra_runs_demo_sim_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    subprocess.run([str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), f"{wheel}[sim]"],
                   check=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run([str(venv / "bin" / "robot-rl"), "demo-sim", "demo_sim.episodes=1"], cwd=tmp_path,
                         env={**env, "MUJOCO_GL": "egl"}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for family in ("pick", "push", "place"):
        assert family in run.stdout
    installed = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert not (installed / "hardware").exists() and not (installed / "policies").exists()
    assert not list(installed.glob("__editable__*"))
    shutil.rmtree(venv)
