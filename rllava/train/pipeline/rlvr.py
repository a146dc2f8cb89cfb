"""RL with verifiable rewards: the paper's four stages per step.

    python -m rllava.train.pipeline.rlvr config=examples/config.yaml data.train_files=... k=v
    torchrun --nproc_per_node=1 -m rllava.train.pipeline.rlvr config=... k=v

    for each step:
        1. rollout    K responses per prompt                (Rollout role, through a rollout engine)
        2. reward     one score per response                (Reward role: the user's file.py:fn)
        3. advantage  scores -> per-token advantages        (registered estimator, e.g. grpo)
        4. update     policy loss (+ KL to the reference)   (Actor role, through a train engine)
"""

from __future__ import annotations

import os
import sys

import numpy as np
from tqdm import tqdm

from rllava.data.protocol import Batch, collate
from rllava.engine.inference.base import generate_context
from rllava.model.loader import save_model
from rllava.reward.function import RewardFunction
from rllava.train import builders as B
from rllava.train.cli import run
from rllava.train import evaluate as E
from rllava.train.tracker import Timer


def batch_metrics(batch: Batch) -> dict[str, float]:
    """What a researcher watches besides the loss: reward, accuracy, lengths, and how many groups carry signal."""
    scores, trajs = batch.need("scores"), batch.trajectories
    lengths = np.array([t.num_response_tokens for t in trajs])
    metrics = {"reward/mean": scores.mean().item(), "reward/std": scores.std().item() if len(scores) > 1 else 0.0,
               "reward/accuracy_mean": float(np.mean([E.accuracy_of(d) for d in batch.reward_details])),
               "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
               "response_length/clip_ratio": float(np.mean([t.finish_reason == "length" for t in trajs])),
               "prompt_length/mean": float(batch.attention_mask.sum(-1).float().mean() - lengths.mean())}
    for key in sorted({k for d in batch.reward_details for k in d} - {"overall"}):
        metrics[f"reward/{key}_mean"] = float(np.mean([d.get(key, 0.0) for d in batch.reward_details]))
    groups = {}
    for g, s in zip(batch.group_ids.tolist(), scores.tolist()):
        groups.setdefault(g, []).append(s)
    metrics["batch/groups_without_signal"] = float(np.mean([max(v) == min(v) for v in groups.values()]))
    return metrics


def train(cfg) -> str:
    """Run RLVR as configured; returns the outputs directory."""
    device, outputs_dir = B.setup_run(cfg)
    model, processor = B.build_policy(cfg.actor.model, device)
    train_set, val_set = B.build_datasets(cfg, processor)
    sampler = B.build_sampler(cfg, train_set)
    steps = B.total_steps(cfg, sampler)
    reference = B.build_reference_role(cfg, model, device)
    actor = B.build_actor(cfg, model, device, steps)
    rollout = B.build_rollout(cfg, processor, device)
    reward = RewardFunction(cfg.reward.reward_function, cfg.reward.reward_type, cfg.reward.reward_function_kwargs)
    tracker = B.build_tracker(cfg, outputs_dir)
    sampling, pad_id = B.sampling_params(cfg), rollout.tokenizer.pad_token_id

    def validate(step: int) -> None:
        tracker.log(E.validate(cfg, model, rollout, reward, val_set, step, outputs_dir), step)

    if cfg.trainer.val_before_train or cfg.trainer.val_only:
        validate(0)
    if cfg.trainer.val_only:
        tracker.close()
        return outputs_dir

    timer = Timer()
    for step in tqdm(range(1, steps + 1), desc="rlvr", disable=not sys.stderr.isatty()):
        with timer("step"):
            samples = [train_set[i] for i in sampler.next_batch()]
            with timer("rollout"), generate_context(rollout.engine, model):
                trajectories = rollout.generate(samples, sampling)  # 1. rollout
            batch = collate(trajectories, pad_id)
            with timer("reward"):
                batch.scores, batch.reward_details = reward.score(trajectories)  # 2. reward
            if actor.needs_old_logprobs(len(batch)):
                with timer("old_logprob"):
                    batch.old_logprobs = actor.compute_logprobs(batch)
            if reference is not None:
                with timer("ref"):
                    batch.ref_logprobs = reference.compute_logprobs(batch)
            with timer("advantage"):
                batch.advantages = actor.algorithm.compute_advantage(batch)  # 3. advantage
            with timer("update"):
                metrics = actor.update(batch)  # 4. update

        metrics.update(batch_metrics(batch), **timer.pop(), **{"actor/lr": actor.engine.scheduler.get_last_lr()[0]})
        metrics["perf/tokens_per_s"] = batch.attention_mask.sum().item() / metrics["timing/step"]
        metrics["perf/completions_per_s"] = len(batch) / metrics["timing/rollout"]
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
