"""Run by tests/algorithms/test_curriculum.py under `torchrun --nproc_per_node=2`, or plain python (one process on
the same global batches): 8 draws of data.sampler=difficulty_pools over 24 prompts, 4 per batch; each rank takes
its share (`Run.next_samples`), scores it (2 responses a prompt, fixed by the prompt and the draw) and feeds the
sampler as the RLVR step does: its groups' outcomes, gathered over the ranks (`D.gather`).

    python curriculum_worker.py OUT_DIR

Writes OUT_DIR/rank_R.json: the batches drawn and the sampler's final state.
"""

import json
import os
import sys

from rllava import distributed as D
from rllava.algorithms.curriculum import DifficultyPools

D.init("cpu")
sampler = DifficultyPools(24, 4, shuffle=True, seed=5, set_aside_after=1, readmit_after=3)
batches = []
for draw in range(8):
    batch = sampler.next_batch()
    batches.append(batch)
    groups = [(j, [float((j * (draw + k)) % 3 == 0) for k in range(2)]) for j in D.shard(batch, "prompts")]
    sampler.observe(D.gather(groups))
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], f"rank_{D.rank()}.json"), "w") as f:
    json.dump({"batches": batches, "state": sampler.state_dict()}, f)
