"""A damaged file a learner reads at start is one line on stderr and exit code 2, never a traceback
or a learner that comes up and waits; the data already stored is left as it was.

The same file holds the learner's process entry (``python -m tests.test_corrupt_files ARGS``):
``robot-rl learner`` through the CLI, with the tiny test policy unless ``learner.init_checkpoint`` is set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robot_rl.core.errors import CorruptFileError
from robot_rl.data.validation import check_dataset
from tests.learner_helpers import make_steps, store_config, tiny_policy
from tests.test_learner_crash import ENV, REPO, free_port, learner_overrides

pytestmark = pytest.mark.slow  # one learner process per damaged file

STARTED_TIMEOUT_S = 180  # a cold learner process imports torch and LeRobot
FIRST_DATA = Path("dataset/data/chunk-000/file-000.parquet")


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """A store holding two committed episodes, each in a data and an episodes file of its own."""
    from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment
    from robot_rl.learner.store import ReplayStore

    root = tmp_path_factory.mktemp("stored")
    with ReplayStore(store_config(root / "store")) as store:
        for episode in (1, 2):
            steps = make_steps(8, episode=episode)
            for seq, chunk in enumerate((steps[:4], steps[4:])):
                store.ingest(encode_segment("r0", episode, seq, chunk, episode_done=chunk[-1].done,
                                            image_encoding=ImageEncoding("png")))
        store.flush()
    assert (root / "store" / "dataset/data/chunk-000/file-001.parquet").is_file()
    return root


def garble(path: Path, offset: int = 40) -> None:
    """Bytes that are neither UTF-8 nor what the file's format expects, over the file's own."""
    data = bytearray(path.read_bytes())
    data[offset:offset + 16] = b"\xff\xfe\x00\x81" * 4
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def flip_state_page(path: Path) -> None:
    """One flipped byte where the state column's first data page begins (its page header)."""
    row_group = pq.ParquetFile(path).metadata.row_group(0)
    state = next(row_group.column(i) for i in range(row_group.num_columns)
                 if row_group.column(i).path_in_schema.startswith("observation.state"))
    data = bytearray(path.read_bytes())
    data[state.data_page_offset] ^= 0xFF
    path.write_bytes(bytes(data))


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def run_learner(root: Path, *args: str) -> tuple[int, str]:
    """(exit code, output) of a learner on ``root``; one that comes up is stopped and reported as such."""
    log = root / "learner.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.test_corrupt_files", "--no-train", *args,
                                 *learner_overrides(root, free_port(), free_port())],
                                cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTED_TIMEOUT_S
        while proc.poll() is None and "learner up" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
            return -1, log.read_text()
    return proc.returncode, log.read_text()


# (what is damaged, relative to the run's root; how; extra learner arguments; a word of what to do)
CASES: dict[str, tuple[str, Callable[[Path], None], tuple[str, ...], str]] = {
    "info.json garbled": ("store/dataset/meta/info.json", garble, (), "restore it"),
    "tasks.parquet garbled": ("store/dataset/meta/tasks.parquet", lambda p: garble(p, p.stat().st_size // 2), (),
                              "restore it"),
    "stats.json garbled": ("store/dataset/meta/stats.json", garble, (), "move it aside"),
    "first data file truncated": (f"store/{FIRST_DATA}", truncate, (), "restore it"),
    "state column byte flipped": (f"store/{FIRST_DATA}", flip_state_page, (), "restore it"),
    "episodes metadata garbled": ("store/dataset/meta/episodes/chunk-000/file-000.parquet",
                                  lambda p: garble(p, p.stat().st_size - 40), (), "restore it"),
    "store layout.json garbled": ("store/layout.json", lambda p: garble(p, 2), (), "restore it"),
    "init checkpoint truncated": ("init/model.safetensors", truncate, ("learner.init_checkpoint={root}/init",),
                                  "save or download it again"),
    "checkpoint pointer garbled": ("ckpt/latest", lambda p: garble(p, 0), ("--resume",), "write the name"),
}


def damaged_run(stored: Path, root: Path, case: str) -> None:
    """``root`` holds a copy of the store, a starting checkpoint and a checkpoint pointer, one damaged as
    ``case`` says."""
    damaged, damage, _, _ = CASES[case]
    shutil.copytree(stored / "store", root / "store")
    tiny_policy().save_pretrained(root / "init")
    (root / "ckpt").mkdir()
    (root / "ckpt" / "latest").write_text("step-00000001\n")
    damage(root / damaged)


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_file_is_one_line_and_exit_2_and_the_store_is_untouched(stored, tmp_path, case):
    damaged, _, args, remedy = CASES[case]
    damaged_run(stored, tmp_path, case)
    before = digests(tmp_path / "store")

    code, output = run_learner(tmp_path, *(a.format(root=tmp_path) for a in args))

    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("robot-rl learner:")]
    assert code == 2 and len(errors) == 1, f"exit {code}:\n{output[-3000:]}"
    assert f"{tmp_path / damaged}:" in errors[0] and remedy in errors[0], errors[0]
    assert digests(tmp_path / "store") == before


