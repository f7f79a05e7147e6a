"""``image_files``: a LeRobot camera type serving image files in a loop at the camera's fps.

Registered in LeRobot's own camera registry, it stands in for a camera that is not
attached (dry runs of a session on a desk, tests) and goes through exactly the code path
a real camera takes inside a LeRobot robot (connect, ``read_latest``, disconnect). LeRobot
finds the class next to its config by name (``ImageFilesCameraConfig`` -> ``ImageFilesCamera``
in the parent package), hence this module's place.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from lerobot.cameras import Camera, CameraConfig
from lerobot.utils.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError

log = logging.getLogger(__name__)


@CameraConfig.register_subclass("image_files")
@dataclass
class ImageFilesCameraConfig(CameraConfig):
    """Image files (PNG, JPEG) served in order, looping, as if a camera captured them."""

    paths: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.paths:
            raise ValueError("image_files camera needs at least one path")


class ImageFilesCamera(Camera):
    """LeRobot ``Camera`` over image files; a background thread "captures" at ``fps``."""

    # Set by LeRobot's Camera from the config; filled in from the first file when not given.
    height: int | None
    width: int | None
    fps: int | None

    def __init__(self, config: ImageFilesCameraConfig) -> None:
        super().__init__(config)
        self.config = config
        self._frames: list[np.ndarray] = []
        self._latest: np.ndarray | None = None
        self._latest_t = 0.0
        self._new = threading.Event()
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def __str__(self) -> str:
        return f"ImageFilesCamera({len(self.config.paths)} files)"

    @property
    def is_connected(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @staticmethod
    def find_cameras() -> list[dict[str, Any]]:
        return []

    def connect(self, warmup: bool = True) -> None:
        if self.is_connected:
            raise DeviceAlreadyConnectedError(f"{self} is already connected")
        self._frames = [self._load(Path(p)) for p in self.config.paths]
        h, w = self._frames[0].shape[:2]
        self.height, self.width = self.height or h, self.width or w
        self.fps = self.fps or 30
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=str(self), daemon=True)
        self._thread.start()
        if not self._new.wait(timeout=2.0):
            raise ConnectionError(f"{self} produced no frame within 2 s")

    def _load(self, path: Path) -> np.ndarray:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise ConnectionError(f"cannot read image file {path}")
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        if self.height and self.width and image.shape[:2] != (self.height, self.width):
            raise RuntimeError(f"{path} is {image.shape[1]}x{image.shape[0]}, "
                               f"camera configured {self.width}x{self.height}")
        return image

    def _loop(self) -> None:
        assert self._stop is not None
        period = 1.0 / float(self.fps or 30)
        index = 0
        while not self._stop.is_set():
            with self._lock:
                self._latest = self._frames[index % len(self._frames)]
                self._latest_t = time.perf_counter()
            self._new.set()
            index += 1
            self._stop.wait(period)

    def _require(self) -> None:
        if not self.is_connected:
            raise DeviceNotConnectedError(f"{self} is not connected")

    def read(self) -> np.ndarray:
        self._require()
        self._new.clear()
        return self.async_read(timeout_ms=1000)

    def async_read(self, timeout_ms: float = 200) -> np.ndarray:
        self._require()
        if not self._new.wait(timeout=timeout_ms / 1000.0):
            raise TimeoutError(f"{self}: no new frame within {timeout_ms} ms")
        with self._lock:
            self._new.clear()
            assert self._latest is not None
            return self._latest.copy()

    def read_latest(self, max_age_ms: int = 500) -> np.ndarray:
        self._require()
        with self._lock:
            frame, stamp = self._latest, self._latest_t
        if frame is None:
            raise RuntimeError(f"{self} has not captured any frame yet")
        age_ms = (time.perf_counter() - stamp) * 1e3
        if age_ms > max_age_ms:
            raise TimeoutError(f"{self} latest frame is {age_ms:.0f} ms old (max {max_age_ms} ms)")
        return frame.copy()

    def frame_age_s(self) -> float:
        """Seconds since the latest frame was captured (used by the latency calibration)."""
        with self._lock:
            return time.perf_counter() - self._latest_t

    def disconnect(self) -> None:
        if self._thread is None:
            raise DeviceNotConnectedError(f"{self} is not connected")
        assert self._stop is not None
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._thread = None
        self._new.clear()
