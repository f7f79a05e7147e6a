"""Cameras for LeRobot robots: LeRobot's own camera configs from plain dicts, plus image files.

Real cameras are LeRobot's (``opencv``, ``intelrealsense``, ... through its registry): a
Hydra YAML entry ``{type: opencv, index_or_path: 0, width: 640, height: 480, fps: 30}``
becomes an ``OpenCVCameraConfig`` and LeRobot opens the device.

``image_files`` (``robot_rl.hardware.cameras.image_files``) is one more LeRobot camera type for a
camera that is not attached: it serves image files in a loop.
"""

from __future__ import annotations

from typing import Any

from lerobot.cameras import CameraConfig

from robot_rl.hardware.cameras.image_files import ImageFilesCamera, ImageFilesCameraConfig
from robot_rl.hardware.lerobot_registry import config_class

__all__ = ["ImageFilesCamera", "ImageFilesCameraConfig", "camera_configs_from_spec"]


def camera_configs_from_spec(spec: dict[str, dict[str, Any]] | None) -> dict[str, CameraConfig]:
    """``{name: {type: opencv, ...}}`` -> ``{name: <LeRobot CameraConfig>}``."""
    configs: dict[str, CameraConfig] = {}
    for name, entry in (spec or {}).items():
        entry = dict(entry)
        type_name = entry.pop("type", None)
        if type_name is None:
            raise ValueError(f"camera {name!r} needs a 'type' (opencv, intelrealsense, image_files, ...)")
        cls = config_class("cameras", CameraConfig, type_name)
        try:
            configs[name] = cls(**entry)
        except TypeError as exc:
            raise ValueError(f"camera {name!r} of type {type_name!r}: {exc}") from exc
    return configs


