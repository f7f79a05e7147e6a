"""Building blocks that turn inputs into tokens: camera images, and the flow time t.

Images go through one small CNN shared by all cameras; a learned camera embedding tells
the transformer which camera a token came from, and a learned position embedding where
in the image_grid x image_grid feature grid it sits. A few tokens per camera keep the
context short, so the model runs on a CPU at control rates.

Average-pooling to a coarse grid blurs *where* a small object is (a 2.5 cm cube is a few
pixels in a 64x64 front view; one grid cell spans ~5 cm of table). A spatial-softmax
head (Levine et al., 2016, "End-to-End Training of Deep Visuomotor Policies") adds one
token per camera made of K expected (x, y) image coordinates, each the soft-argmax of a
learned feature map: sub-cell precise, which is what reaching for a cube needs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's convention
from torch import nn


def images_to_float(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [B,H,W,3] (or float in 0..1, channels last or first) -> float [B,3,size,size] in -1..1."""
    if images.ndim != 4:
        raise ValueError(f"images must be a batch [B,H,W,3], got shape {tuple(images.shape)}")
    if images.shape[-1] == 3:
        images = images.permute(0, 3, 1, 2)
    elif images.shape[1] != 3:
        raise ValueError(f"images must have 3 colour channels (HxWx3), got shape {tuple(images.shape)}")
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return x * 2.0 - 1.0


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ-style augmentation (Kostrikov et al., 2020): shift each image by up to ``pad`` pixels.

    Edges are replicated and the image is cropped back at a random offset per image, so the
    policy cannot memorise pixel positions and must read where the cube is relative to the arm.
    ``images``: [B, n_cams, 3, S, S] floats; uses torch's global generator (training only).
    """
    if pad <= 0:
        return images
    b, n, c, h, w = images.shape
    flat = F.pad(images.reshape(b * n, c, h, w), (pad, pad, pad, pad), mode="replicate")
    offset_y = torch.randint(0, 2 * pad + 1, (b * n, 1), device=images.device)
    offset_x = torch.randint(0, 2 * pad + 1, (b * n, 1), device=images.device)
    rows = torch.arange(h, device=images.device)[None, :] + offset_y  # [BN, h]
    cols = torch.arange(w, device=images.device)[None, :] + offset_x  # [BN, w]
    index = torch.arange(b * n, device=images.device)[:, None, None, None]
    channel = torch.arange(c, device=images.device)[None, :, None, None]
    shifted = flat[index, channel, rows[:, None, :, None], cols[:, None, None, :]]
    return shifted.reshape(b, n, c, h, w)


class SpatialSoftmax(nn.Module):
    """Feature map [N, C, h, w] -> K soft-argmax keypoints [N, 2K] in -1..1 image coordinates."""

    def __init__(self, channels: int, keypoints: int):
        super().__init__()
        self.to_maps = nn.Conv2d(channels, keypoints, 1)
        self.log_temperature = nn.Parameter(torch.zeros(()))  # learned sharpness of every map

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        maps = self.to_maps(features)  # [N, K, h, w]
        n, k, h, w = maps.shape
        attention = torch.softmax(maps.flatten(2) / self.log_temperature.exp(), dim=-1)  # [N, K, h*w]
        ys = torch.linspace(-1.0, 1.0, h, device=maps.device, dtype=maps.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=maps.device, dtype=maps.dtype)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        expected_x = (attention * grid_x.reshape(1, 1, -1)).sum(-1)
        expected_y = (attention * grid_y.reshape(1, 1, -1)).sum(-1)
        return torch.cat([expected_x, expected_y], dim=-1)  # [N, 2K]


class ImageEncoder(nn.Module):
    """Shared CNN: [B, n_cams, 3, S, S] -> [B, n_cams * tokens_per_camera, d_model] tokens.

    tokens_per_camera = grid**2, plus one keypoint token when ``keypoints`` > 0.
    """

    def __init__(self, n_cameras: int, channels: tuple[int, ...], grid: int, d_model: int, keypoints: int = 0,
                 film_dim: int = 0):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for i, c_out in enumerate(channels):
            stride = 2 if i < 3 else 1  # downsample 8x, then refine at that resolution
            kernel = 5 if i == 0 else 3
            layers += [
                nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2),
                nn.GroupNorm(min(8, c_out), c_out),  # per-sample: batch composition never changes a prediction
                nn.SiLU(),
            ]
            c_in = c_out
        self.cnn = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(grid)
        self.proj = nn.Linear(c_in, d_model)
        self.keypoints = None
        if keypoints > 0:
            self.keypoints = SpatialSoftmax(c_in, keypoints)
            self.keypoint_proj = nn.Sequential(nn.Linear(2 * keypoints, d_model), nn.SiLU(),
                                               nn.Linear(d_model, d_model))
        # FiLM (Perez et al. 2018; as in RT-1): the instruction scales and shifts every feature map,
        # so the keypoints can follow "the red cube" rather than every cube. Zero-initialised: identity.
        self.film = None
        if film_dim > 0:
            self.film = nn.Linear(film_dim, 2 * c_in)
            nn.init.zeros_(self.film.weight)
            nn.init.zeros_(self.film.bias)
        tokens_per_camera = grid * grid + (1 if keypoints > 0 else 0)
        self.position = nn.Parameter(torch.randn(tokens_per_camera, d_model) * 0.02)
        self.camera = nn.Parameter(torch.randn(n_cameras, d_model) * 0.02)

    def forward(self, images: torch.Tensor, condition: torch.Tensor | None = None) -> torch.Tensor:
        """``condition`` [B, film_dim] (the instruction) is required when the encoder has FiLM."""
        b, n_cams = images.shape[:2]
        features = self.cnn(images.flatten(0, 1))  # [B*n, C, h, w]
        if self.film is not None:
            if condition is None:
                raise ValueError("this image encoder is instruction-conditioned (FiLM): pass the instruction")
            scale, shift = self.film(condition).repeat_interleave(n_cams, dim=0)[:, :, None, None].chunk(2, dim=1)
            features = features * (1.0 + scale) + shift
        tokens = self.proj(self.pool(features).flatten(2).transpose(1, 2))  # [B*n, g*g, d]
        if self.keypoints is not None:
            keypoint_token = self.keypoint_proj(self.keypoints(features))[:, None]  # [B*n, 1, d]
            tokens = torch.cat([tokens, keypoint_token], dim=1)
        tokens = tokens.view(b, n_cams, -1, tokens.shape[-1])
        tokens = tokens + self.position[None, None] + self.camera[None, :, None]
        return tokens.flatten(1, 2)


class TimeEmbedding(nn.Module):
    """Flow time t in [0, 1] -> d_model vector (sinusoidal features + MLP)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model
        self.mlp = nn.Sequential(nn.Linear(d_model, d_model), nn.SiLU(), nn.Linear(d_model, d_model))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.d_model // 2
        freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        angles = 1000.0 * t.float()[:, None] * freqs[None]  # scale so that small changes of t are visible
        feats = torch.cat([angles.sin(), angles.cos()], dim=-1)
        if feats.shape[-1] < self.d_model:
            feats = F.pad(feats, (0, self.d_model - feats.shape[-1]))
        return self.mlp(feats)
