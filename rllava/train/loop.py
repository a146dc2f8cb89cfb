"""The loop every pipeline shares: draw prompts, run the pipeline's step, then time, log, validate and save.

A pipeline (RLVR, SFT, and later the hybrids and agents) supplies one function,
`step(samples, timer) -> (metrics, batch)`; everything that wraps a step lives here, once:

    validate at step 0 (trainer.val_before_train)
    for step in 1..steps:
        samples = next batch of prompts (resumable sampler)
        metrics, batch = step(samples, timer)          # the pipeline's stages, each under `timer(name)`
        log metrics + timings + lr + throughput
        validate every trainer.val_freq steps and at the end
    save outputs_dir/final
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm import tqdm

from rllava import distributed as D
from rllava.data.dataset import PromptDataset
from rllava.data.protocol import Batch, Sample
from rllava.data.sampler import EpochSampler
from rllava.model.loader import save_model
from rllava.reward.function import RewardFunction
from rllava.roles.actor import Actor
from rllava.roles.rollout import Rollout
from rllava.train import builders as B
from rllava.train import evaluate as E
from rllava.train.tracker import Timer, Tracker

StepFn = Callable[[list[Sample], Timer], tuple[dict[str, float], Batch]]


@dataclass
class Run:
    """What every pipeline builds from the config before its first step."""

    cfg: object
    device: torch.device
    outputs_dir: str
    model: torch.nn.Module
    processor: object
    train_set: PromptDataset
    val_set: PromptDataset | None
    sampler: EpochSampler
    steps: int
    actor: Actor
    tracker: Tracker
    rollout: Rollout | None  # None only for SFT without a reward to validate with
    reward: RewardFunction | None

    def next_samples(self) -> list[Sample]:
        """This rank's share of the next data.train_batch_size prompts (the resumable sampler, the same on every
        rank, reshuffles each epoch)."""
        return [self.train_set[j] for j in D.shard(self.sampler.next_batch(), "prompts")]


def build_run(cfg, *, sft: bool = False) -> Run:
    """Policy, data, sampler, Actor, tracker; the Rollout and Reward roles when the pipeline samples (RL) or
    can validate (a val set and a reward function)."""
    device, outputs_dir = B.setup_run(cfg)
    model, processor = B.build_policy(cfg.actor.model, device)
    train_set, val_set = B.build_datasets(cfg, processor, target_key=cfg.data.target_key if sft else None)
    sampler = B.build_sampler(cfg, train_set)
    steps = B.total_steps(cfg, sampler)
    actor = B.build_actor(cfg, model, device, steps, sft=sft)
    rollout = reward = None
    if not sft or (val_set is not None and cfg.reward.reward_function):
        ob = cfg.reward.overlong_buffer
        reward = RewardFunction(cfg.reward.reward_function, cfg.reward.reward_type, cfg.reward.reward_function_kwargs,
                                overlong=(cfg.data.max_response_length, ob.len, ob.penalty_factor) if ob.enable else None)
        rollout = B.build_rollout(cfg, processor, device)
    B.seed_sampling(cfg)
    return Run(cfg, device, outputs_dir, model, processor, train_set, val_set, sampler, steps, actor,
               B.build_tracker(cfg, outputs_dir), rollout, reward)


def train_loop(run: Run, step: StepFn, name: str) -> str:
    """Run `step` for run.steps steps with logging, validation and the final save; returns outputs_dir."""
    cfg, tracker = run.cfg, run.tracker

    def validate(at: int) -> None:
        if run.reward is not None and run.val_set is not None:
            tracker.log(E.validate(cfg, run.actor.engine, run.rollout, run.reward, run.val_set, at, run.outputs_dir), at)

    if cfg.trainer.val_before_train or cfg.trainer.val_only:
        validate(0)
    timer = Timer()
    for i in tqdm(range(1, run.steps + 1) if not cfg.trainer.val_only else [], desc=name,
                  disable=not sys.stderr.isatty()):
        with timer("step"):
            metrics, batch = step(run.next_samples(), timer)
        metrics.update(timer.pop(), **{"actor/lr": run.actor.engine.scheduler.get_last_lr()[0]})
        world = D.world_size()  # throughput of all ranks together
        metrics["perf/tokens_per_s"] = world * batch.attention_mask.sum().item() / metrics["timing/step"]
        if "timing/rollout" in metrics:
            metrics["perf/completions_per_s"] = world * len(batch) / metrics["timing/rollout"]
        tracker.log(D.mean_metrics(metrics), i)
        if cfg.trainer.val_freq > 0 and (i % cfg.trainer.val_freq == 0 or i == run.steps):
            validate(i)
    if not cfg.trainer.val_only:
        weights = run.actor.engine.full_state_dict()  # every rank takes part in gathering the shards
        if D.is_main():
            save_model(run.model, run.processor, os.path.join(run.outputs_dir, "final"), state_dict=weights)
        D.barrier()
    tracker.close()
    return run.outputs_dir
