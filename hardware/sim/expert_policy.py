"""ExpertChunkPolicy: the scripted expert as a ChunkPolicy, for measuring the edge runtime.

It plans each chunk from privileged sim state (where the cube is now), so its perception
is perfect and instant: whatever delay remains between a change in the world and the
executed actions is the runtime's (request timing, inference latency, splicing), not the
policy's. A learned policy adds its own sluggishness on top (it may barely react to the
image at all). Sim only; never a stand-in for a learned policy in the product.
"""

from __future__ import annotations

import numpy as np

from robot_rl.hardware.sim.expert import ScriptedExpert


class ExpertChunkPolicy:
    """``predict_chunk`` = the expert's plan of ``chunk_size`` commands from the given state."""

    action_dim = 6

    def __init__(self, expert: ScriptedExpert, chunk_size: int = 20) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.expert = expert
        self.chunk_size = chunk_size

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        # ``state`` is what the edge hands a policy: rolled forward to where the chunk starts.
        return self.expert.plan_chunk(np.asarray(state, dtype=np.float32), self.chunk_size)

    def save_pretrained(self, directory) -> None:
        raise NotImplementedError("the expert chunk policy reads privileged sim state; it has no weights to save")
