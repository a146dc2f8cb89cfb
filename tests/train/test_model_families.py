"""Every model family of the seeds runs the full RLVR loop (2 steps, KL to the reference, validation)."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from rllava.model.tiny import build_tiny
from rllava.train.pipeline import rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_two_steps(model_dir, data_dir, out, *extra):
    """Two RLVR steps on `model_dir`; returns the weights before and after."""
    reward = os.path.join(out + "-reward.py")
    with open(reward, "w") as f:  # random models never answer right: reward what their samples vary in
        f.write("def compute_score(response, ground_truth):\n    return len(set(response)) / 20\n")
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model_dir}",
               f"data.train_files={data_dir}/train.jsonl", f"data.val_files={data_dir}/val.jsonl",
               "data.max_samples=8", "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4",
               "trainer.max_steps=2", "trainer.val_freq=2", "data.val_batch_size=8", "algorithm.use_kl_loss=true",
               "actor.kl_loss_coef=0.1", f"reward.reward_function={reward}:compute_score", *keys_for(out),
               "trainer.logger=[jsonl]", *extra])
    return load_file(os.path.join(model_dir, "model.safetensors")), \
        load_file(os.path.join(out, "final", "model.safetensors"))


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])  # qwen2_vl: tests/train/test_pipelines.py
def test_vlm_family_trains(tmp_path, counting_dir, arch, monkeypatch):
    monkeypatch.chdir(REPO)
    model = build_tiny(arch, str(tmp_path / arch), size="small")
    before, after = run_two_steps(model, counting_dir, str(tmp_path / "run"))
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    # the vision tower and the language model both train (key layouts differ between the families' files)
    assert any("visual." in k for k in changed) and any("layers." in k and "visual" not in k for k in changed)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_text_only_lm_trains(tmp_path, arch, monkeypatch):
    """A text-only causal LM (its processor is the tokenizer) on a text-only task (no image column)."""
    monkeypatch.chdir(REPO)
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 8), ("val", 4)):
        with open(data / f"{split}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n")
    model = build_tiny(arch, str(tmp_path / arch), size="small")
    before, after = run_two_steps(model, str(data), str(tmp_path / "run"))
    assert sum(not torch.equal(before[k], after[k]) for k in before) > len(before) // 2