PREFLIGHT = """import sys
from robot_rl.config import load_config
from robot_rl.core.errors import CorruptFileError
from robot_rl.app.preflight import check_learner_files
try:
    check_learner_files(load_config(sys.argv[2:]), resume=sys.argv[1] == "--resume")
except CorruptFileError as exc:
    print(exc.path)
print(sorted(name for name in ('lerobot', 'transformers') if name in sys.modules))
"""


@pytest.mark.parametrize("case", ["stats.json garbled", "checkpoint pointer garbled", "init checkpoint truncated"])
def test_the_learner_names_a_damaged_file_before_it_imports_lerobot(stored, tmp_path, case):
    """The ~10 s of LeRobot's imports come after the check: a damaged file is said at once."""
    damaged, _, args, _ = CASES[case]
    damaged_run(stored, tmp_path, case)
    overrides = [f"learner.store.root={tmp_path / 'store'}", f"learner.trainer.checkpoint_dir={tmp_path / 'ckpt'}",
                 f"learner.init_checkpoint={tmp_path / 'init'}"]
    resume = "--resume" if "--resume" in args else "--fresh"
    done = subprocess.run([sys.executable, "-c", PREFLIGHT, resume, *overrides], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [str(tmp_path / damaged), "[]"], done.stdout


def test_an_edge_given_a_truncated_checkpoint_says_so_in_one_line_and_exits_2(tmp_path):
    tiny_policy().save_pretrained(tmp_path / "policy")
    truncate(tmp_path / "policy" / "model.safetensors")
    done = subprocess.run([sys.executable, "-m", "robot_rl.cli", "edge", f"policy.path={tmp_path / 'policy'}",
                           f"link.learner=tcp://127.0.0.1:{free_port()}", "session.episodes=1",
                           "session.realtime=false", f"output_dir={tmp_path / 'outputs'}"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=STARTED_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert "Traceback" not in output and done.returncode == 2, output[-3000:]
    assert output.strip().splitlines()[-1].startswith(f"robot-rl edge: {tmp_path / 'policy' / 'model.safetensors'}: ")
    assert "save or download it again" in output


def test_an_edge_names_a_truncated_checkpoint_before_it_imports_torch(tmp_path):
    """The runtime's imports (PyTorch, LeRobot's dataset writer, the drivers) come after the check."""
    tiny_policy().save_pretrained(tmp_path / "policy")
    truncate(tmp_path / "policy" / "model.safetensors")
    script = """import sys
from robot_rl.config import load_config
from robot_rl.core.errors import CorruptFileError
from robot_rl.app.preflight import check_session_files
try:
    check_session_files(load_config(sys.argv[1:]))
except CorruptFileError as exc:
    print(exc.path)
print(sorted(name for name in ('torch', 'lerobot') if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script, f"policy.path={tmp_path / 'policy'}",
                           f"session.dataset_root={tmp_path / 'dataset'}"], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [str(tmp_path / "policy" / "model.safetensors"), "[]"], done.stdout


# ---------------------------------------------------------------- a LeRobot checkpoint (policy=lerobot)

LEROBOT_DAMAGE: dict[str, tuple[str, Callable[[Path], None]]] = {
    "config.json garbled": ("config.json", garble),
    "model.safetensors truncated": ("model.safetensors", truncate),
}


@pytest.fixture(scope="module")
def act(tmp_path_factory) -> Path:
    from tests.lerobot_policies import tiny_act_dir

    return tiny_act_dir(tmp_path_factory.mktemp("act") / "act")


def damaged_act(act: Path, tmp_path: Path, case: str) -> Path:
    name, damage = LEROBOT_DAMAGE[case]
    shutil.copytree(act, tmp_path / "act")
    damage(tmp_path / "act" / name)
    return tmp_path / "act" / name


@pytest.mark.parametrize("case", list(LEROBOT_DAMAGE))
def test_a_damaged_lerobot_checkpoint_is_one_error_naming_its_file(act, tmp_path, case):
    from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy

    damaged = damaged_act(act, tmp_path, case)
    with pytest.raises(CorruptFileError) as refused:
        LeRobotChunkPolicy.from_pretrained(damaged.parent, device="cpu")
    assert refused.value.path == damaged and "save or download it again" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_learner_given_a_lerobot_checkpoint_with_a_garbled_config_says_so_in_one_line_and_exits_2(act, tmp_path):
    damaged = damaged_act(act, tmp_path, "config.json garbled")
    code, output = run_learner(tmp_path, "policy=lerobot", f"policy.path={damaged.parent}", "policy.device=cpu")
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("robot-rl learner:")]
    assert code == 2 and len(errors) == 1 and f"{damaged}:" in errors[0], f"exit {code}:\n{output[-3000:]}"


def test_an_edge_given_a_lerobot_checkpoint_with_truncated_weights_says_so_in_one_line_and_exits_2(act, tmp_path):
    damaged = damaged_act(act, tmp_path, "model.safetensors truncated")
    done = subprocess.run([sys.executable, "-m", "robot_rl.cli", "edge", "policy=lerobot",
                           f"policy.path={damaged.parent}", "policy.device=cpu",
                           f"link.learner=tcp://127.0.0.1:{free_port()}", "session.episodes=1",
                           "session.realtime=false", f"output_dir={tmp_path / 'outputs'}"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=STARTED_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert "Traceback" not in output and done.returncode == 2, output[-3000:]
    assert output.strip().splitlines()[-1].startswith(f"robot-rl edge: {damaged}: ")


# ---------------------------------------------------------------- what the check lets through, in process


def test_a_newest_file_a_killed_writer_left_without_its_footer_passes(stored, tmp_path):
    """Crash recovery is the store's (``robot_rl.data.repair`` rolls the torn tail back): not damage."""
    shutil.copytree(stored / "store", tmp_path / "store")
    dataset = tmp_path / "store" / "dataset"
    truncate(dataset / "data/chunk-000/file-001.parquet")
    truncate(dataset / "meta/episodes/chunk-000/file-001.parquet")
    check_dataset(dataset)
    check_dataset(tmp_path / "no dataset yet")


@pytest.mark.parametrize("edit", [{"fps": 0}, {"fps": "30"}, {"features": ["observation.state"]},
                                  {"chunks_size": -1}, {"features": {"observation.state": 3}}])
def test_an_info_json_lerobot_would_refuse_is_refused_at_start_naming_the_key(stored, tmp_path, edit):
    """The start check mirrors LeRobot's ``DatasetInfo`` without importing ``lerobot.datasets``: what
    LeRobot refuses when the store's writer opens the dataset is refused before the learner serves."""
    import json

    from lerobot.datasets.utils import DatasetInfo

    shutil.copytree(stored / "store", tmp_path / "store")
    path = tmp_path / "store" / "dataset" / "meta" / "info.json"
    info = {**json.loads(path.read_text()), **edit}
    with pytest.raises((TypeError, ValueError, AttributeError)):
        DatasetInfo.from_dict(json.loads(json.dumps(info)))
    path.write_text(json.dumps(info))
    with pytest.raises(CorruptFileError, match=f"info.json: .*{next(iter(edit))}"):
        check_dataset(tmp_path / "store" / "dataset")


def test_a_state_that_is_not_finite_is_damage_naming_the_file_and_row(stored, tmp_path):
    shutil.copytree(stored / "store", tmp_path / "store")
    path = tmp_path / "store" / FIRST_DATA
    table = pq.read_table(path)
    states = table.column("observation.state").to_pylist()
    states[3][2] = float("nan")
    column = table.column_names.index("observation.state")
    pq.write_table(table.set_column(column, "observation.state", pa.array(states, table.schema.field(column).type)),
                   path)
    with pytest.raises(CorruptFileError, match=r"file-000\.parquet: column observation\.state holds NaN/inf \(row 3\)"):
        check_dataset(tmp_path / "store" / "dataset")


# ---------------------------------------------------------------- process entry


def main(argv: list[str]) -> int:
    import robot_rl.app.policies as policies
    from robot_rl import cli

    if not any(a.startswith(("learner.init_checkpoint=", "policy.path=")) for a in argv):
        policies.learner_policy = lambda config: tiny_policy()  # offline text encoder, tiny net
    return cli.main(["learner", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
