"""Frame-sized blocks are handed back to the system when freed, once ``map_big_blocks`` ran."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import numpy as np, psutil
from robot_rl.core.heap import map_big_blocks
first = np.ones(1 << 20, dtype=np.uint8); del first  # glibc's threshold rises past a freed mapped block
if sys.argv[1] == "mapped":
    map_big_blocks()
frames = [np.full((480, 640, 3), i % 256, dtype=np.uint8) for i in range(300)]  # a burst of decoded 640x480 frames
kept = frames[-1]  # the newest is still used: on the heap, it pins the memory below it
rss = psutil.Process().memory_info().rss
del frames
print(json.dumps((rss - psutil.Process().memory_info().rss) / 2**20))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_frames_freed_after_map_big_blocks_leave_the_process():
    freed = {mode: json.loads(subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                                             check=True, timeout=120).stdout) for mode in ("heap", "mapped")}
    assert freed["mapped"] >= 250  # 299 frames of 0.88 MB gone from the process
    assert freed["heap"] <= 50  # the default: kept by the heap under the newest frame
