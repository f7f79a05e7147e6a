"""How a recording stores its camera frames: PNG inside the parquet, or LeRobot's video encoding.

Why both: PNG is lossless and cheap for small frames (the sim's 96x96 cameras: a few ms a
frame), but its cost grows with the pixels: a 640x480 frame takes 60-80 ms of one core to
compress, so one robot with two such cameras at 30 Hz (60 frames/s) would need about four cores
for its PNGs alone. LeRobot's video encoding (one MP4 per camera, frames fed to the encoder as
they are added: ``streaming_encoding``) stores the same frames for ~8 ms each, in ~2 % of the
bytes, and training reads a whole episode back sequentially at hundreds of frames/s (``robot-rl
bench cameras``, BENCHMARKS.md "cameras"). It is lossy, so small frames, where PNG keeps up,
stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IMAGE_STORAGES = ("auto", "png", "video")
# "auto" picks video from this many pixels a frame on (QVGA, 320x240): real cameras' sizes,
# where PNG stops keeping up; below it (the sim's 96x96) frames stay lossless PNG.
VIDEO_FROM_PIXELS = 320 * 240


@dataclass
class FrameStorageConfig:
    """The image layout of a new dataset. A dataset that exists keeps the layout it was created
    with (its ``meta/info.json`` says which), whatever this says."""

    # "png" | "video" | "auto" (video for frames of VIDEO_FROM_PIXELS pixels or more).
    images: str = "auto"
    # LeRobot's video encoder settings (lerobot.configs.video.RGBEncoderConfig): h264 with the
    # ultrafast preset costs about half the CPU of LeRobot's default libsvtav1 per 640x480 frame,
    # what a learner storing four robots' cameras on a few cores needs; any codec PyAV has works.
    video_codec: str = "h264"
    video_preset: str | None = "ultrafast"  # codec-specific; a number for libsvtav1 (e.g. "12")
    video_crf: int = 30  # quality: lower is better and larger

    def __post_init__(self) -> None:
        if self.images not in IMAGE_STORAGES:
            raise ValueError(f"frames.images must be one of {IMAGE_STORAGES}, got {self.images!r}")
        if not 0 <= self.video_crf <= 63:
            raise ValueError(f"frames.video_crf must be in 0..63, got {self.video_crf}")

    def use_videos(self, cameras: dict[str, tuple[int, int]]) -> bool:
        """Whether a new dataset with these cameras (name -> (H, W)) stores video."""
        if self.images != "auto":
            return self.images == "video"
        return any(h * w >= VIDEO_FROM_PIXELS for h, w in cameras.values())

    def rgb_encoder(self) -> Any:
        """LeRobot's encoder settings (validated there: an unknown codec or preset is its error)."""
        from lerobot.configs.video import RGBEncoderConfig

        preset: int | str | None = self.video_preset
        if isinstance(preset, str) and preset.isdigit():
            preset = int(preset)
        return RGBEncoderConfig(vcodec=self.video_codec, preset=preset, crf=self.video_crf)
