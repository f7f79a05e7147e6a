"""FlowVLA: checkpoints, exact loss weighting, state-offset augmentation, learning, text cache."""

from __future__ import annotations

import copy
import json
import os
import threading

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded in tests

import numpy as np
import pytest
import torch

from robot_rl.policies.augment import build_sample, offset_indices, sample_offsets
from robot_rl.policies.base import ChunkPolicy, validate_chunk
from robot_rl.policies.episodes import EpisodeSampler
from robot_rl.policies.flow_vla import CheckpointError, FlowVLA, FlowVLAConfig
from robot_rl.policies.flow_vla.encoders import ImageEncoder
from robot_rl.policies.flow_vla.model import masked_mse_per_sample
from robot_rl.policies.text_encoder import InstructionEncoder
from robot_rl.policies.training import fit
from tests.learner_helpers import hashed_embeddings

H, A = 4, 6




def tiny_config(**overrides) -> FlowVLAConfig:
    """The smallest model, with the optional architecture features (instruction standardisation,
    keypoint tokens, FiLM) off, so that each test turns on the one it checks."""
    base = dict(cameras=("front",), image_size=16, chunk_size=H, cnn_channels=(8, 16, 16), image_grid=2,
                d_model=32, n_heads=2, n_layers=1, n_expert_layers=2, ffn_mult=2, max_state_offset=2,
                normalize_instruction=False, keypoints=0, film_instruction=False, state_noise_std=0.0)
    return FlowVLAConfig(**{**base, **overrides})


def tiny_model(**overrides) -> FlowVLA:
    torch.manual_seed(0)
    return FlowVLA(tiny_config(**overrides), text_encoder=InstructionEncoder(backend=hashed_embeddings)).eval()


def observation(value: int = 100, size: int = 16) -> dict[str, np.ndarray]:
    return {"front": np.full((size, size, 3), value, np.uint8)}


def random_batch(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "images.front": torch.as_tensor(rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)),
        "state": torch.as_tensor(rng.standard_normal((n, A)), dtype=torch.float32),
        "instruction": [f"task {i % 2}" for i in range(n)],
        "actions": torch.as_tensor(rng.standard_normal((n, H, A)), dtype=torch.float32),
    }


def subset(batch: dict, idx: list[int]) -> dict:
    return {k: ([v[i] for i in idx] if isinstance(v, list) else v[idx]) for k, v in batch.items()}


# ---------------------------------------------------------------- protocol and checkpoints


def test_default_model_is_a_chunk_policy_and_predicts_a_valid_chunk():
    model = FlowVLA(text_encoder=InstructionEncoder(backend=hashed_embeddings))
    assert isinstance(model, ChunkPolicy)
    obs = {cam: np.zeros((120, 160, 3), np.uint8) for cam in ("front", "wrist")}  # resized internally
    chunk = model.predict_chunk(obs, np.zeros(6, np.float32), "pick up the cube")
    assert validate_chunk(chunk, 20, 6).dtype == np.float32
    assert 0.5e6 < model.num_parameters() < 5e6


def test_missing_camera_is_a_clear_error():
    with pytest.raises(KeyError, match="missing camera 'front'"):
        tiny_model().predict_chunk({"wrist": np.zeros((16, 16, 3), np.uint8)}, np.zeros(6), "x")


def test_save_load_round_trip_gives_identical_predictions(tmp_path):
    model = tiny_model()
    model.normalizer.fit(np.random.default_rng(1).normal(50, 10, (100, A)),
                         np.random.default_rng(2).normal(50, 10, (100, A)))
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]

    loaded = FlowVLA.from_pretrained(tmp_path, text_encoder=model.text_encoder)
    assert loaded.config == model.config and loaded.config_hash() == model.config_hash()
    args = (observation(), np.full(A, 40.0, np.float32), "stack the blocks")
    np.testing.assert_array_equal(model.predict_chunk(*args, seed=7), loaded.predict_chunk(*args, seed=7))
    assert not np.array_equal(model.predict_chunk(*args, seed=7), model.predict_chunk(*args, seed=8))


