"""Offscreen camera rendering for the sim (EGL by default, so it runs headless).

One ``mujoco.Renderer`` serves every camera: all cameras share one image size, and a
GL context per camera would only cost memory. It is created on first use, so runs
that never look at images (expert benchmarks, state-only training) open no GL context.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco
import numpy as np


class CameraRenderer:
    """Renders named cameras of one model to uint8 HxWx3 arrays."""

    def __init__(self, model: mujoco.MjModel, height: int, width: int) -> None:
        self._model = model
        self._height = height
        self._width = width
        self._renderer: mujoco.Renderer | None = None

    def render(self, data: mujoco.MjData, cameras: tuple[str, ...]) -> dict[str, np.ndarray]:
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self._model, height=self._height, width=self._width)
        images = {}
        for cam in cameras:
            self._renderer.update_scene(data, camera=cam)
            images[cam] = self._renderer.render().copy()
        return images

    def close(self) -> None:
        """Free the GL context now; left to the garbage collector, EGL complains at exit."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
