"""Run by tests/train/test_distill_ranks.py under `torchrun --nproc_per_node=2`: two teachers (routes a and b), each
sharded by the engine, score each rank's rows for 2 steps. Step 1 sends all of rank 0's rows to a and rank 1's to
both; step 2 all of rank 0's to b. Teacher a takes one row per micro-batch, so the ranks also differ in how many
rows they hold for the forwards they must all run; b takes 4 (one forward, which only one rank needs).

    python distill_ranks_worker.py TEACHER_A TEACHER_B OUT_DIR STRATEGY      (STRATEGY: fsdp2 | deepspeed3)

Writes OUT_DIR/result.json (rank 0): each rank's largest gap to the unsharded teachers' log-probs of its rows.
"""

import json
import os
import sys

import torch

from rllava import distributed as D
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.model.forward import token_logprobs
from rllava.model.loader import load_model
from rllava.roles.batching import MicroBatching
from rllava.roles.reference import Reference
from rllava.roles.teacher import Teachers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engine"))
from fsdp_worker import make_engine  # noqa: E402

ROUTES = {1: ["aaaa", "abba"], 2: ["bbbb", "baab"]}  # step -> each rank's rows' teachers


def rows(step: int, kinds: str):
    g = torch.Generator().manual_seed(10 * step + D.rank())
    return collate([Trajectory(Sample(i, [], [], None, extra={"kind": k}), i, [
        Segment(torch.randint(20, 1000, (3,), generator=g).tolist(), False),
        Segment(torch.randint(20, 1000, (2 + 3 * i,), generator=g).tolist(), True)], {})
        for i, k in enumerate(kinds)], pad_token_id=0)


def main(path_a, path_b, out_dir, strategy):
    device = D.init("cpu")
    engine = make_engine(strategy, device)
    models = {k: load_model(p, dtype=torch.float32).requires_grad_(False).eval() for k, p in (("a", path_a),
                                                                                              ("b", path_b))}
    batches = {s: rows(s, kinds[D.rank()]) for s, kinds in ROUTES.items()}
    with torch.no_grad():  # each row alone through its plain teacher
        want = {s: [token_logprobs(models[t.sample.extra["kind"]], b.select([i]))[0][0] for i, t in
                    enumerate(b.trajectories)] for s, b in batches.items()}
    teachers = Teachers({k: Reference(engine.shard_frozen(m), MicroBatching(1 if k == "a" else 4), 1.0)
                         for k, m in models.items()}, route_field="kind")
    gap = 0.0
    for s, b in batches.items():
        got = teachers.compute_logprobs(b)
        gap = max(gap, *[float((got[i, :len(w)] - w).abs().max()) for i, w in enumerate(want[s])])
    gaps = D.gather([gap])
    if D.is_main():
        os.makedirs(out_dir, exist_ok=True)
        json.dump({"gaps": gaps}, open(os.path.join(out_dir, "result.json"), "w"))
    D.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
    D.exit_process(0)  # as the pipelines end under torchrun: no race with gloo's threads at exit
