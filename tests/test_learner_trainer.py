"""Trainer: exact resume from an atomic checkpoint, publish cadence, stream mixing."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from robot_rl.bridges.zmq.weights import deserialize_tensors
from robot_rl.learner import checkpoint as ckpt
from robot_rl.learner.checkpoint_pointer import latest_checkpoint
from robot_rl.learner.config import TrainerConfig
from robot_rl.learner.index import DEMO_ROBOT, SampleSpec, SamplingIndex, steps_to_columns
from robot_rl.learner.publisher import PublishSchedule
from robot_rl.learner.trainer import Trainer, training_device
from robot_rl.policies.trainable import published_state
from tests.learner_helpers import BC, CAMERAS, make_steps, store_config, tiny_policy, trainer_config, wait_for


def filled_index() -> SamplingIndex:
    index = SamplingIndex(CAMERAS)
    for ep in range(3):
        steps = make_steps(12, episode=ep, robot=ep)
        for s in steps[4:7]:
            s.is_intervention = True
        index.append((f"r{ep}", ep, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
    index.append((DEMO_ROBOT, 0, 0), steps_to_columns(make_steps(10, episode=9), CAMERAS), "pick the cube")
    return index


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("ema_decay", [None, 0.9])
def test_resumed_trainer_continues_the_same_step_and_next_update(tmp_path, ema_decay):
    config = trainer_config(tmp_path / "ckpt", ema_decay=ema_decay)
    a = Trainer(tiny_policy(), filled_index(), config, BC)
    for _ in range(3):
        a.update_once()
    saved = a.checkpoint()
    assert saved.name == "step-00000003" and latest_checkpoint(config.checkpoint_dir) == saved
    torch.manual_seed(1234)  # global RNG disturbed after the checkpoint: must not matter
    metrics_a = [a.update_once() for _ in range(2)]

    # A fresh process: other initial weights, index rebuilt (same content, other insertion order).
    index = SamplingIndex(CAMERAS)
    entries = filled_index()
    for key in reversed([tuple(m[:3]) for m in entries.manifest()]):
        steps = make_steps(12 if key[0] != DEMO_ROBOT else 10, episode=key[1] if key[0] != DEMO_ROBOT else 9,
                           robot=key[1] if key[0] != DEMO_ROBOT else 0)
        if key[0] != DEMO_ROBOT:
            for s in steps[4:7]:
                s.is_intervention = True
        index.append(key, steps_to_columns(steps, CAMERAS), "pick the cube")
    b = Trainer(tiny_policy(seed=7), index, config, BC)
    b.resume()
    assert b.step == 3
    metrics_b = [b.update_once() for _ in range(2)]
    assert b.step == a.step == 5
    assert [m["loss"] for m in metrics_b] == [m["loss"] for m in metrics_a]
    for key, value in params(a.policy).items():
        assert torch.equal(value, params(b.policy)[key]), key
    for key, value in params(a.deployed).items():  # the average too, when one is kept
        assert torch.equal(value, params(b.deployed)[key]), key


@pytest.mark.parametrize("spill_mb", [None, 0.0], ids=["spill", "dataset"])
def test_a_learner_restarted_after_its_index_let_frames_go_samples_as_the_checkpointed_one(tmp_path, spill_mb):
    """Episodes whose frames left memory (to the spill, or read back from the dataset when sampled) are
    sampled, after a restart that reads the store back under the same budget (and empties the spill),
    exactly as by the learner that checkpointed."""
    from robot_rl.learner.store import ReplayStore
    from tests.test_learner_index_memory import BUDGET_MB, fill_store, frames_let_go

    config = trainer_config(tmp_path / "ckpt")
    stored = store_config(tmp_path / "store", index_memory=BUDGET_MB, index_read_workers=0, index_spill=spill_mb)
    with ReplayStore(stored) as store:
        for _ in fill_store(store, 5):
            pass
        assert frames_let_go(store) >= 3
        a = Trainer(tiny_policy(), store.index, config, BC)
        for _ in range(3):
            a.update_once()
        a.checkpoint()
        metrics_a = [a.update_once() for _ in range(3)]
    with ReplayStore(stored) as store:
        assert frames_let_go(store) >= 3 and store.index.frame_bytes <= store.index.memory_budget
        b = Trainer(tiny_policy(seed=7), store.index, config, BC)
        b.resume()
        metrics_b = [b.update_once() for _ in range(3)]
    assert [m["loss"] for m in metrics_b] == [m["loss"] for m in metrics_a]
    for key, value in params(a.policy).items():
        assert torch.equal(value, params(b.policy)[key]), key


def test_a_resume_does_not_wait_for_the_store_to_read_its_dataset_and_training_says_if_it_matches(tmp_path,
                                                                                                    caplog):
    """A restarted store reads its dataset into the index behind the serving learner: the resume
    returns at once, and the training thread compares the index with the checkpoint once it is read."""
    import logging
    import threading

    config = trainer_config(tmp_path / "ckpt")
    first = Trainer(tiny_policy(), filled_index(), config, BC)
    first.update_once()
    first.checkpoint()
    index = filled_index()
    index.loading()  # the store's reader has not finished
    second = Trainer(tiny_policy(), index, config, BC)
    resumed = threading.Thread(target=second.resume)
    resumed.start()
    resumed.join(10)
    assert not resumed.is_alive(), "the resume waited for the dataset read"
    with caplog.at_level(logging.INFO, logger="robot_rl.learner.trainer"):
        second.start()
        try:
            assert "matches the checkpoint" not in caplog.text
            index.loaded()
            wait_for(lambda: "store index matches the checkpoint" in caplog.text, what="the manifest check")
            wait_for(lambda: second.step > 1, what="training after the read")
        finally:
            second.stop()


def test_checkpoint_write_is_atomic_and_pruned(tmp_path):
    config = trainer_config(tmp_path / "ckpt", keep_checkpoints=2)
    trainer = Trainer(tiny_policy(), filled_index(), config, BC)
    for _ in range(3):
        trainer.update_once()
        trainer.checkpoint()
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["latest", "step-00000002", "step-00000003"]  # no temp dirs left, oldest pruned
    # A crash mid-write leaves a temp dir, which resume ignores.
    (tmp_path / "ckpt" / ".step-00000004.tmp").mkdir()
    assert latest_checkpoint(config.checkpoint_dir).name == "step-00000003"


def test_resume_refuses_another_policy_architecture(tmp_path):
    config = trainer_config(tmp_path / "ckpt")
    trainer = Trainer(tiny_policy(), filled_index(), config, BC)
    trainer.update_once()
    trainer.checkpoint()
    from robot_rl.policies.flow_vla import FlowVLA
    from tests.learner_helpers import TEXT, tiny_policy_config
    other = FlowVLA(tiny_policy_config().__class__(**{**tiny_policy_config().to_dict(), "d_model": 32}),
                    text_encoder=TEXT)
    with pytest.raises(ValueError, match="policy config"):
        Trainer(other, filled_index(), config, BC).resume()


def test_publishes_every_n_updates_with_growing_versions(tmp_path):
    blobs = []
    config = trainer_config(tmp_path / "ckpt", publish_every_updates=2)
    trainer = Trainer(tiny_policy(), filled_index(), config, BC, publish=blobs.append)
    for _ in range(5):
        trainer.update_once()
    assert [b.version for b in blobs] == [1, 2]
    tensors = deserialize_tensors(blobs[-1].data, framework="pt")
    assert blobs[-1].config_hash == trainer.policy.config_hash()
    assert set(tensors) == set(trainer.policy.state_dict())


def test_publish_schedule_by_time():
    now = [0.0]
    schedule = PublishSchedule(every_updates=100, every_s=5.0, clock=lambda: now[0])
    assert not schedule.note_update()
    now[0] = 5.0
    assert schedule.note_update()
    schedule.published()
    assert not schedule.note_update()


def test_batches_mix_streams_by_ratio():
    index = filled_index()
    spec = SampleSpec(chunk_size=4, cameras=CAMERAS, max_state_offset=2)
    rng = np.random.default_rng(0)
    batch = index.sample(2000, {"online": 0.5, "intervention": 0.25, "demonstration": 0.25}, spec, rng)
    share = np.bincount(batch["stream"].numpy(), minlength=3) / 2000
    assert np.allclose(share, [0.5, 0.25, 0.25], atol=0.04)
    assert batch["is_intervention"][batch["stream"] == 1].all()
    assert not batch["is_intervention"][batch["stream"] == 0].any()
    # An empty stream's share goes to the others instead of shrinking the batch.
    only_online = SamplingIndex(CAMERAS)
    only_online.append(("r", 0, 0), steps_to_columns(make_steps(8), CAMERAS), "x")
    batch = only_online.sample(16, TrainerConfig().stream_ratios, spec, rng)
    assert (batch["stream"] == 0).all() and batch["actions"].shape == (16, 4, 6)


def test_ticks_where_the_runtime_held_the_arm_are_never_online_samples():
    steps = make_steps(12)
    for s in steps[5:9]:
        s.chunk_id = -1  # no chunk to execute: the edge held the arm (a stall, or the wait after a hand-back)
    steps[10].is_intervention, steps[10].chunk_id = True, -1  # a human drove: not a hold
    index = SamplingIndex(CAMERAS)
    index.append(("r", 0, 0), steps_to_columns(steps, CAMERAS), "x")
    assert index.counts() == {"online": 7, "intervention": 1, "demonstration": 0} and index.held_steps() == 4
    spec = SampleSpec(4, CAMERAS)
    batch = index.sample(200, {"online": 1.0}, spec, np.random.default_rng(0))
    ticks = batch["state"][:, 2].numpy()  # make_step: state[2] = tick
    assert not np.isin(ticks, [5, 6, 7, 8]).any()
    at_3 = batch["action_is_pad"][ticks == 3]  # chunk 3..6 runs into the hold at 5: cut there
    assert len(at_3) and at_3[0].tolist() == [False, False, True, True]


def test_trainer_waits_for_data_without_blocking(tmp_path):
    trainer = Trainer(tiny_policy(), SamplingIndex(CAMERAS), trainer_config(tmp_path, min_steps_to_train=5), BC)
    assert trainer.update_once() is None and trainer.step == 0


def test_a_learner_that_imitates_only_corrections_and_demos_waits_for_them(tmp_path, caplog):
    # hgdagger's mix: the robots' own steps (36 here) do not count towards min_steps_to_train.
    index = SamplingIndex(CAMERAS)
    for ep in range(3):
        index.append((f"r{ep}", ep, 0), steps_to_columns(make_steps(12, episode=ep, robot=ep), CAMERAS),
                     "pick the cube")
    config = trainer_config(tmp_path, min_steps_to_train=5, online_ratio=0.0, intervention_ratio=0.5,
                            demonstration_ratio=0.5)
    trainer = Trainer(tiny_policy(), index, config, BC)
    with caplog.at_level("INFO", logger="robot_rl.learner.trainer"):
        assert trainer.update_once() is None and trainer.step == 0  # waits: no LookupError from the sampler
        assert trainer.update_once() is None
    said = [r.message for r in caplog.records if "not training yet" in r.message]
    assert len(said) == 1 and "only 0 in the streams" in said[0]  # said once, with the reason
    index.append((DEMO_ROBOT, 0, 0), steps_to_columns(make_steps(10, episode=9), CAMERAS), "pick the cube")
    assert trainer.update_once() is not None and trainer.step == 1


def test_with_ema_robots_and_checkpoints_get_the_average_and_training_goes_on_the_raw_weights(tmp_path):
    from robot_rl.policies.flow_vla import FlowVLA

    blobs = []
    decay = 0.8
    config = trainer_config(tmp_path / "ckpt", publish_every_updates=3, ema_decay=decay)
    trainer = Trainer(tiny_policy(), filled_index(), config, BC, publish=blobs.append)
    start = params(trainer.policy)
    expected = {k: v.clone() for k, v in start.items()}
    for _ in range(3):
        trainer.update_once()
        for name, value in trainer.policy.named_parameters():
            expected[name] = decay * expected[name] + (1 - decay) * value.detach()
    published = deserialize_tensors(blobs[-1].data, framework="pt")
    training = params(trainer.policy)
    moved = [k for k, _ in trainer.policy.named_parameters() if not torch.equal(training[k], start[k])]
    assert moved, "the updates changed no weight"
    for name in moved:
        torch.testing.assert_close(published[name], expected[name])
        assert not torch.equal(published[name], training[name]), name  # not the raw iterate
    model = FlowVLA.from_pretrained(trainer.checkpoint(), device="cpu")
    for name, value in model.state_dict().items():
        assert torch.equal(value, params(trainer.deployed)[name]), name


def test_ema_decay_outside_0_1_is_refused(tmp_path):
    with pytest.raises(ValueError, match="ema_decay"):
        trainer_config(tmp_path, ema_decay=1.0)


def test_save_deployed_writes_the_weights_robots_would_get_now(tmp_path):
    from robot_rl.policies.flow_vla import FlowVLA
    from tests.learner_helpers import TEXT

    trainer = Trainer(tiny_policy(), filled_index(), trainer_config(tmp_path / "ckpt", ema_decay=0.9), BC)
    for _ in range(2):
        trainer.update_once()
    assert trainer.save_deployed(tmp_path / "now") == (2, 0)
    saved = FlowVLA.from_pretrained(tmp_path / "now", device="cpu", text_encoder=TEXT).state_dict()
    deployed, training = params(trainer.deployed), params(trainer.policy)
    assert all(torch.equal(saved[k], deployed[k]) for k in deployed)
    assert any(not torch.equal(saved[k], training[k]) for k in training)  # the average, not the iterate
    # A loadable policy directory and nothing else: no optimiser or resume state.
    assert sorted(p.name for p in (tmp_path / "now").iterdir()) == ["config.json", "model.safetensors"]


def test_set_threads_is_applied_by_the_training_thread_itself(tmp_path, monkeypatch):
    """torch.set_num_threads from the caller would leave the running training thread as it was."""
    import threading

    calls: list[tuple[int, str]] = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads",
                        lambda n: (calls.append((n, threading.current_thread().name)), real(torch.get_num_threads())))
    trainer = Trainer(tiny_policy(), filled_index(), trainer_config(tmp_path, max_updates=1000), BC).start()
    try:
        trainer.set_threads(3)
        step = trainer.step
        wait_for(lambda: trainer.step >= step + 2, what="two updates after set_threads")
    finally:
        trainer.stop()
    assert calls == [(3, "trainer")]
    with pytest.raises(ValueError, match="threads"):
        trainer.set_threads(0)


def poison_every_batch(trainer: Trainer, monkeypatch) -> None:
    """Every batch the trainer samples carries one NaN action (a corrupt demonstration file, say)."""
    sample = trainer.index.sample

    def poisoned(*args, **kwargs):
        batch = sample(*args, **kwargs)
        batch["actions"] = torch.as_tensor(batch["actions"]).clone()
        batch["actions"].view(-1)[0] = float("nan")
        return batch

    monkeypatch.setattr(trainer.index, "sample", poisoned)
    trainer._prefetch.discard()  # the clean batch drawn ahead before the patch


def test_a_batch_with_a_non_finite_loss_is_skipped_without_touching_the_weights(tmp_path, monkeypatch):
    trainer = Trainer(tiny_policy(), filled_index(), trainer_config(tmp_path), BC)
    trainer.update_once()
    before = params(trainer.policy)
    with monkeypatch.context() as patch:
        poison_every_batch(trainer, patch)
        assert trainer.update_once() == {"skipped_nonfinite": 1.0}
    trainer._prefetch.discard()  # the poisoned batch drawn ahead
    after = params(trainer.policy)
    assert all(torch.equal(before[k], after[k]) for k in before) and trainer.step == 1
    assert trainer.nonfinite_batches == 1
    metrics = trainer.update_once()  # clean data again: training goes on from the same weights
    assert np.isfinite(metrics["loss"]) and trainer.step == 2
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())


def test_batches_that_stay_non_finite_stop_training_loudly_instead_of_silently(tmp_path, monkeypatch):
    trainer = Trainer(tiny_policy(), filled_index(), trainer_config(tmp_path, max_nonfinite_batches=3), BC)
    poison_every_batch(trainer, monkeypatch)
    trainer.start()
    assert trainer.wait(60), "the training thread kept skipping forever"
    assert trainer.step == 0 and trainer.nonfinite_batches == 3
    assert trainer.failure is not None and "3 batches in a row" in trainer.failure


def nan_bytes_into(path, offset: int = 4096, length: int = 4096) -> None:
    """4 KB of float32 NaNs over the middle of a file, as a bad disk or a bad copy would leave it."""
    with open(path, "r+b") as f:
        f.seek(min(offset, max(0, path.stat().st_size - length)))
        f.write(np.full(length // 4, np.nan, np.float32).tobytes())


@pytest.mark.parametrize("damage", ["nan_bytes", "truncated"])
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_ones_to_resume_from(tmp_path, damage):
    from robot_rl.core.errors import ConfigError

    config = trainer_config(tmp_path / "ckpt")
    trainer = Trainer(tiny_policy(), filled_index(), config, BC)
    trainer.update_once()
    trainer.checkpoint()
    trainer.update_once()
    path = trainer.checkpoint()
    weights = path / "model.safetensors"
    if damage == "nan_bytes":
        nan_bytes_into(weights)
    else:
        os.truncate(weights, weights.stat().st_size // 2)
    with pytest.raises(ConfigError, match=r"model\.safetensors does not have the sha256.*step-00000001"):
        Trainer(tiny_policy(), filled_index(), config, BC).resume()


def test_a_checkpoint_without_checksums_still_has_its_weights_checked_for_nan(tmp_path):
    from safetensors.torch import load_file, save_file

    from robot_rl.core.errors import ConfigError

    trainer = Trainer(tiny_policy(), filled_index(), trainer_config(tmp_path / "ckpt"), BC)
    trainer.update_once()
    path = trainer.checkpoint()
    (path / ckpt.CHECKSUMS).unlink()
    weights = load_file(str(path / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(ConfigError, match=f"weight '{name}' holds NaN"):
        Trainer(tiny_policy(), filled_index(), trainer_config(tmp_path / "ckpt"), BC).resume()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_non_finite_element_anywhere_in_a_large_tensor_is_found(dtype, bad):
    from robot_rl.learner.checkpoint import non_finite_tensor

    generator = torch.Generator().manual_seed(3)
    tensors = {"empty": torch.empty(0, dtype=dtype), "ints": torch.arange(5),
               "big": torch.randn(100_003, generator=generator).to(dtype)}
    assert non_finite_tensor(tensors) is None
    for position in (0, 4_099, 100_002):  # first, inside a vector block, the scalar tail
        tensors["big"][position] = bad
        assert non_finite_tensor(tensors) == "big"
        tensors["big"][position] = 0.5


def test_nan_weights_are_never_published_and_training_stops_saying_why(tmp_path):
    from robot_rl.learner.publisher import NonFiniteWeightsError, snapshot

    blobs = []
    trainer = Trainer(tiny_policy(), filled_index(), trainer_config(tmp_path, publish_every_updates=1), BC,
                      publish=blobs.append)
    with torch.no_grad():
        next(trainer.policy.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteWeightsError):
        snapshot(trainer.policy, 1, trainer.policy.config_hash())
    with pytest.raises(NonFiniteWeightsError, match="not published"):
        trainer._publish_locked()  # what the schedule calls after an update
    assert blobs == [] and trainer.version == 0
    trainer.start()  # NaN weights give NaN losses: every batch is skipped, then training stops, saying so
    assert trainer.wait(60)
    assert blobs == [] and trainer.step == 0 and "non-finite loss" in trainer.failure


def test_weights_finite_in_float32_but_not_in_the_wire_dtype_are_never_published():
    """A float32 weight above 65504 is an inf in float16: the robots would load inf, so the check
    reads what is on the wire, and the buffer the refused snapshot was written into is reused."""
    from robot_rl.bridges.zmq.weights import SnapshotBuffers
    from robot_rl.learner.publisher import NonFiniteWeightsError, snapshot

    policy = tiny_policy()
    buffers = SnapshotBuffers()
    snapshot(policy, 1, policy.config_hash(), transfer_dtype="float16", buffers=buffers).retire()
    name, weight = next(iter(published_state(policy).items()))
    with torch.no_grad():
        weight.view(-1)[0] = 1e5
    assert snapshot(policy, 2, policy.config_hash(), transfer_dtype="float32", buffers=buffers)
    with pytest.raises(NonFiniteWeightsError, match=f"{name}.*float16"):
        snapshot(policy, 3, policy.config_hash(), transfer_dtype="float16", buffers=buffers)
    reused = buffers.reused
    snapshot(policy, 4, policy.config_hash(), transfer_dtype="bfloat16", buffers=buffers)
    assert buffers.reused == reused + 1


def test_the_training_device_sets_tf32_matmuls_on_cuda_only():
    """TF32 products are a CUDA speed-up (a VLA update is mostly matmuls); the CPU keeps full
    float32 so CPU runs reproduce exactly. The device object needs no GPU to be named."""
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert training_device(TrainerConfig(device="cpu", matmul_precision="high")).type == "cpu"
        assert torch.get_float32_matmul_precision() == "highest"
        assert training_device(TrainerConfig(device="cuda", matmul_precision="high")).type == "cuda"
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
    with pytest.raises(ValueError, match="matmul_precision"):
        TrainerConfig(matmul_precision="tf32")
