"""`robot-rl learner`: the policy it trains comes from the configuration it was given."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.app.policies import learner_policy
from robot_rl.config import ConfigError, load_config
from tests.learner_helpers import tiny_policy


def test_without_a_checkpoint_the_learner_builds_the_model_policy_model_describes():
    policy = learner_policy(load_config(["policy.model.d_model=64", "policy.model.n_layers=1"]))
    assert policy.config.d_model == 64 and policy.config.n_layers == 1


def test_a_checkpoint_decides_the_architecture_and_init_checkpoint_comes_first(tmp_path):
    tiny = tiny_policy()
    tiny.save_pretrained(tmp_path / "tiny")
    from_path = learner_policy(load_config([f"policy.path={tmp_path / 'tiny'}", "policy.model.d_model=64"]))
    first = learner_policy(load_config([f"learner.init_checkpoint={tmp_path / 'tiny'}", "policy.model.d_model=64"]))
    assert from_path.config.d_model == first.config.d_model == tiny.config.d_model == 16


def test_a_policy_the_learner_cannot_train_is_refused():
    with pytest.raises(ConfigError, match="policy=flow_vla"):
        learner_policy(load_config(["policy=hold"]))


def test_the_learner_starts_from_the_checkpoint_an_edge_of_the_same_config_runs():
    """Without policy.path both sides fall back to the same checkpoint (the shipped BC start), so
    the first weights the learner publishes are the ones the robots already run."""
    import torch

    from robot_rl.app.policies import load_policy

    config = load_config([])
    learner, edge = learner_policy(config), load_policy(config)
    served, running = learner.state_dict(), edge.state_dict()
    assert served.keys() == running.keys()
    assert all(torch.equal(served[k], running[k]) for k in served)
