"""Reading and writing FlowVLA checkpoints in the Hugging Face layout, without pickle.

A checkpoint is a directory with two files:
- ``config.json``: format version, policy type, the FlowVLAConfig, its config hash, and a
  readable copy of the normalisation statistics;
- ``model.safetensors``: every tensor of ``state_dict()`` (normalisation buffers included).

Writes are atomic per file (temp file + rename), so a reader never sees half a file.
Loading never uses ``torch.load``/pickle; checkpoints may come from the network.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from robot_rl.core.errors import CorruptFileError
from robot_rl.policies.checkpoint_files import RESTORE
from robot_rl.policies.flow_vla.config import FlowVLAConfig

FORMAT_VERSION = 1
POLICY_TYPE = "flow_vla"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(CorruptFileError):
    """A checkpoint that exists but cannot be used (corrupt, wrong type, incompatible shapes)."""


def write_checkpoint(directory: str | Path, config: FlowVLAConfig, state_dict: dict[str, torch.Tensor],
                     normalization: dict[str, Any]) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    meta = {
        "format_version": FORMAT_VERSION,
        "policy_type": POLICY_TYPE,
        "config_hash": config.config_hash(),
        "config": config.to_dict(),
        "normalization": normalization,
    }
    _atomic_write(directory / WEIGHTS_FILE, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    _atomic_write(directory / CONFIG_FILE, lambda p: p.write_text(json.dumps(meta, indent=2) + "\n"))
    return directory


def read_config(directory: Path) -> FlowVLAConfig:
    """Parse config.json, raising errors that say which file is wrong and how."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {directory} is not a FlowVLA checkpoint "
            f"(save_pretrained writes {CONFIG_FILE} and {WEIGHTS_FILE})"
        )
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not valid JSON ({e})", RESTORE) from e
    if not isinstance(meta, dict) or meta.get("policy_type") != POLICY_TYPE:
        found = meta.get("policy_type") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(path, f"describes policy type {found!r}, not {POLICY_TYPE!r}",
                              "use the LeRobot adapter (policy=lerobot) for LeRobot checkpoints")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(path, f"has format_version {version!r}; this code reads versions <= {FORMAT_VERSION}",
                              "upgrade robot_rl to load it")
    try:
        return FlowVLAConfig.from_checkpoint(meta["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(path, f"holds an unusable config ({e})", RESTORE) from e


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the checkpoint in {directory} has no weights")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(path, f"not a readable safetensors file ({e})", RESTORE) from e


def check_compatible(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], source: str) -> None:
    """Raise CheckpointError listing missing, unexpected and mis-shaped tensors (all of them, not just the first)."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(found[k].shape)} vs model {tuple(expected[k].shape)}"
                  for k in sorted(set(expected) & set(found)) if found[k].shape != expected[k].shape]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if mismatched:
            parts.append("shape mismatch " + "; ".join(mismatched[:5]))
        raise CheckpointError(source, "its weights do not fit the model its config.json describes: " + ", ".join(parts),
                              RESTORE)


def resolve_directory(name_or_path: str | Path, revision: str | None = None) -> Path:
    """A local directory as is; an ``owner/name`` string that is not a local path is a Hub repo id, downloaded."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    text = str(name_or_path)
    looks_local = text.startswith((".", "/", "~")) or text.count("/") != 1 or path.exists()
    if looks_local:
        raise FileNotFoundError(f"checkpoint directory {path} does not exist or is not a directory")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=text, revision=revision, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE]))
    except Exception as e:  # hub errors come in many classes; all mean "could not fetch"
        raise FileNotFoundError(
            f"{text!r} is neither a local directory nor a downloadable Hugging Face Hub repo ({type(e).__name__}: {e})"
        ) from e


def _atomic_write(final: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