def test_instruction_normalisation_spreads_near_parallel_embeddings_and_round_trips(tmp_path):
    """Sentence embeddings of one task's instructions are nearly parallel; standardised over the
    training instructions their differences become O(1), and the statistics travel with the weights."""
    base = np.random.default_rng(0).standard_normal(32)
    close = {f"push the {c} cube": base + 0.05 * np.random.default_rng(i + 1).standard_normal(32) for i, c in
             enumerate(("red", "green", "blue"))}

    def encode(texts):
        return np.stack([close[t] / np.linalg.norm(close[t]) for t in texts]).astype(np.float32)

    model = FlowVLA(tiny_config(text_dim=32, normalize_instruction=True),
                    text_encoder=InstructionEncoder(backend=encode, dim=32))
    rng = np.random.default_rng(1)
    model.fit_statistics(rng.normal(50, 10, (100, A)), rng.normal(50, 10, (100, A)), list(close) * 5)
    raw = model.text_encoder.encode_batch(sorted(close))
    normalised = model.normalizer.normalize_text(raw)
    assert torch.allclose(normalised.mean(0), torch.zeros(32), atol=1e-5)
    raw_gap, new_gap = torch.cdist(raw, raw).max(), torch.cdist(normalised, normalised).max()
    assert new_gap > 20 * raw_gap and new_gap > 2.0  # the words that differ now matter

    model.save_pretrained(tmp_path)
    loaded = FlowVLA.from_pretrained(tmp_path, text_encoder=model.text_encoder)
    assert torch.equal(loaded.normalizer.text_std, model.normalizer.text_std)
    args = (observation(), np.full(A, 40.0, np.float32), "push the red cube")
    np.testing.assert_array_equal(model.predict_chunk(*args, seed=3), loaded.predict_chunk(*args, seed=3))
    # A model configured without it has no text statistics, so old checkpoints load unchanged.
    assert "normalizer.text_mean" not in tiny_model().state_dict()
    assert tiny_config().config_hash() != tiny_config(normalize_instruction=True).config_hash()


def test_fit_fits_instruction_statistics_on_distinct_instructions():
    model = tiny_model(normalize_instruction=True)
    episodes = [ramp_episode(1.0, 100, f"task {i % 2}") for i in range(3)]  # "task 0" twice, "task 1" once
    fit(model, episodes, steps=1, batch_size=4, device="cpu", progress=False)
    expected = model.text_encoder.encode_batch(["task 0", "task 1"]).mean(0)
    assert torch.allclose(model.normalizer.text_mean, expected, atol=1e-6)


def test_hot_swap_via_state_dict_and_deepcopy_shares_the_text_encoder():
    a, b = tiny_model(), tiny_model(dropout=0.1)
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.01)
    shadow = copy.deepcopy(b)
    assert shadow.text_encoder is b.text_encoder
    shadow.load_state_dict(a.state_dict())
    args = (observation(), np.zeros(A, np.float32), "x")
    np.testing.assert_array_equal(a.predict_chunk(*args, seed=0), shadow.predict_chunk(*args, seed=0))


def test_config_hash_covers_architecture_only():
    assert tiny_config().config_hash() == tiny_config(dropout=0.2, num_integration_steps=3).config_hash()
    assert tiny_config().config_hash() != tiny_config(d_model=64).config_hash()
    with pytest.raises(ValueError, match="divisible by n_heads"):
        tiny_config(d_model=30, n_heads=4)


