"""FSDP2 on CPU (gloo, 2 ranks): one step matches a single process on the same global batch, and a
checkpoint written by 2 ranks loads in 1."""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "fsdp_worker.py")


def _run(nproc, *args, worker=WORKER):
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"] \
        if nproc > 1 else [sys.executable]
    res = subprocess.run([*launcher, worker, *map(str, args)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def _result(path):
    return torch.load(os.path.join(path, "result.pt"))


def test_two_ranks_match_one_process(tmp_path, tiny_model_dir):
    _run(1, tiny_model_dir, tmp_path / "single", "single")
    _run(2, tiny_model_dir, tmp_path / "fsdp", "fsdp2")
    single, fsdp = _result(tmp_path / "single"), _result(tmp_path / "fsdp")
    assert abs(single["loss"] - fsdp["loss"]) < 1e-5
    assert abs(single["grad_norm"] - fsdp["grad_norm"]) < 1e-4
    assert single["weights"].keys() == fsdp["weights"].keys()
    # Adam's first step is ~lr * sign(grad): a gradient within float noise of 0 may move a weight by up to
    # ~1e-4 either way, so weights are compared to 1% of lr (loss and grad norm above catch scaling errors).
    for k, v in single["weights"].items():
        torch.testing.assert_close(fsdp["weights"][k], v, rtol=1e-4, atol=1e-4, msg=k)


def test_checkpoint_from_two_ranks_resumes_in_one(tmp_path, tiny_model_dir):
    ckpt = tmp_path / "dcp"
    _run(2, tiny_model_dir, tmp_path / "a", "fsdp2", "save_dcp", ckpt)
    # resume the 2-rank state in one process, on either engine, and take the same second step
    _run(1, tiny_model_dir, tmp_path / "b", "single", "load_dcp", ckpt)
    _run(2, tiny_model_dir, tmp_path / "c", "fsdp2", "load_dcp", ckpt)
    one, two = _result(tmp_path / "b"), _result(tmp_path / "c")
    for k, v in two["weights"].items():
        torch.testing.assert_close(one["weights"][k], v, rtol=1e-4, atol=1e-4, msg=k)
    first = _result(tmp_path / "a")
    # the optimizer state came along, whole (a loader that silently skips it would still step)
    assert first["saved_moments"] > 0
    for resumed in (one, two):
        assert abs(resumed["loaded_moments"] - first["saved_moments"]) < 1e-6 * first["saved_moments"]
    assert one["loss"] < first["loss"]  # the resumed step starts from the trained weights


def test_actor_update_on_two_ranks_matches_one_process(tmp_path, tiny_model_dir):
    """The Actor role itself under FSDP2: the training forward through the root's registered forward method,
    image rows, dynamic packed micro-batches (equalised in count over ranks) and global loss normalisers."""
    worker = os.path.join(HERE, "actor_worker.py")
    _run(1, tiny_model_dir, tmp_path / "single", "single", worker=worker)
    _run(2, tiny_model_dir, tmp_path / "fsdp", "fsdp2", worker=worker)
    single, fsdp = _result(tmp_path / "single"), _result(tmp_path / "fsdp")
    (full,) = single["old_logprobs"]
    for r, part in enumerate(fsdp["old_logprobs"]):  # rank r held rows 2r, 2r+1 (padded to their own length)
        torch.testing.assert_close(part, full[2 * r:2 * r + 2, :part.shape[1]], atol=1e-5, rtol=1e-5)
        assert full[2 * r:2 * r + 2, part.shape[1]:].abs().sum() == 0
    assert abs(single["grad_norm"] - fsdp["grad_norm"]) < 1e-4 * single["grad_norm"]
    for k, v in single["weights"].items():  # SGD at lr 1: the weights after the step are before - gradient
        torch.testing.assert_close(fsdp["weights"][k], v, rtol=1e-4, atol=1e-6, msg=k)


def test_rlvr_pipeline_on_two_ranks(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    """`torchrun --nproc_per_node=2 -m rllava.train.pipeline.rlvr actor.strategy=fsdp2` end to end on CPU (gloo):
    KL to a sharded reference, validation sharded over the ranks and gathered, one metrics file, one
    `final/` that plain transformers loads."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
           f"actor.model.model_path={tiny_model_dir}", f"data.train_files={counting_dir}/train.jsonl",
           f"data.val_files={counting_dir}/val.jsonl", "data.max_samples=16", "data.train_batch_size=4",
           "actor.ppo_mini_batch_size=2", "rollout.n=4", "trainer.max_steps=2", "trainer.val_freq=2",
           "data.val_batch_size=8", "trainer.val_generations_to_log=1000", f"trainer.outputs_dir={out}",
           "trainer.logger=[jsonl]", "actor.strategy=fsdp2", "algorithm.use_kl_loss=true", "actor.kl_loss_coef=0.1",
           f"reward.reward_function={distinct_reward}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]  # rank 0 alone writes
    assert all(r["actor/kl_loss"] >= 0 and "actor/grad_norm" in r for r in rows if "reward/mean" in r)
    generations = [json.loads(line) for line in open(out / "val_generations.jsonl")]
    for step in (0, 2):  # every held-out prompt, x n samples, from the two ranks' shares
        indices = sorted(g["index"] for g in generations if g["step"] == step)
        assert indices == sorted(list(range(16)) * 2)
    before = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    after = load_file(out / "final" / "model.safetensors")
    assert before.keys() == after.keys() and sum(not torch.equal(before[k], after[k]) for k in before) > len(before) // 2
    AutoModelForImageTextToText.from_pretrained(out / "final")
