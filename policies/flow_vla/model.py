"""FlowVLA: a small flow-matching vision-language-action policy that predicts action chunks.

Data flow:
    cameras --CNN--> image tokens ┐
    instruction --MiniLM--> token ├─ context transformer ─> context tokens
    (rolled-forward) state -> token┘                              │ cross-attention
    noisy chunk x_t [H, A] + flow time t ──> action expert ──> velocity v(x_t, t)

Training regresses v onto (actions - noise) along the straight path
x_t = (1 - t) * noise + t * actions (rectified flow / flow matching). Inference starts
from Gaussian noise at t = 0 and takes ``num_integration_steps`` Euler steps to t = 1;
the context is computed once and reused by every step.

All network inputs/outputs are normalised; ``predict_chunk`` speaks robot units.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from robot_rl.policies.flow_vla import checkpoint
from robot_rl.policies.flow_vla.config import FlowVLAConfig, FlowVLAPolicyConfig
from robot_rl.policies.flow_vla.encoders import ImageEncoder, TimeEmbedding, images_to_float, random_shift
from robot_rl.policies.flow_vla.normalization import Normalizer
from robot_rl.policies.text_encoder import InstructionEncoder
from robot_rl.policies.trainable import InputFrames, StateOffsets, TrainablePolicy, weighted_mean
from robot_rl.policies.wordings import InstructionVariants

Batch = dict[str, Any]


class FlowVLA(TrainablePolicy):
    """The project's VLA; implements ``robot_rl.policies.trainable.TrainablePolicy``."""

    def __init__(self, config: FlowVLAConfig | None = None, text_encoder: InstructionEncoder | None = None):
        super().__init__()
        self.config = config = config or FlowVLAConfig()
        self._text_encoder = text_encoder  # not a submodule: frozen, shared, outside state_dict
        self._instruction_variants: InstructionVariants | None = None
        self._rtc: Any = None  # LeRobot's RTCProcessor, built on the first guided chunk
        d = config.d_model

        self.normalizer = Normalizer(config.state_dim, config.action_dim,
                                     config.text_dim if config.normalize_instruction else None)
        self.image_encoder = ImageEncoder(len(config.cameras), config.cnn_channels, config.image_grid, d,
                                          keypoints=config.keypoints,
                                          film_dim=config.text_dim if config.film_instruction else 0)
        self.text_proj = nn.Linear(config.text_dim, d)
        self.state_proj = nn.Linear(config.state_dim, d)
        self.context = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, config.n_heads, d * config.ffn_mult, config.dropout,
                                       activation="gelu", batch_first=True, norm_first=True),
            config.n_layers, norm=nn.LayerNorm(d), enable_nested_tensor=False,
        )
        self.action_in = nn.Linear(config.action_dim, d)
        self.action_position = nn.Parameter(torch.randn(config.chunk_size, d) * 0.02)
        self.time_embedding = TimeEmbedding(d)
        self.expert = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(d, config.n_heads, d * config.ffn_mult, config.dropout,
                                       activation="gelu", batch_first=True, norm_first=True),
            config.n_expert_layers, norm=nn.LayerNorm(d),
        )
        self.action_out = nn.Linear(d, config.action_dim)

    # ------------------------------------------------------------------ protocol attributes
    @property
    def chunk_size(self) -> int:
        return self.config.chunk_size

    @property
    def action_dim(self) -> int:
        return self.config.action_dim

    @property
    def cameras(self) -> tuple[str, ...]:
        return tuple(self.config.cameras)

    @property
    def input_frames(self) -> dict[str, InputFrames]:
        """Every camera at image_size x image_size, stretched as ``images_to_float`` does."""
        return {cam: InputFrames(self.config.image_size, self.config.image_size) for cam in self.config.cameras}

    @property
    def state_dim(self) -> int:
        return self.config.state_dim

    @property
    def state_offsets(self) -> StateOffsets:
        return StateOffsets(self.config.max_state_offset, self.config.offset_weights)

    @property
    def training_horizon(self) -> int:
        return self.config.chunk_size

    @property
    def device(self) -> torch.device:
        return self.action_position.device

    @property
    def text_encoder(self) -> InstructionEncoder:
        if self._text_encoder is None:
            self._text_encoder = InstructionEncoder.shared()
        return self._text_encoder

    def config_hash(self) -> str:
        return self.config.config_hash()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return self.parameters()  # the sentence encoder is outside the module: everything here trains

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        return self.state_dict()  # every tensor trains (the normaliser's statistics are buffers: they travel too)

    def needs_statistics(self) -> bool:
        return not self.normalizer.fitted

    def fit_statistics(self, states: np.ndarray, actions: np.ndarray, instructions: Sequence[str]) -> None:
        """Fit the normaliser on training data: states/actions [N, dim] and the instructions seen."""
        self.normalizer.fit(states, actions)
        if self.config.normalize_instruction:
            # With augmentation the statistics cover every wording, so what varies only between
            # wordings of one task is not blown up into a difference the network must learn to ignore.
            variants = self.instruction_variants
            distinct = sorted(set(variants.all_wordings(instructions) if variants else instructions))
            self.normalizer.fit_text(self.text_encoder.encode_batch(distinct).cpu().numpy())

    # ------------------------------------------------------------------ network
    def encode_context(self, images: torch.Tensor, state: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """images [B, n_cams, 3, S, S] in -1..1, normalised state [B, state_dim], text [B, text_dim] -> [B, L, d]."""
        text = self.normalizer.normalize_text(text)
        tokens = torch.cat(
            [self.image_encoder(images, text), self.text_proj(text)[:, None], self.state_proj(state)[:, None]], dim=1
        )
        return self.context(tokens)

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Predicted velocity dx/dt for noisy normalised chunks x_t [B, H, A] at flow times t [B]."""
        tokens = self.action_in(x_t) + self.action_position[None] + self.time_embedding(t)[:, None]
        return self.action_out(self.expert(tokens, context))

    @torch.no_grad()
    def sample(self, context: torch.Tensor, noise: torch.Tensor, steps: int | None = None,
               prefix: torch.Tensor | None = None, delay: int = 0) -> torch.Tensor:
        """Euler-integrate the velocity field from noise (t=0) to normalised actions (t=1).

        ``steps`` overrides ``num_integration_steps`` (a learner scoring many candidates can
        afford fewer, coarser steps than the robot's controller). With ``prefix`` [B, T, A]
        (normalised actions the robot executes while this chunk is computed) every step is
        guided so that the first ``delay`` actions agree with it: real-time chunking (Black et
        al. 2025), LeRobot's ``RTCProcessor``."""
        steps = self.config.num_integration_steps if steps is None else int(steps)
        if steps < 1:
            raise ValueError(f"sample: steps must be >= 1, got {steps}")
        x = noise
        for k in range(steps):
            t = torch.full((x.shape[0],), k / steps, device=x.device)
            v = self.velocity(x, t, context) if prefix is None else self._guided_velocity(x, t, context, prefix, delay)
            x = x + v / steps
        return x

    def _guided_velocity(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor, prefix: torch.Tensor,
                         delay: int) -> torch.Tensor:
        # LeRobot's flow time runs from the data (0) to the noise (1) and its velocity points at the
        # noise: its time is 1 - t and its velocity is ours negated (predicted actions x + (1 - t) v alike).
        if self._rtc is None:
            from lerobot.policies.rtc.configuration_rtc import RTCConfig
            from lerobot.policies.rtc.modeling_rtc import RTCProcessor

            self._rtc = RTCProcessor(RTCConfig(execution_horizon=self.chunk_size))
        guided = self._rtc.denoise_step(x, prefix, delay, 1.0 - float(t[0]),
                                        lambda x_t: -self.velocity(x_t, t, context), execution_horizon=self.chunk_size)
        return -guided

    # ------------------------------------------------------------------ inputs
    def _images_from(self, get_camera) -> torch.Tensor:
        """Stack all configured cameras into [B, n_cams, 3, S, S] on the model's device."""
        per_camera = []
        for cam in self.config.cameras:
            frames = torch.as_tensor(get_camera(cam)).to(self.device, non_blocking=True)
            per_camera.append(images_to_float(frames, self.config.image_size))
        return torch.stack(per_camera, dim=1)

    def train(self, mode: bool = True) -> FlowVLA:
        if mode and self.config.instruction_variants is not None:
            _ = self.instruction_variants  # a missing or bad table fails when training starts, not mid-update
        return super().train(mode)

    @property
    def instruction_variants(self) -> InstructionVariants | None:
        """The wordings training reads (``config.instruction_variants``), loaded on first use (inference never
        needs them)."""
        if self._instruction_variants is None and self.config.instruction_variants is not None:
            self._instruction_variants = InstructionVariants.load(self.config.instruction_variants,
                                                                  self.config.instruction_augmentation)
        return self._instruction_variants

    def _text_from(self, batch: Batch, wording_draw: torch.Tensor | None = None) -> torch.Tensor:
        """The instruction embeddings [B, text_dim]; with ``wording_draw`` [B] some rows read another wording."""
        # Only a training draw reads the table: a robot never needs the file the learner trained with.
        if wording_draw is not None and "instruction" in batch and (variants := self.instruction_variants):
            reworded = variants.reword(list(batch["instruction"]), wording_draw)
            return self.text_encoder.encode_batch(reworded).to(self.device)
        if "instruction_embedding" in batch:
            return torch.as_tensor(batch["instruction_embedding"], dtype=torch.float32).to(self.device)
        if "instruction" in batch:
            return self.text_encoder.encode_batch(list(batch["instruction"])).to(self.device)
        raise KeyError("batch needs 'instruction' (list[str]) or 'instruction_embedding' [B, text_dim]")

    def _context_from_batch(self, batch: Batch, wording_draw: torch.Tensor | None = None) -> torch.Tensor:
        def camera(cam: str) -> Any:
            key = f"images.{cam}"
            if key not in batch:
                raise KeyError(f"batch is missing {key!r}; this model expects cameras {list(self.config.cameras)}")
            return batch[key]

        state = torch.as_tensor(batch["state"], dtype=torch.float32).to(self.device)
        images = self._images_from(camera)
        state = self.normalizer.normalize_state(state)
        if self.training:
            images = random_shift(images, self.config.image_shift_pixels)
            # Noise on the state input keeps the policy from reading the task off the proprio
            # alone (the arm starts at the same pose in every episode: only images say where to go).
            state = state + self.config.state_noise_std * torch.randn_like(state)
        return self.encode_context(images, state, self._text_from(batch, wording_draw))

    # ------------------------------------------------------------------ training
    def compute_loss(
        self,
        batch: Batch,
        weights: torch.Tensor | None = None,
        *,
        noise: torch.Tensor | None = None,
        flow_time: torch.Tensor | None = None,
        wording_draw: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Flow-matching loss: (sum_i w_i * l_i / sum_i w_i, per-sample l [B]).

        ``l_i`` is the mean squared velocity error over the sample's non-padded steps
        (``action_is_pad`` True = past the episode end, no loss). ``noise``/``flow_time``
        may be fixed for reproducible evaluation; by default they are drawn fresh.
        ``wording_draw`` [B] (uniform in [0, 1)) rewords instructions when instruction
        augmentation is configured; in training mode it is drawn fresh when not given.
        """
        actions = torch.as_tensor(batch["actions"], dtype=torch.float32).to(self.device)
        expected = (self.chunk_size, self.action_dim)
        if actions.ndim != 3 or tuple(actions.shape[1:]) != expected:
            raise ValueError(f"batch['actions'] must be [B, {expected[0]}, {expected[1]}], got {tuple(actions.shape)}")
        b = actions.shape[0]
        is_pad = batch.get("action_is_pad")
        is_pad = (torch.zeros(actions.shape[:2], dtype=torch.bool) if is_pad is None
                  else torch.as_tensor(is_pad, dtype=torch.bool)).to(self.device)

        target = self.normalizer.normalize_action(actions)
        noise = torch.randn_like(target) if noise is None else noise.to(self.device)
        t = self._sample_flow_time(b) if flow_time is None else flow_time.to(self.device, torch.float32)
        x_t = (1 - t)[:, None, None] * noise + t[:, None, None] * target

        if wording_draw is None and self.training and self.instruction_variants is not None:
            wording_draw = torch.rand(b)
        pred = self.velocity(x_t, t, self._context_from_batch(batch, wording_draw))
        per_sample = masked_mse_per_sample(pred, target - noise, is_pad)
        return weighted_mean(per_sample, weights), per_sample

    def draw_training_randomness(self, batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Flow noise [B, H, A] and times [B] from ``generator``, by the same law as ``_sample_flow_time``."""
        noise = torch.randn((batch_size, self.chunk_size, self.action_dim), generator=generator)
        u = torch.rand(batch_size, generator=generator)
        # "beta": Beta(1.5, 1) by inverse CDF (u ** (1/1.5)), mapped like _sample_flow_time.
        flow_time = 1.0 - u.pow(1.0 / 1.5) * 0.999 if self.config.flow_time_sampling == "beta" else u
        randomness = {"noise": noise.to(self.device), "flow_time": flow_time.to(self.device)}
        if self.config.instruction_variants is not None:
            randomness["wording_draw"] = torch.rand(batch_size, generator=generator)
        return randomness

    def _sample_flow_time(self, n: int) -> torch.Tensor:
        if self.config.flow_time_sampling == "beta":
            # Denser near t=0 (pure noise), where predicting the velocity is hardest (as in pi0).
            return 1.0 - torch.distributions.Beta(1.5, 1.0).sample((n,)).to(self.device) * 0.999
        return torch.rand(n, device=self.device)

    # ------------------------------------------------------------------ inference
    def predict_chunk(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str,
                      *, seed: int | None = None) -> np.ndarray:
        """Images by camera (uint8 HxWx3), state (robot units) -> float32[H, action_dim] in robot units."""
        states = np.asarray(state, dtype=np.float32)[None]
        return self.predict_chunks([observation], states, [instruction], seed=seed)[0]

    def predict_chunk_guided(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str,
                             prefix: np.ndarray, delay: int) -> np.ndarray:
        """A chunk starting now whose first ``delay`` actions are guided onto ``prefix`` (robot units; what
        the queue executes while this chunk is computed): ``edge.real_time_chunking``."""
        frozen = np.asarray(prefix, dtype=np.float32)[: self.chunk_size]
        if frozen.ndim != 2 or frozen.shape[1] != self.action_dim:
            raise ValueError(f"prefix must be [T, {self.action_dim}], got {frozen.shape}")
        normalized = self.normalizer.normalize_action(torch.from_numpy(frozen).to(self.device))[None]
        states = np.asarray(state, dtype=np.float32)[None]
        return self.predict_chunks([observation], states, [instruction], prefix=normalized,
                                   delay=int(min(delay, len(frozen))))[0]

    def predict_chunks(self, observations: Sequence[dict[str, np.ndarray]], states: np.ndarray,
                       instructions: Sequence[str], *, seed: int | None = None, prefix: torch.Tensor | None = None,
                       delay: int = 0, noise: torch.Tensor | None = None) -> np.ndarray:
        """Batched ``predict_chunk``: B observations -> float32[B, H, action_dim].

        ``seed`` (or ``config.inference_seed``) fixes the initial noise, making the output a
        deterministic function of the inputs and weights, on any device. ``prefix``/``delay``:
        real-time chunking (``sample``). ``noise`` [B, H, A]: the initial noise itself (a policy server
        draws each robot's row from that robot's own generator, so a chunk does not depend on the batch).
        """
        states = np.asarray(states, dtype=np.float32)
        if states.shape != (len(observations), self.config.state_dim):
            raise ValueError(f"states must be [{len(observations)}, {self.config.state_dim}], got {states.shape}")
        if len(instructions) != len(observations):
            raise ValueError(f"got {len(observations)} observations but {len(instructions)} instructions")

        def camera(cam: str) -> np.ndarray:
            try:
                return np.stack([obs[cam] for obs in observations])
            except KeyError:
                raise KeyError(f"observation is missing camera {cam!r}; this model expects "
                               f"{list(self.config.cameras)}, got {sorted(observations[0])}") from None

        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                text = self.text_encoder.encode_batch(list(instructions)).to(self.device)
                state = self.normalizer.normalize_state(torch.from_numpy(states).to(self.device))
                context = self.encode_context(self._images_from(camera), state, text)
                noise = self._initial_noise(len(observations), seed) if noise is None else noise.to(self.device)
                actions = self.normalizer.unnormalize_action(self.sample(context, noise, prefix=prefix, delay=delay))
        finally:
            self.train(was_training)
        return actions.float().cpu().numpy()

    def reseed_noise(self, seed: int | None) -> None:
        """Draw the initial noise of the following chunks from a stream seeded with ``seed``
        (None: back to fresh noise). Evaluations re-seed it per episode, so an episode is
        reproducible and two policies meet the same noise on the same seed, while chunks
        within the episode still get different noise (one fixed draw biases every chunk
        the same way)."""
        self._noise_stream = None if seed is None else torch.Generator().manual_seed(int(seed))

    def _initial_noise(self, batch_size: int, seed: int | None) -> torch.Tensor:
        """Precedence: an explicit ``seed``, the episode's noise stream, ``config.inference_seed``, fresh noise."""
        shape = (batch_size, self.chunk_size, self.action_dim)
        stream = getattr(self, "_noise_stream", None)
        if seed is None and stream is not None:
            return torch.randn(shape, generator=stream).to(self.device)
        seed = self.config.inference_seed if seed is None else seed
        if seed is None:
            return torch.randn(shape, device=self.device)
        # Drawn on the CPU so the same seed gives the same noise on every device.
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(self.device)

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``model.safetensors`` + ``config.json`` (Hugging Face layout) into ``directory``."""
        checkpoint.write_checkpoint(directory, self.config, self.state_dict(), self.normalizer.to_dict())

    @classmethod
    def from_policy_config(cls, config: FlowVLAPolicyConfig) -> FlowVLA:
        """``policy=flow_vla``: the checkpoint at ``config.path``, or a new model of ``config.model``."""
        if config.path:
            return cls.from_pretrained(config.path, device=config.device)
        model = cls(config.model)
        return model.to(config.device) if config.device is not None else model

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, device: str | torch.device | None = None,
                        revision: str | None = None, text_encoder: InstructionEncoder | None = None) -> FlowVLA:
        """Load from a local checkpoint directory, or download a Hugging Face Hub repo id.

        Raises FileNotFoundError for a missing checkpoint and ``CheckpointError`` for one
        that is corrupt or does not fit the architecture its config describes.
        """
        directory = checkpoint.resolve_directory(name_or_path, revision)
        model = cls(checkpoint.read_config(directory), text_encoder=text_encoder)
        weights = checkpoint.read_weights(directory)
        checkpoint.check_compatible(model.state_dict(), weights, str(directory))
        model.load_state_dict(weights)
        if device is not None:
            model.to(device)
        return model.eval()


def masked_mse_per_sample(pred: torch.Tensor, target: torch.Tensor, is_pad: torch.Tensor) -> torch.Tensor:
    """Mean squared error per sample over non-padded steps: [B, H, A] x2, [B, H] -> [B]."""
    valid = (~is_pad).to(pred.dtype)[..., None]
    squared = (pred - target).pow(2) * valid
    count = valid.sum(dim=(1, 2)) * pred.shape[-1]
    return squared.sum(dim=(1, 2)) / count.clamp_min(1.0)