def test_missing_checkpoint_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FlowVLA.from_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="not a FlowVLA checkpoint"):
        FlowVLA.from_pretrained(tmp_path)  # exists but empty
    tiny_model().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no weights"):
        FlowVLA.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
        (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:100]),
         "not a readable safetensors"),
        (lambda d: _edit_config(d, lambda m: m["config"].update(d_model=64)), "shape mismatch"),
        (lambda d: _edit_config(d, lambda m: m.update(policy_type="act")), "policy type 'act'"),
        (lambda d: _edit_config(d, lambda m: m.update(format_version=99)), "format_version 99"),
        (lambda d: _edit_config(d, lambda m: m["config"].update(bogus=1)), "unknown FlowVLAConfig field"),
    ],
)
def test_corrupt_checkpoint_raises_checkpoint_error(tmp_path, damage, message):
    tiny_model().save_pretrained(tmp_path)
    damage(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        FlowVLA.from_pretrained(tmp_path)


def _edit_config(directory, change) -> None:
    meta = json.loads((directory / "config.json").read_text())
    change(meta)
    (directory / "config.json").write_text(json.dumps(meta))


# ---------------------------------------------------------------- loss weighting and padding


def test_zero_weight_removes_a_sample_entirely_loss_and_gradients():
    model = tiny_model()
    batch = random_batch(3)
    noise = torch.randn(3, H, A, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.2, 0.5, 0.9])

    loss, per_sample = model.compute_loss(batch, torch.tensor([0.0, 1.0, 3.0]), noise=noise, flow_time=t)
    torch.testing.assert_close(loss, (per_sample[1] + 3 * per_sample[2]) / 4)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    ref, _ = model.compute_loss(subset(batch, [1, 2]), torch.tensor([1.0, 3.0]), noise=noise[1:], flow_time=t[1:])
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    ref.backward()
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_all_zero_weights_give_zero_loss_not_nan():
    loss, _ = tiny_model().compute_loss(random_batch(2), torch.zeros(2))
    assert loss.item() == 0.0


def test_padded_steps_contribute_no_loss():
    rng = np.random.default_rng(0)
    pred, target = torch.as_tensor(rng.standard_normal((2, H, A))), torch.as_tensor(rng.standard_normal((2, H, A)))
    is_pad = torch.tensor([[False, False, True, True], [False] * H])
    before = masked_mse_per_sample(pred, target, is_pad)
    target[0, 2:] += 1000.0  # garbage past the episode end
    after = masked_mse_per_sample(pred, target, is_pad)
    torch.testing.assert_close(before, after)
    torch.testing.assert_close(after[0], (pred[0, :2] - target[0, :2]).pow(2).mean())


# ---------------------------------------------------------------- state-offset augmentation


def indexed_episode(length: int) -> dict:
    """Arrays whose values reveal their time index: state[t] = 1000 + t, action[t] = t, image[t] = t."""
    return {
        "state": np.repeat(1000.0 + np.arange(length, dtype=np.float32)[:, None], A, axis=1),
        "action": np.repeat(np.arange(length, dtype=np.float32)[:, None], A, axis=1),
        "images.front": np.repeat(np.arange(length, dtype=np.uint8)[:, None, None, None], 16, 1)
                          .repeat(16, 2).repeat(3, 3),
        "instruction": "count",
    }


def test_offset_zero_uses_measured_state_and_chunk_from_t():
    s = build_sample(indexed_episode(10), t=3, offset=0, chunk_size=H, cameras=("front",))
    assert s["state"][0] == 1003  # state[3]
    assert s["actions"][:, 0].tolist() == [3, 4, 5, 6]
    assert s["images.front"][0, 0, 0] == 3 and not s["action_is_pad"].any()


def test_offset_uses_commanded_action_before_chunk_start_with_current_image():
    s = build_sample(indexed_episode(10), t=3, offset=2, chunk_size=H, cameras=("front",))
    assert s["state"][0] == 4  # action[t + o - 1]
    assert s["actions"][:, 0].tolist() == [5, 6, 7, 8]  # action[t + o : t + o + H]
    assert s["images.front"][0, 0, 0] == 3  # image stays at t


def test_a_chunk_is_cut_where_the_runtime_held_the_arm():
    episode = indexed_episode(10)
    episode["held"] = np.zeros(10, bool)
    episode["held"][6:8] = True  # no chunk had arrived: the arm held still at ticks 6 and 7
    s = build_sample(episode, t=3, offset=1, chunk_size=H, cameras=("front",))
    assert s["actions"][:, 0].tolist() == [4, 5, 6, 7]
    assert s["action_is_pad"].tolist() == [False, False, True, True]  # from the first hold on, no loss
    episode["held"][:] = False
    assert not build_sample(episode, t=3, offset=1, chunk_size=H, cameras=("front",))["action_is_pad"].any()


