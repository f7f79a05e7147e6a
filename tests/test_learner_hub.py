"""Hub push: schedule, repo ids, what is uploaded, and failures that never stop training.

No hub is reachable here: ``HfApi.create_repo`` / ``upload_folder`` are replaced by
recorders that list the folder they were given (it is a temporary snapshot, gone after).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import logging
import threading
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment
from robot_rl.learner.config import HubConfig
from robot_rl.learner.hub import HubPusher, HubSchedule, dataset_snapshot
from robot_rl.learner.store import ReplayStore
from robot_rl.learner.trainer import Trainer
from tests.learner_helpers import BC, make_steps, store_config, tiny_policy, trainer_config, wait_for
from tests.test_learner_trainer import filled_index


class FakeHub:
    """Records HfApi calls; ``fail_next`` uploads raise like a network error would."""

    def __init__(self) -> None:
        self.repos: list[tuple[str, str, bool]] = []
        self.uploads: list[dict] = []
        self.fail_next = 0
        self.lock = threading.Lock()

    def create_repo(self, api, repo_id, *, repo_type=None, private=None, exist_ok=False, **_):
        self.repos.append((repo_id, repo_type, private))

    def upload_folder(self, api, *, repo_id, folder_path, repo_type=None, path_in_repo=None, **kwargs):
        with self.lock:
            if self.fail_next:
                self.fail_next -= 1
                raise ConnectionError("hub unreachable (test)")
            root = Path(folder_path)
            files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
            self.uploads.append({"repo_id": repo_id, "repo_type": repo_type, "path_in_repo": path_in_repo,
                                 "files": files, "message": kwargs.get("commit_message")})


@pytest.fixture
def hub(monkeypatch) -> FakeHub:
    fake = FakeHub()
    monkeypatch.setattr(HfApi, "create_repo", lambda api, *a, **k: fake.create_repo(api, *a, **k))
    monkeypatch.setattr(HfApi, "upload_folder", lambda api, *a, **k: fake.upload_folder(api, *a, **k))
    return fake


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_schedule_every_n_checkpoints_or_t_minutes():
    clock = FakeClock()
    schedule = HubSchedule(every_checkpoints=3, every_minutes=10, clock=clock)
    schedule.note_checkpoint()
    schedule.note_checkpoint()
    assert not schedule.due()
    schedule.note_checkpoint()
    assert schedule.due()
    schedule.attempted()
    assert not schedule.due()
    clock.now = 599.0
    assert not schedule.due()
    clock.now = 600.0
    assert schedule.due()  # by time, even without new checkpoints


def test_hub_config_is_off_by_default_and_refuses_nowhere_to_push():
    assert HubConfig().enabled is False
    with pytest.raises(ValueError, match="repo_id"):
        HubConfig(enabled=True)
    with pytest.raises(ValueError, match="not both 0"):
        HubConfig(enabled=True, checkpoints_repo_id="me/run", every_checkpoints=0, every_minutes=0)


def test_pushes_the_checkpoint_and_store_snapshot_to_their_repos(tmp_path, hub):
    trainer = Trainer(tiny_policy(), filled_index(), trainer_config(tmp_path / "ckpt"), BC)
    trainer.update_once()
    checkpoint = trainer.checkpoint()
    store_dir = tmp_path / "fake_dataset"
    (store_dir / "meta").mkdir(parents=True)
    (store_dir / "meta" / "info.json").write_text("{}")

    def snapshot(dest: Path) -> bool:
        import shutil
        shutil.copytree(store_dir, dest)
        return True

    pusher = HubPusher(HubConfig(enabled=True, checkpoints_repo_id="me/ckpts", store_repo_id="me/replay",
                                 every_checkpoints=2, every_minutes=0), snapshot)
    pusher.notify_checkpoint(checkpoint)
    assert pusher.push_now()
    assert ("me/ckpts", "model", True) in hub.repos and ("me/replay", "dataset", True) in hub.repos
    model, dataset = hub.uploads
    assert model["repo_id"] == "me/ckpts" and model["repo_type"] == "model"
    assert model["path_in_repo"] == "step-00000001"
    assert {"model.safetensors", "config.json", "trainer.safetensors", "trainer.json"} <= set(model["files"])
    assert dataset == {"repo_id": "me/replay", "repo_type": "dataset", "path_in_repo": None,
                       "files": ["meta/info.json"], "message": "robot_rl replay store snapshot"}
    # Nothing new: the checkpoint is not uploaded twice.
    pusher.push_now()
    assert [u["repo_id"] for u in hub.uploads].count("me/ckpts") == 1


def test_failed_uploads_are_logged_retried_and_never_stop_training(tmp_path, hub, caplog):
    hub.fail_next = 2
    pusher = HubPusher(HubConfig(enabled=True, checkpoints_repo_id="me/ckpts", every_checkpoints=2,
                                 every_minutes=0, poll_s=0.02)).start()
    config = trainer_config(tmp_path / "ckpt", checkpoint_every_updates=1, keep_checkpoints=2)
    trainer = Trainer(tiny_policy(), filled_index(), config, BC, on_checkpoint=pusher.notify_checkpoint)
    with caplog.at_level(logging.ERROR, logger="robot_rl.learner.hub"):
        for _ in range(10):
            assert trainer.update_once() is not None  # training never waits for, nor fails with, the hub
            wait_for(lambda: not pusher.schedule.due(), 10, "the pusher to pick up a due push")
        pusher.stop(final_push=True, timeout_s=30)
    assert trainer.step == 10
    assert pusher.stats.failures == 2
    assert "pushing the checkpoint" in caplog.text and "me/ckpts" in caplog.text and "retried" in caplog.text
    pushed = [u["path_in_repo"] for u in hub.uploads]
    # Every 2 checkpoints: attempts at 2 and 4 fail, 6, 8, 10 go up; the final push has nothing new.
    assert pushed == ["step-00000006", "step-00000008", "step-00000010"]


def test_store_snapshot_is_a_complete_lerobot_dataset(tmp_path):
    png = ImageEncoding("png")
    with ReplayStore(store_config(tmp_path / "store", background_commit=True)) as store:
        snapshot = dataset_snapshot(store)
        assert not snapshot(tmp_path / "empty")  # nothing stored yet: nothing to push
        steps = make_steps(8, robot=1, episode=3)
        for seq, chunk in enumerate((steps[:4], steps[4:])):
            store.ingest(encode_segment("r1", 3, seq, chunk, episode_done=chunk[-1].done, image_encoding=png))
        assert store.flush(30)
        assert snapshot(tmp_path / "snap")
    from tests.learner_helpers import stored_triples

    copy = tmp_path / "copy_root"
    (copy / "dataset").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "snap").rename(copy / "dataset")
    assert sorted(stored_triples(copy)) == [(1, 3, t) for t in range(8)]
