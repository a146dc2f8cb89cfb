"""The real RLVR CLI on video prompts (the pipeline tier): a tiny Qwen2-VL, counting videos, 2 steps."""

import json
import os

import torch
from safetensors.torch import load_file

from rllava.train.pipeline import rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rlvr_two_steps_on_videos(tmp_path, tiny_model_dir, counting_videos_dir, distinct_reward, monkeypatch):
    monkeypatch.chdir(REPO)  # the config's template and reward paths are relative to the repository
    out = str(tmp_path / "run")
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
               f"data.train_files={counting_videos_dir}/train.jsonl", f"data.val_files={counting_videos_dir}/val.jsonl",
               "data.max_samples=12", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2",
               "actor.ppo_micro_batch_size=8", "rollout.n=4", "trainer.max_steps=2", "trainer.val_freq=2",
               "data.val_batch_size=8", "data.video_key=videos", "data.video_fps=2", "data.video_max_frames=4",
               "data.video_max_pixels=3136", f"reward.reward_function={distinct_reward}",
               "actor.model.padding_free=true", *keys_for(out), "trainer.logger=[jsonl]"])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]
    assert all(r["actor/grad_norm"] > 0 for r in steps)
    before, after = load_file(f"{tiny_model_dir}/model.safetensors"), load_file(f"{out}/final/model.safetensors")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("visual" in k for k in changed) and len(changed) > len(before) // 2  # the video reached the tower