def test_episode_end_pads_with_last_action_and_clips_offset():
    idx = offset_indices(episode_length=10, t=7, offset=1, chunk_size=H)
    assert idx.action_indices.tolist() == [8, 9, 9, 9]
    assert idx.action_is_pad.tolist() == [False, False, True, True]
    assert (idx.state_from_action, idx.state_index) == (True, 7)

    clipped = offset_indices(episode_length=10, t=8, offset=5, chunk_size=H)  # 8 + 5 is past the end
    assert clipped.offset == 1 and clipped.action_indices[0] == 9 and clipped.state_index == 8
    assert clipped.action_is_pad.tolist() == [False, True, True, True]


def test_offsets_follow_configured_distribution():
    rng = np.random.default_rng(0)
    assert set(sample_offsets(rng, 200, max_offset=3)) == {0, 1, 2, 3}
    assert set(sample_offsets(rng, 50, max_offset=3, weights=(0, 0, 1, 0))) == {2}


def test_sampler_batches_are_consistent_with_their_offsets():
    policy = FlowVLA(tiny_config(max_state_offset=3))
    sampler = EpisodeSampler([indexed_episode(12), indexed_episode(7)], policy, seed=0)
    batch = sampler.sample(64)
    assert batch["images.front"].shape == (64, 16, 16, 3) and batch["actions"].shape == (64, H, A)
    for i in range(64):
        t, o = int(batch["images.front"][i, 0, 0, 0]), int(batch["offset"][i])
        expected_state = 1000 + t if o == 0 else t + o - 1
        assert batch["state"][i, 0] == expected_state
        assert batch["actions"][i, 0, 0] == t + o
    assert set(batch["offset"].tolist()) == {0, 1, 2, 3}


# ---------------------------------------------------------------- learning


def ramp_episode(direction: float, brightness: int, instruction: str, length: int = 12) -> dict:
    """A deterministic task: the arm ramps up or down; state[t] = action[t - 1] (perfect tracking)."""
    positions = 50.0 + direction * 4.0 * np.arange(length + 1, dtype=np.float32)
    return {
        "images.front": np.full((length, 16, 16, 3), brightness, np.uint8),
        "state": np.repeat(positions[:-1, None], A, axis=1),
        "action": np.repeat(positions[1:, None], A, axis=1),
        "instruction": instruction,
    }


def test_tiny_model_overfits_and_predicts_the_learned_chunk():
    torch.manual_seed(0)
    model = tiny_model()
    episodes = [ramp_episode(+1.0, 200, "go up"), ramp_episode(-1.0, 30, "go down")]
    stats = fit(model, episodes, steps=600, batch_size=32, lr=3e-3, device="cpu", progress=False, log_every=50)
    assert stats["final_loss"] < stats["initial_loss"] / 10, stats["losses"]

    for ep in episodes:  # the two tasks' chunks differ by 8..32 degrees; one ramp step is 4 degrees
        obs = {"front": ep["images.front"][0]}
        error = np.abs(model.predict_chunk(obs, ep["state"][0], ep["instruction"], seed=0) - ep["action"][:H])
        assert error.max() < 4.0 and error.mean() < 2.0, error


# ---------------------------------------------------------------- instruction encoder


def test_instruction_cache_encodes_each_string_once():
    calls: list[list[str]] = []
    encoder = InstructionEncoder(backend=lambda texts: calls.append(list(texts)) or hashed_embeddings(texts))
    first = encoder.encode("pick")
    assert encoder.encode("pick") is first
    batch = encoder.encode_batch(["pick", "place", "place", "pick"])
    assert batch.shape == (4, 384) and torch.equal(batch[0], first) and torch.equal(batch[1], batch[2])
    assert calls == [["pick"], ["place"]] and encoder.num_encoded == 2


