"""Package layout (everything else is in pyproject.toml).

The top-level folders the design names (``hardware/``, ``policies/``, ``bridges/``,
``calibration/``) are installed under the one ``robot_rl`` namespace, so nothing generic
such as ``hardware`` or ``policies`` lands in site-packages; ``configs/`` and the shipped
``checkpoints/`` travel inside the wheel as package data, so a non-editable install runs.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "robot_rl.hardware": "hardware",
    "robot_rl.policies": "policies",
    "robot_rl.bridges": "bridges",
    "robot_rl.calibration": "calibration",
    "robot_rl.configs": "configs",
    "robot_rl.checkpoints": "checkpoints",
}

packages = find_packages(include=["robot_rl", "robot_rl.*"])
for package, folder in FOLDERS.items():
    packages += [package, *(f"{package}.{sub}" for sub in find_packages(folder))]

setup(
    packages=packages,
    package_dir=FOLDERS,
    package_data={"robot_rl.configs": ["**/*.yaml"], "robot_rl.checkpoints": ["**/*.json", "**/*.safetensors"],
                  "robot_rl.learner": ["console_page.html"]},
)
