"""Supervised fine-tuning on reference responses, with the same config, data, model and Actor as RLVR.

    python -m rllava.train.pipeline.sft config=examples/config.yaml data.target_key=solution k=v

Each step teacher-forces `data.target_key` (the reference response) after the prompt and minimises its NLL
(the `sft` policy loss) through `Actor.update`: SFT is the RL update with given instead of sampled responses.
Used to warm a model up before RL (a random tiny model cannot learn from reward alone).
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

from rllava.config import ConfigError
from rllava.data.dataset import encode_prompt
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.model.loader import save_model
from rllava.model.processor import get_tokenizer
from rllava.reward.function import RewardFunction
from rllava.train import builders as B
from rllava.train.cli import run
from rllava.train import evaluate as E
from rllava.train.tracker import Timer


def reference_trajectory(processor, sample: Sample, max_response_length: int) -> Trajectory:
    """[prompt (given), reference response + EOS (trained, off-policy)], truncated to the response budget."""
    tok = get_tokenizer(processor)
    prompt_ids, mm = encode_prompt(processor, sample)
    target = tok(str(sample.target), add_special_tokens=False)["input_ids"][:max_response_length - 1]
    return Trajectory(sample=sample, group_id=sample.index, mm_inputs=mm, response=str(sample.target),
                      segments=[Segment(prompt_ids, trained=False),
                                Segment(target + [tok.eos_token_id], trained=True, off_policy=True)])


def train(cfg) -> str:
    if not cfg.data.target_key:
        raise ConfigError("the SFT pipeline needs data.target_key: the record field holding the reference response")
    device, outputs_dir = B.setup_run(cfg)
    model, processor = B.build_policy(cfg.actor.model, device)
    train_set, val_set = B.build_datasets(cfg, processor, target_key=cfg.data.target_key)
    sampler = B.build_sampler(cfg, train_set)
    steps = B.total_steps(cfg, sampler)
    actor = B.build_actor(cfg, model, device, steps, sft=True)
    tracker = B.build_tracker(cfg, outputs_dir)
    pad_id = get_tokenizer(processor).pad_token_id
    reward = rollout = None
    if val_set is not None and cfg.reward.reward_function:  # held-out accuracy of the policy's own answers
        reward = RewardFunction(cfg.reward.reward_function, cfg.reward.reward_type, cfg.reward.reward_function_kwargs)
        rollout = B.build_rollout(cfg, processor, device)

    def validate(step: int) -> None:
        if reward is not None:
            tracker.log(E.validate(cfg, model, rollout, reward, val_set, step, outputs_dir), step)

    if cfg.trainer.val_before_train:
        validate(0)
    timer = Timer()
    for step in tqdm(range(1, steps + 1), desc="sft", disable=not sys.stderr.isatty()):
        with timer("step"):
            samples = [train_set[i] for i in sampler.next_batch()]
            batch = collate([reference_trajectory(processor, s, cfg.data.max_response_length) for s in samples], pad_id)
            metrics = actor.update(batch)
        metrics.update(timer.pop(), **{"actor/lr": actor.engine.scheduler.get_last_lr()[0]})
        metrics["perf/tokens_per_s"] = batch.attention_mask.sum().item() / metrics["timing/step"]
        tracker.log(metrics, step)
        if cfg.trainer.val_freq > 0 and (step % cfg.trainer.val_freq == 0 or step == steps):
            validate(step)
    save_model(model, processor, os.path.join(outputs_dir, "final"))
    tracker.close()
    return outputs_dir


def main(argv: list[str] | None = None) -> None:
    run(train, argv)


if __name__ == "__main__":
    main()