def test_instruction_cache_is_thread_safe():
    calls: list[str] = []
    encoder = InstructionEncoder(backend=lambda texts: calls.extend(texts) or hashed_embeddings(texts))
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        encoder.encode("same instruction")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert calls == ["same instruction"]


def test_real_minilm_encoder_loads_offline():
    encoder = InstructionEncoder()
    vectors = encoder.encode_batch(["pick up the red cube", "pick up the red block", "open the drawer"])
    assert vectors.shape == (3, 384)
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(3))
    near, far = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert near > far  # a real sentence encoder, not noise


def test_random_shift_translates_each_image_by_at_most_pad_pixels():
    from robot_rl.policies.flow_vla.encoders import random_shift

    torch.manual_seed(3)
    images = torch.zeros(8, 2, 3, 16, 16)
    images[:, :, :, 8, 8] = 1.0  # one bright pixel in the middle of every image
    shifted = random_shift(images, pad=3)
    assert shifted.shape == images.shape
    moves = set()
    for b in range(8):
        for cam in range(2):
            ys, xs = torch.nonzero(shifted[b, cam, 0], as_tuple=True)
            assert len(ys) == 1, "a shift moves the pixel, it neither duplicates nor loses it"
            dy, dx = int(ys[0]) - 8, int(xs[0]) - 8
            assert abs(dy) <= 3 and abs(dx) <= 3
            assert torch.equal(shifted[b, cam, 1], shifted[b, cam, 0])  # channels move together
            moves.add((dy, dx))
    assert len(moves) > 1, "offsets are drawn per image"
    assert torch.equal(random_shift(images, pad=0), images)


def test_spatial_softmax_finds_where_a_feature_map_peaks():
    from robot_rl.policies.flow_vla.encoders import SpatialSoftmax

    head = SpatialSoftmax(channels=1, keypoints=1)
    with torch.no_grad():
        head.to_maps.weight.fill_(1.0)
        head.to_maps.bias.zero_()
        head.log_temperature.fill_(-3.0)  # sharp: the soft-argmax is (nearly) the arg-max
    features = torch.zeros(1, 1, 9, 9)
    features[0, 0, 2, 6] = 10.0  # row 2 (y), column 6 (x) of a 9x9 grid spanning -1..1
    x, y = head(features)[0].tolist()
    assert x == pytest.approx(-1 + 6 * 0.25, abs=1e-3) and y == pytest.approx(-1 + 2 * 0.25, abs=1e-3)


def test_keypoint_token_is_part_of_the_architecture_and_round_trips(tmp_path):
    model = tiny_model(keypoints=4)
    assert model.config.config_hash() != tiny_config().config_hash()
    tokens = model.image_encoder(torch.zeros(2, 1, 3, 16, 16))
    assert tokens.shape == (2, 2 * 2 + 1, 32)  # grid 2x2 + one keypoint token
    model.save_pretrained(tmp_path)
    loaded = FlowVLA.from_pretrained(tmp_path, text_encoder=model.text_encoder)
    state = np.zeros(A, np.float32)
    np.testing.assert_array_equal(model.predict_chunk(observation(), state, "push", seed=1),
                                  loaded.predict_chunk(observation(), state, "push", seed=1))


def test_state_noise_acts_in_training_only():
    model = tiny_model(state_noise_std=1.0)
    batch = random_batch(4)
    flow_time, noise = torch.full((4,), 0.5), torch.zeros(4, H, A)
    with torch.no_grad():
        eval_losses = [model.compute_loss(batch, noise=noise, flow_time=flow_time)[0].item() for _ in range(2)]
        model.train()
        train_losses = [model.compute_loss(batch, noise=noise, flow_time=flow_time)[0].item() for _ in range(2)]
    assert eval_losses[0] == eval_losses[1]  # deterministic without the noise
    assert train_losses[0] != train_losses[1]  # the state input is perturbed afresh each time
    assert tiny_config(state_noise_std=0.5).config_hash() == tiny_config().config_hash()


