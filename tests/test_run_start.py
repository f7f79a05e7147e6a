"""Which policy `robot-rl run` and `bench learning` start from."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

from pathlib import Path

import pytest

from policies.flow_vla import FlowVLA, FlowVLAConfig
from robot_rl.commands import policy_loading
from robot_rl.commands import run as run_command
from robot_rl.config import load_config, to_dataclass
from tests.learner_helpers import hashed_embeddings
from policies.text_encoder import InstructionEncoder


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A checkpoint with the default model config, standing in for checkpoints/bc_push."""
    cfg = load_config([])
    model = FlowVLA(to_dataclass(cfg.policy.model, FlowVLAConfig), text_encoder=InstructionEncoder(backend=hashed_embeddings))
    directory = tmp_path / "bc_push"
    model.save_pretrained(directory)
    monkeypatch.setattr(policy_loading, "SHIPPED_BC", directory)
    return directory


def test_default_config_starts_from_the_shipped_checkpoint(shipped, tmp_path):
    cfg = load_config([f"output_dir={tmp_path / 'out'}"])
    assert run_command.ensure_bc_checkpoint(cfg) == shipped


def test_a_trained_checkpoint_wins_over_the_shipped_one(shipped, tmp_path):
    cfg = load_config([f"output_dir={tmp_path / 'out'}"])
    trained = Path(cfg.bc.checkpoint_dir)
    trained.mkdir(parents=True)
    (trained / "model.safetensors").write_bytes(b"placeholder")
    assert run_command.ensure_bc_checkpoint(cfg) == trained


@pytest.mark.parametrize("override", ["policy.model.d_model=64", "task_families=[pick]", "task_families=null",
                                      "bc.use_shipped=false"])
def test_shipped_checkpoint_is_not_used_for_another_model_or_task_set(shipped, tmp_path, override):
    cfg = load_config([f"output_dir={tmp_path / 'out'}", override])
    assert policy_loading.shipped_bc_checkpoint(cfg) is None


def test_the_repository_ships_a_checkpoint_for_the_default_config():
    cfg = load_config([])
    assert policy_loading.shipped_bc_checkpoint(cfg) == policy_loading.SHIPPED_BC, (
        "checkpoints/bc_push is missing or no longer matches policy.model: retrain it with `robot-rl train-bc`")


def test_reports_name_the_checkpoint_really_loaded(shipped, tmp_path):
    cfg = load_config([f"output_dir={tmp_path / 'out'}"])
    assert policy_loading.policy_source(cfg) == str(shipped)  # not the (absent) bc.checkpoint_dir
    cfg = load_config([f"output_dir={tmp_path / 'out'}", "policy.path=some/hub-id"])
    assert policy_loading.policy_source(cfg) == "some/hub-id"
