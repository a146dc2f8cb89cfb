"""An agent program under torchrun: each rank serves its own policy endpoint to the programs of its share of the
batch, and the step trains on every rank's episodes."""

import json
import os
import subprocess
import sys

import pytest

from rllava.train.outputs import keys_for

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@pytest.mark.slow
def test_two_ranks_each_serve_their_share_of_the_episodes(tmp_path, tiny_model_dir, counting_dir):
    """2 ranks, 2 steps of 4 prompts x 2 episodes: each rank's endpoint (a port of its own) serves its 2 prompts' 4
    episodes a step, every prompt of a step on exactly one rank, and the logged reward is the whole batch's."""
    out, log = str(tmp_path / "run"), tmp_path / "log"
    log.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
           f"actor.model.model_path={tiny_model_dir}", f"data.train_files={counting_dir}/train.jsonl",
           "data.max_samples=16", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2",
           "data.max_prompt_length=1024", "data.max_response_length=8", *keys_for(out), "trainer.logger=[jsonl]",
           f"rollout.agent.program={HERE}/programs.py:recorded", "trainer.val_before_train=false",
           "trainer.val_freq=-1", "trainer.max_steps=2", "trainer.save_freq=-1"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "RLLAVA_TEST_LOG": str(log)})
    assert res.returncode == 0, res.stderr[-3000:]
    episodes = [line.split() for line in (log / "episodes").read_text().splitlines()]
    assert len(episodes) == 16
    ports = {rank: {port for r, port, _ in episodes if r == rank} for rank in ("0", "1")}
    assert all(len(p) == 1 for p in ports.values()) and ports["0"] != ports["1"], ports
    assert [sum(r == rank for r, _, _ in episodes) for rank in ("0", "1")] == [8, 8]
    prompts = {}
    for r, _, index in episodes:
        prompts.setdefault(index, set()).add(r)
    assert all(len(ranks) == 1 for ranks in prompts.values()), prompts
    rows = [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["agent/program_failures"] == 0.0 for r in rows)
    rewarded = sum(int(index) % 2 for _, _, index in episodes)  # the programs' rewards over both steps' batches
    assert (rows[0]["reward/mean"] + rows[1]["reward/mean"]) * 8 == pytest.approx(rewarded)
