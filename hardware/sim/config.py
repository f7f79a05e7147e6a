"""Configuration of the simulated SO-101 world.

``robot=sim_so101`` selects it (the default robot of every command).
"""

from __future__ import annotations

from dataclasses import dataclass

from robot_rl.core.registry import ROBOTS

RENDER_QUALITIES = ("fast", "full")


@ROBOTS.register("sim_so101", builder="robot_rl.hardware.sim.robot:SimSO101")
@dataclass
class SimConfig:
    """Everything that shapes one simulated SO-101 cell.

    ``fps`` fixes the control tick: every ``send_action`` advances physics by exactly
    ``1/fps`` seconds, using ``ceil((1/fps) / max_physics_dt)`` equal substeps, so sim
    time is tied to control ticks and runs are reproducible.
    """

    name: str = "sim_so101"
    fps: int = 30
    image_height: int = 96
    image_width: int = 96
    cameras: tuple[str, ...] = ("front", "wrist")
    # "fast": convex-hull visuals, no shadows, no multisampling (~1 ms/frame on llvmpipe).
    # "full": the stock 322k-face meshes with shadows and 4x multisampling (for figures).
    render_quality: str = "fast"
    # 10 s at 30 Hz: the scripted expert needs ~4-7 s, a policy gets some slack.
    max_episode_steps: int = 300
    seed: int = 0
    max_physics_dt: float = 0.002
    # Projected Gauss-Seidel noslip passes remove the creep of a pinched cube.
    noslip_iterations: int = 4
    # Per-episode random offset (degrees) around the home pose, so no two episodes
    # start from the very same arm configuration.
    initial_joint_noise_deg: float = 3.0

    def __post_init__(self) -> None:
        if self.fps <= 0:
            raise ValueError(f"fps must be positive, got {self.fps}")
        if self.image_height <= 0 or self.image_width <= 0:
            raise ValueError(
                f"image size must be positive, got {self.image_height}x{self.image_width}"
            )
        if self.render_quality not in RENDER_QUALITIES:
            raise ValueError(
                f"render_quality must be one of {RENDER_QUALITIES}, got {self.render_quality!r}"
            )
        unknown = [c for c in self.cameras if c not in ("front", "wrist")]
        if unknown:
            raise ValueError(f"unknown cameras {unknown}; the sim has 'front' and 'wrist'")
        if self.max_episode_steps <= 0:
            raise ValueError(f"max_episode_steps must be positive, got {self.max_episode_steps}")
        self.cameras = tuple(self.cameras)

    @property
    def substeps(self) -> int:
        """Physics steps per control tick (an integer, so a tick is exactly 1/fps s)."""
        control_dt = 1.0 / self.fps
        return max(1, int(-(-control_dt // self.max_physics_dt)))

    @property
    def physics_dt(self) -> float:
        return 1.0 / (self.fps * self.substeps)
