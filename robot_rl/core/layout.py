"""``RecordedLayout``: what one robot records per step (control rate, joints, cameras and their
image sizes), which is what a dataset of its episodes is created with. An edge says it in its
hello (``Hello.features``), and the learner's store adopts the first robot's and refuses robots
that differ (``robot_rl.learner.layout``); the demonstration process sends it the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RecordedLayout:
    fps: int
    joint_names: tuple[str, ...]
    camera_shapes: dict[str, tuple[int, int]]  # camera -> (H, W)

    @property
    def cameras(self) -> tuple[str, ...]:
        return tuple(self.camera_shapes)

    def cameras_text(self) -> str:
        return "[" + ", ".join(f"{c} {h}x{w}" for c, (h, w) in self.camera_shapes.items()) + "]"

    def describe(self) -> str:
        return f"{self.fps} fps, joints {list(self.joint_names)}, cameras {self.cameras_text()}"

    def to_document(self) -> dict[str, Any]:
        """The hello's ``features`` and the layout file's content."""
        return {"fps": self.fps, "joint_names": list(self.joint_names),
                "cameras": {c: [h, w] for c, (h, w) in self.camera_shapes.items()}}

    @classmethod
    def from_document(cls, doc: Any) -> RecordedLayout:
        """Parse a hello's ``features``; ValueError for anything malformed."""
        try:
            fps = int(doc["fps"])
            joints = tuple(str(j) for j in doc["joint_names"])
            cameras = {str(c): (int(s[0]), int(s[1])) for c, s in dict(doc["cameras"]).items()}
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"malformed features {doc!r}: {exc}") from exc
        if fps <= 0 or not joints or any(h <= 0 or w <= 0 for h, w in cameras.values()):
            raise ValueError(f"features need fps > 0, joints and positive image sizes, got {doc!r}")
        return cls(fps, joints, cameras)

    @classmethod
    def of_robot(cls, robot: Any) -> RecordedLayout:
        """A connected robot's layout: its ``camera_shapes`` (H, W) where it has them, else the
        image features it declares (LeRobot style: ``{"front": (H, W, 3)}``)."""
        shapes = getattr(robot, "camera_shapes", None)
        if shapes is None:
            features = robot.observation_features
            shapes = {cam: (features[cam][0], features[cam][1]) for cam in robot.camera_names}
        return cls(int(robot.fps), tuple(robot.joint_names), {c: (int(h), int(w)) for c, (h, w) in shapes.items()})
