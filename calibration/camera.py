"""Camera intrinsics from ChArUco board images (OpenCV's aruco module).

A ChArUco board is a chessboard with ArUco markers in its white squares: each detected
corner has an id, so partial and oblique views still give exact 3D-2D correspondences,
which a plain chessboard cannot (it needs the whole board in view). Intrinsics come
from ``cv2.calibrateCamera`` on those correspondences; the RMS reprojection error (in
pixels) says how well the model fits: below ~0.5 px is a good calibration.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

log = logging.getLogger(__name__)


@dataclass
class CharucoBoardSpec:
    """The printed board: squares across and down, their size and the markers' size (metres)."""

    squares_x: int = 7
    squares_y: int = 5
    square_length_m: float = 0.04
    marker_length_m: float = 0.03
    dictionary: str = "DICT_5X5_100"

    def __post_init__(self) -> None:
        if self.marker_length_m >= self.square_length_m:
            raise ValueError("marker_length_m must be smaller than square_length_m")
        if not hasattr(cv2.aruco, self.dictionary):
            raise ValueError(f"unknown ArUco dictionary {self.dictionary!r} (e.g. DICT_5X5_100, DICT_4X4_50)")

    def board(self) -> cv2.aruco.CharucoBoard:
        dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, self.dictionary))
        return cv2.aruco.CharucoBoard(
            (self.squares_x, self.squares_y), self.square_length_m, self.marker_length_m, dictionary
        )


@dataclass
class CameraCalibration:
    """Pinhole intrinsics + distortion (OpenCV's 5-coefficient model) and how well they fit."""

    image_width: int
    image_height: int
    camera_matrix: list[list[float]]
    distortion: list[float]
    reprojection_error_px: float
    views_used: int
    views_rejected: int
    per_view_error_px: list[float] = field(default_factory=list)

    @property
    def K(self) -> np.ndarray:  # noqa: N802 - K is the usual name of the camera matrix
        return np.asarray(self.camera_matrix, dtype=np.float64)

    def save_yaml(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(asdict(self), sort_keys=False))
        return path

    @staticmethod
    def load_yaml(path: str | Path) -> CameraCalibration:
        return CameraCalibration(**yaml.safe_load(Path(path).read_text()))


class Undistorter:
    """Removes one camera's lens distortion from its frames with the intrinsics ``robot-rl calibrate
    camera`` measured. The remap tables are computed once (``initUndistortRectifyMap``), so a frame
    costs one ``cv2.remap`` (about a millisecond at 640x480), well inside a 33 ms tick."""

    def __init__(self, calibration: CameraCalibration, source: str = "") -> None:
        self.size = (calibration.image_height, calibration.image_width)
        self.source = source
        dist = np.asarray(calibration.distortion, dtype=np.float64)
        self._maps = cv2.initUndistortRectifyMap(calibration.K, dist, None, calibration.K,
                                                 (calibration.image_width, calibration.image_height), cv2.CV_16SC2)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if image.shape[:2] != self.size:
            raise ValueError(f"camera frame is {image.shape[1]}x{image.shape[0]} but the intrinsics {self.source} "
                             f"were calibrated at {self.size[1]}x{self.size[0]}; recalibrate at this size")
        return cv2.remap(image, self._maps[0], self._maps[1], cv2.INTER_LINEAR)


class UndistortingRobot:
    """A robot whose named cameras' frames come undistorted (``robot.undistort: {camera: intrinsics.yaml}``);
    everything else is the robot's own."""

    def __init__(self, robot: Any, intrinsics: dict[str, str]) -> None:
        unknown = sorted(set(intrinsics) - set(robot.camera_names))
        if unknown:
            raise ValueError(f"robot.undistort names cameras {unknown}; the robot has {list(robot.camera_names)}")
        self.robot = robot
        self.undistorters = {cam: Undistorter(CameraCalibration.load_yaml(path), str(path))
                             for cam, path in intrinsics.items()}

    def get_observation(self) -> Any:
        observation = self.robot.get_observation()
        images = dict(observation["images"])
        for cam, undistort in self.undistorters.items():
            images[cam] = undistort(images[cam])
        return {**observation, "images": images}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.robot, name)


class CalibrationError(RuntimeError):
    """Not enough usable views to calibrate; says how many were usable and why."""


def detect_corners(image: np.ndarray, spec: CharucoBoardSpec) -> tuple[np.ndarray, np.ndarray] | None:
    """(object points Nx3, image points Nx2) of the board's corners seen in ``image``; None if too few."""
    gray = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    board = spec.board()
    corners, ids, _, _ = cv2.aruco.CharucoDetector(board).detectBoard(gray)
    # Fewer than 6 corners cannot constrain a homography well (and calibrateCamera needs >= 4).
    if ids is None or len(ids) < 6:
        return None
    object_points, image_points = board.matchImagePoints(corners, ids)  # type: ignore[call-overload]  # cv2 stubs: Sequence[Mat]
    return object_points.reshape(-1, 3).astype(np.float32), image_points.reshape(-1, 2).astype(np.float32)


def calibrate_camera(images: list[np.ndarray], spec: CharucoBoardSpec, min_views: int = 5) -> CameraCalibration:
    """Intrinsics from board images (uint8 gray or RGB, all the same size)."""
    if not images:
        raise CalibrationError("no images given")
    h, w = images[0].shape[:2]
    object_points, image_points = [], []
    for i, image in enumerate(images):
        if image.shape[:2] != (h, w):
            raise CalibrationError(f"image {i} is {image.shape[1]}x{image.shape[0]}, the first is {w}x{h}")
        found = detect_corners(image, spec)
        if found is None:
            log.info("view %d: board not found (fewer than 6 corners)", i)
            continue
        object_points.append(found[0])
        image_points.append(found[1])
    if len(object_points) < min_views:
        raise CalibrationError(
            f"the board was found in only {len(object_points)} of {len(images)} images, need {min_views}; "
            "show the whole board from more angles and distances, in focus, without glare"
        )
    rms, matrix, dist, rvecs, tvecs = cv2.calibrateCamera(  # type: ignore[call-overload]  # cv2 stubs: no None
        object_points, image_points, (w, h), None, None)
    per_view = []
    for obj, img, rvec, tvec in zip(object_points, image_points, rvecs, tvecs, strict=True):
        projected, _ = cv2.projectPoints(obj, rvec, tvec, matrix, dist)
        per_view.append(float(np.sqrt(np.mean(np.sum((projected.reshape(-1, 2) - img) ** 2, axis=1)))))
    log.info("calibrated from %d views: RMS reprojection error %.3f px", len(object_points), rms)
    return CameraCalibration(
        image_width=int(w),
        image_height=int(h),
        camera_matrix=matrix.tolist(),
        distortion=dist.reshape(-1).tolist(),
        reprojection_error_px=float(rms),
        views_used=len(object_points),
        views_rejected=len(images) - len(object_points),
        per_view_error_px=per_view,
    )


def load_images(paths: list[str | Path]) -> list[np.ndarray]:
    """Read image files as RGB; a file that cannot be read is an error naming it."""
    images = []
    for path in paths:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise CalibrationError(f"cannot read image {path}")
        images.append(cv2.cvtColor(image, cv2.COLOR_BGR2RGB))
    return images
