"""Side-by-side replay videos: logged camera frames | sim render, over a timeline strip.

One MP4 (OpenCV, ``mp4v``) per episode, one video frame per logged step, so a frame
number in the video is a step index in the dataset. The strip under the images shows
the whole episode: red where a human intervened, a band per policy version (labelled),
and a cursor at the current step, so a reviewer sees where corrections happened.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

PANEL = 192  # pixel height of each camera panel
STRIP = 36  # pixel height of the timeline strip
LABEL = 16  # pixel height of the label row above the panels
INTERVENTION_BGR = (40, 40, 220)
VERSION_PALETTE_BGR = [(180, 130, 70), (90, 160, 60), (60, 140, 200), (160, 80, 160), (70, 170, 170)]


class ReplayVideoWriter:
    """Writes one composed frame per step; ``close`` finishes the file."""

    def __init__(
        self,
        path: str | Path,
        fps: int,
        interventions: np.ndarray,
        versions: np.ndarray,
        logged_cameras: list[str],
        sim_cameras: list[str],
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.length = len(interventions)
        self.labels = [f"logged {c}" for c in logged_cameras] + [f"sim {c}" for c in sim_cameras]
        self.width = _even(PANEL * max(1, len(self.labels)))
        self.height = _even(LABEL + PANEL + STRIP)
        self._strip = timeline_strip(np.asarray(interventions, bool), np.asarray(versions), self.width, STRIP)
        fourcc = cv2.VideoWriter.fourcc(*"mp4v")
        self._writer = cv2.VideoWriter(str(self.path), fourcc, float(fps), (self.width, self.height))
        if not self._writer.isOpened():
            raise RuntimeError(f"OpenCV could not open {self.path} for writing with the mp4v codec")
        self.frames_written = 0

    def write(self, step: int, logged: list[np.ndarray], sim: list[np.ndarray]) -> None:
        """Compose and append the frame of ``step`` from RGB images (logged cameras, then sim cameras)."""
        panels = [_panel(img) for img in [*logged, *sim]] or [np.zeros((PANEL, PANEL, 3), np.uint8)]
        row = np.concatenate(panels, axis=1)
        frame = np.zeros((self.height, self.width, 3), np.uint8)
        frame[LABEL : LABEL + PANEL, : row.shape[1]] = row[:, : self.width, ::-1]  # RGB -> BGR
        for i, label in enumerate(self.labels):
            cv2.putText(frame, label, (i * PANEL + 4, LABEL - 4), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 255), 1)
        strip = self._strip.copy()
        x = int(round(step / max(1, self.length - 1) * (self.width - 1)))
        cv2.line(strip, (x, 0), (x, STRIP - 1), (255, 255, 255), 2)
        frame[LABEL + PANEL : LABEL + PANEL + STRIP] = strip
        self._writer.write(frame)
        self.frames_written += 1

    def close(self) -> None:
        self._writer.release()

    def __enter__(self) -> ReplayVideoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def timeline_strip(interventions: np.ndarray, versions: np.ndarray, width: int, height: int) -> np.ndarray:
    """BGR strip: top half policy-version bands (labelled), bottom half interventions in red."""
    strip = np.full((height, width, 3), 30, np.uint8)
    n = max(1, len(interventions))
    half = height // 2
    for start, stop, version in _runs(versions):
        x0, x1 = _span(start, stop, n, width)
        colour = (80, 80, 80) if version < 0 else VERSION_PALETTE_BGR[int(version) % len(VERSION_PALETTE_BGR)]
        strip[:half, x0:x1] = colour
        if version >= 0 and x1 - x0 > 18:
            cv2.putText(strip, f"v{version}", (x0 + 2, half - 4), cv2.FONT_HERSHEY_SIMPLEX, 0.35, (255, 255, 255), 1)
    for start, stop, flag in _runs(interventions.astype(np.int64)):
        if flag:
            x0, x1 = _span(start, stop, n, width)
            strip[half:, x0:x1] = INTERVENTION_BGR
    return strip


def count_frames(path: str | Path) -> int:
    """Frames in a video file, counted by decoding (container headers can be wrong)."""
    capture = cv2.VideoCapture(str(path))
    frames = 0
    while capture.read()[0]:
        frames += 1
    capture.release()
    return frames


def _runs(values: np.ndarray) -> list[tuple[int, int, int]]:
    """Maximal runs of equal values as (start, stop, value)."""
    runs = []
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((start, i, int(values[start])))
            start = i
    return runs


def _span(start: int, stop: int, n: int, width: int) -> tuple[int, int]:
    x0 = int(start / n * width)
    return x0, max(x0 + 1, int(stop / n * width))


def _panel(image: np.ndarray) -> np.ndarray:
    """Fit an image into a PANEL x PANEL square, keeping its aspect ratio (black bars)."""
    image = np.asarray(image, np.uint8)
    h, w = image.shape[:2]
    scale = PANEL / max(h, w)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    resized = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_NEAREST if scale >= 1 else cv2.INTER_AREA)
    panel = np.zeros((PANEL, PANEL, 3), np.uint8)
    y0, x0 = (PANEL - new_h) // 2, (PANEL - new_w) // 2
    panel[y0 : y0 + new_h, x0 : x0 + new_w] = resized
    return panel


def _even(n: int) -> int:
    return n + (n % 2)