def test_noise_stream_makes_a_sequence_of_chunks_reproducible_and_varied():
    model = tiny_model()
    state, obs = np.zeros(A, np.float32), observation()

    def episode():
        model.reseed_noise(7)
        chunks = [model.predict_chunk(obs, state, "push") for _ in range(3)]
        model.reseed_noise(None)
        return chunks

    first, second = episode(), episode()
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)  # same seed, same sequence
    assert not np.array_equal(first[0], first[1])  # yet each chunk meets new noise
    explicit = model.predict_chunk(obs, state, "push", seed=3)
    model.reseed_noise(7)
    np.testing.assert_array_equal(model.predict_chunk(obs, state, "push", seed=3), explicit)  # explicit seed wins
    model.reseed_noise(None)


def test_film_lets_the_instruction_change_the_image_features_and_starts_as_identity():
    torch.manual_seed(0)
    encoder = ImageEncoder(2, (8, 8), 2, 16, keypoints=4, film_dim=12)
    images = torch.rand(3, 2, 3, 16, 16) * 2 - 1
    a, b = torch.randn(3, 12), torch.randn(3, 12)
    assert torch.equal(encoder(images, a), encoder(images, b))  # zero-initialised: no effect yet
    with torch.no_grad():
        encoder.film.weight.normal_(0.0, 0.5)
    assert not torch.allclose(encoder(images, a), encoder(images, b))
    with pytest.raises(ValueError, match="instruction-conditioned"):
        encoder(images)
    assert tiny_config().config_hash() != tiny_config(film_instruction=True).config_hash()
    model = tiny_model(film_instruction=True)
    chunk = model.predict_chunk(observation(), np.zeros(A, np.float32), "x", seed=0)
    assert chunk.shape == (H, A) and np.isfinite(chunk).all()


def test_a_checkpoint_keeps_the_architecture_it_was_saved_with_when_defaults_change():
    """A config.json written before a feature existed lacks its key: it loads with the feature off
    (what it was trained with), not with today's default, which would not fit its weights."""
    saved = {k: v for k, v in tiny_config().to_dict().items()
             if k not in ("normalize_instruction", "keypoints", "film_instruction")}
    loaded = FlowVLAConfig.from_checkpoint(saved)
    assert (loaded.normalize_instruction, loaded.keypoints, loaded.film_instruction) == (False, 0, False)
    assert FlowVLAConfig().film_instruction and FlowVLAConfig().keypoints == 32  # today's defaults differ
    with pytest.raises(ValueError, match="unknown FlowVLAConfig field"):
        FlowVLAConfig.from_checkpoint({**saved, "image_sise": 16})


def test_real_time_chunking_guides_the_first_actions_onto_the_executing_plan_and_leaves_the_rest_free():
    """FlowVLA through LeRobot's RTCProcessor: with the same initial noise, only the guidance differs."""
    model = tiny_model()
    rng = np.random.default_rng(0)
    samples = rng.standard_normal((100, A))
    model.normalizer.fit(samples, samples)
    state = np.zeros(A, np.float32)
    model.reseed_noise(0)
    free = model.predict_chunk(observation(), state, "task 0")
    prefix = free + 2.0  # an executing plan two standard deviations from what the free sample does
    model.reseed_noise(0)
    guided = model.predict_chunk_guided(observation(), state, "task 0", prefix, delay=2)
    assert guided.shape == free.shape and np.isfinite(guided).all()
    assert np.abs(guided[:2] - prefix[:2]).max() < 0.05  # the frozen steps join the executing plan
    # After the delay the guidance fades (LeRobot's linear schedule over the chunk): each later step
    # keeps more of the policy's own plan.
    error = np.abs(guided - prefix).mean(axis=1)
    assert error[1] < error[2] < error[3] and error[3] > 5 * error[:2].max()
    with pytest.raises(ValueError, match="prefix must be"):
        model.predict_chunk_guided(observation(), state, "task 0", prefix[:, :3], delay=2)
