"""Routed teachers on several ranks: every rank runs every route that any rank's rows hit, in one order, with as
many forwards as the rank with the most micro-batches, since each pass is collective (a sharded teacher's
forward, a tensor-parallel engine's gather). Ranks that went their own way would hang or crash."""

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest
import torch
from transformers import AutoModelForImageTextToText

from rllava import distributed as D
from rllava.model.processor import get_tokenizer
from rllava.roles.batching import MicroBatching, compute_logprobs
from rllava.roles.reference import Reference
from rllava.roles.teacher import Teachers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "engine"))
import test_rollout_engines as E  # noqa: E402  (the engines' fakes)


@pytest.fixture(scope="module")
def wide_teacher_dir(tmp_path_factory):
    """Another size than the student's (one tokenizer): its forward's collectives differ from the other's."""
    from rllava.model.tiny import build_tiny

    return build_tiny("qwen2_vl", str(tmp_path_factory.mktemp("teacher") / "qwen2_vl"), size="demo", seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp2", pytest.param("deepspeed3", marks=pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed not installed"))])
def test_ranks_whose_rows_hit_different_teachers_stay_in_step(tmp_path, tiny_model_dir, wide_teacher_dir, strategy):
    """2 ranks (gloo), 2 steps: rank 0's rows all go to one teacher, rank 1's to both; each row gets its own
    teacher's log-probs. Before routes ran on every rank this hung (so: a time limit) or crashed."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           os.path.join(HERE, "distill_ranks_worker.py"), tiny_model_dir, wide_teacher_dir, tmp_path, strategy]
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        _, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun ends the ranks (sessions of their own: a SIGKILL would leave them hanging)
        pytest.fail(f"the ranks hung: {proc.communicate(timeout=60)[1][-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    gaps = json.load(open(tmp_path / "result.json"))["gaps"]
    assert len(gaps) == 2 and max(gaps) < 1e-5, gaps


@pytest.mark.parametrize("theirs", [0, 2])
def test_vllm_tensor_parallel_ranks_may_score_different_counts(monkeypatch, tiny_model_dir, theirs):
    """Rank 1 of a tensor-parallel engine with 1 request while rank 0 has `theirs`: it keeps its own output (a
    teacher's route may hold more rows on one rank than on another)."""
    import rllava.engine.inference.vllm as vllm_engine

    engine, processor, log = E._teacher(monkeypatch, "vllm", tiny_model_dir)
    requests = E._score_requests(processor)
    mine = requests[2]
    monkeypatch.setattr(vllm_engine, "dist", types.SimpleNamespace(
        get_world_size=lambda group: 2, get_rank=lambda group: 1,
        all_gather_object=lambda out, obj, group: out.__setitem__(slice(None), [requests[:theirs], obj])))
    engine.tp_group = object()
    image_pad = get_tokenizer(processor).convert_tokens_to_ids("<|image_pad|>")
    assert engine.score([mine]) == [pytest.approx(e) for e in E._expected_scores([mine], image_pad)]


def test_a_rank_runs_the_forwards_another_rank_needs(monkeypatch, tiny_model_dir):
    """This process as a rank whose 2 rows go to teacher a, beside one that needs 4 forwards of a and 2 of b (one
    row each): it runs a 4 times (its rows, row 0 twice more) and b twice on the stand-in row; it keeps its own."""
    import rllava.roles.batching as A
    from distill_ranks_worker import rows

    a, b = (AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32) for _ in range(2))
    batch = rows(1, "aa")
    want = compute_logprobs(a, batch, MicroBatching(1), 1.0)
    calls, forward = [], A.token_logprobs

    def record(m, micro, **kw):
        calls.append((m, len(micro), micro.input_ids.shape[1]))
        return forward(m, micro, **kw)

    monkeypatch.setattr(A, "token_logprobs", record)
    monkeypatch.setattr(D, "all_sum", lambda counts: [6, 2])  # the rows of routes a, b over the ranks
    counts = iter([4, 2])  # the most micro-batches of a's pass, of b's pass
    monkeypatch.setattr(D, "all_max", lambda mine: next(counts))
    got = Teachers({k: Reference(m, MicroBatching(1), 1.0) for k, m in (("a", a), ("b", b))},
                   route_field="kind").compute_logprobs(batch)
    assert [(m is a, n) for m, n, _ in calls] == [(True, 1)] * 4 + [(False, 1)] * 2
    assert [t for m, _, t in calls if m is b] == [2, 2]  # the stand-in: 2 tokens
    torch.testing.assert_close(got, want)
