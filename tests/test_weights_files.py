"""Download buffers under /dev/shm: reused once the policy process releases them, never while it reads
them, bounded, and removed when the edge stops or after it crashed."""

import os
import subprocess
import sys
import time

from robot_rl.bridges.zmq.weights import HEADER_ROOM
from robot_rl.edge.weights_files import KEEP_FREE, PREFIX, WeightsFilePool, remove_stale_files


def _wait_for_a_free_file(pool: WeightsFilePool) -> None:
    deadline = time.monotonic() + 10
    while pool.free == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.free == 1


def test_a_prepared_file_serves_the_first_download_that_fits_in_it(tmp_path):
    pool = WeightsFilePool(tmp_path)
    pool.prepare(1000 + HEADER_ROOM)  # the published tensors, and room for any header
    _wait_for_a_free_file(pool)
    [prepared] = list(tmp_path.iterdir())
    view = pool.allocate(1000 + 120)  # what arrives: the tensors behind a 120-byte header
    assert view.nbytes == 1120 and pool.reused == 1 and pool.stage(view) == prepared
    pool.release(str(prepared))
    again = pool.allocate(1120)  # the released file, whose pages are in, serves the next version too
    assert pool.reused == 2 and pool.stage(again) == prepared
    pool.close()
    assert list(tmp_path.iterdir()) == []


def test_a_download_of_another_model_removes_the_free_files_of_the_old_one(tmp_path):
    pool = WeightsFilePool(tmp_path)
    pool.prepare(1000 + HEADER_ROOM)
    _wait_for_a_free_file(pool)
    small = pool.allocate(100)  # far smaller: a 1 MB file holding a 100-byte download would be waste
    path = pool.stage(small)
    assert pool.reused == 0 and pool.free == 0 and list(tmp_path.iterdir()) == [path]
    pool.close()


def test_a_released_file_is_the_next_download_of_its_size(tmp_path):
    pool = WeightsFilePool(tmp_path)
    first = pool.allocate(1000)
    first[:4] = b"v001"
    path = pool.stage(first)
    assert path is not None and path.read_bytes()[:4] == b"v001"
    # Staged: the policy process may be reading it, so the next download gets another file.
    second = pool.allocate(1000)
    assert pool.stage(second) != path and pool.reused == 0
    pool.release(str(path))
    third = pool.allocate(1000)
    assert pool.reused == 1 and pool.stage(third) == path
    # A size that does not fit in it never reuses it.
    pool.release(str(path))
    other = pool.allocate(HEADER_ROOM)
    assert pool.stage(other) != path and pool.reused == 1
    pool.close()
    assert list(tmp_path.iterdir()) == []


def test_a_download_a_few_bytes_longer_than_the_last_is_assembled_in_its_file(tmp_path):
    pool = WeightsFilePool(tmp_path)
    path = pool.stage(pool.allocate(1000))
    pool.release(str(path))
    longer = pool.allocate(1008)  # version 10's header is 8 bytes longer than version 9's
    assert longer.nbytes == 1008 and pool.reused == 1 and pool.stage(longer) == path
    pool.close()


def test_at_most_keep_free_files_are_kept_and_unknown_paths_are_removed(tmp_path):
    pool = WeightsFilePool(tmp_path)
    views = [pool.allocate(100) for _ in range(KEEP_FREE + 2)]  # the link still holds its views
    staged = [pool.stage(view) for view in views]
    for path in staged:
        pool.release(str(path))  # one too many is removed, without closing the mapping under a view
    assert len(list(tmp_path.iterdir())) == KEEP_FREE
    stray = tmp_path / "written-once"
    stray.write_bytes(b"x")  # a payload written to a file of its own (not a buffer of the pool)
    pool.release(str(stray))
    assert not stray.exists()
    assert pool.stage(memoryview(bytearray(10))) is None
    pool.close()


def test_files_of_an_edge_that_died_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    left = tmp_path / f"{PREFIX}{dead_pid}-abc"
    live = tmp_path / f"{PREFIX}{os.getpid()}-def"
    other = tmp_path / "someone-elses-file"
    for path in (left, live, other):
        path.write_bytes(b"x")
    assert remove_stale_files(tmp_path) == [left]
    assert live.exists() and other.exists() and not left.exists()
