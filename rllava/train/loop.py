"""The loop every pipeline shares: draw prompts, run the pipeline's step, then time, log, validate and save.

A pipeline (RLVR, SFT, and later the hybrids and agents) supplies one function,
`step(samples, timer) -> (metrics, batch)`; everything that wraps a step lives here, once:

    resume from a checkpoint (trainer.resume) -> start = its step, else 0
    validate at step 0 (trainer.val_before_train; not when resuming)
    for step in start+1..steps:
        samples = next batch of prompts (resumable sampler)
        metrics, batch = step(samples, timer)          # the pipeline's stages, each under `timer(name)`
        log metrics + timings + lr + throughput; a few generations every trainer.samples_freq steps
        validate every trainer.val_freq steps and at the end
        checkpoint every trainer.save_freq steps and at the end (rllava.train.checkpoint)
    save outputs_dir/final
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
from tqdm import tqdm

from rllava import distributed as D
from rllava.data.dataset import PromptDataset
from rllava.data.protocol import Batch, Sample
from rllava.data.images import normalize_image_list
from rllava.data.sampler import EpochSampler
from rllava.model.loader import save_model
from rllava.reward.function import RewardFunction
from rllava.roles.actor import Actor
from rllava.roles.rollout import Rollout
from rllava.train import builders as B
from rllava.train import checkpoint as C
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
    resume_from: str | None = None  # the checkpoint train_loop starts from (trainer.resume)
    step: int = 0  # the step running now (1-based); the checkpoint's step after a resume
    # What a checkpoint holds besides sampler and RNG: train engines by name ("actor", "critic") and objects
    # with state_dict()/load_state_dict() (e.g. "kl_ctrl"). Pipelines add theirs before train_loop.
    engines: dict = field(default_factory=dict)
    stateful: dict = field(default_factory=dict)

    def next_samples(self) -> list[Sample]:
        """This rank's share of the next data.train_batch_size prompts (the resumable sampler, the same on every
        rank, reshuffles each epoch)."""
        return [self.train_set[j] for j in D.shard(self.sampler.next_batch(), "prompts")]


def build_run(cfg, *, sft: bool = False) -> Run:
    """Policy, data, sampler, Actor, tracker; the Rollout and Reward roles when the pipeline samples (RL) or
    can validate (a val set and a reward function)."""
    resume_from = C.find_resume(cfg, B.run_outputs_dir(cfg))  # a bad path fails here, before anything is written
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
               B.build_tracker(cfg, outputs_dir), rollout, reward, resume_from, engines={"actor": actor.engine})


def sample_rows(batch: Batch, dataset: PromptDataset, k: int) -> list[dict]:
    """`k` generations of a batch, from as many prompts as possible, as a researcher reads them: prompt text,
    image files, response, reward (None in SFT)."""
    rows, key, seen, nth = [], dataset.cfg.image_key, {}, []  # nth[j]: row j is the nth of its group
    for g in batch.group_ids.tolist():
        seen[g] = seen.get(g, 0) + 1
        nth.append(seen[g])
    scores = batch.scores.tolist() if batch.scores is not None else [None] * len(batch)
    for j in sorted(range(len(batch)), key=lambda j: nth[j])[:k]:
        t, score = batch.trajectories[j], scores[j]
        content = t.sample.messages[-1]["content"]
        prompt = content if isinstance(content, str) else "".join(
            p.get("text", f"<{p['type']}>") for p in content)
        images = normalize_image_list(dataset.records[t.sample.index][key]) if dataset.has_images else []
        images = [os.path.join(dataset.image_dir or "", x) if isinstance(x, str) else f"<{type(x).__name__}>"
                  for x in images]
        rows.append({"index": t.sample.index, "prompt": prompt, "images": images, "response": t.response,
                     "reward": score})
    return rows


def train_loop(run: Run, step: StepFn, name: str) -> str:
    """Run `step` up to run.steps (from the checkpoint's step when resuming) with logging, validation,
    checkpoints and the final save; returns outputs_dir."""
    cfg, tracker, t = run.cfg, run.tracker, run.cfg.trainer
    start = run.step = C.load_checkpoint(run, run.resume_from) if run.resume_from else 0
    if start:
        tracker.rewind(start)
        if D.is_main():
            print(f"resumed from {run.resume_from} at step {start} of {run.steps}", flush=True)

    def validate(at: int) -> None:
        if run.reward is not None and run.val_set is not None:
            tracker.log(E.validate(cfg, run.actor.engine, run.rollout, run.reward, run.val_set, at, run.outputs_dir), at)

    if (t.val_before_train and not start) or t.val_only:
        validate(start)
    timer = Timer()
    bar = tqdm(range(start + 1, run.steps + 1) if not t.val_only else [], desc=name, initial=start,
               total=run.steps, disable=not sys.stderr.isatty())
    for i in bar:
        run.step = i
        with timer("step"):
            metrics, batch = step(run.next_samples(), timer)
        metrics.update(timer.pop(), **{"actor/lr": run.actor.engine.scheduler.get_last_lr()[0]})
        world = D.world_size()  # throughput of all ranks together
        metrics["perf/tokens_per_s"] = world * batch.attention_mask.sum().item() / metrics["timing/step"]
        if "timing/rollout" in metrics:
            metrics["perf/completions_per_s"] = world * len(batch) / metrics["timing/rollout"]
        metrics = D.mean_metrics(metrics)
        tracker.log(metrics, i)
        bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in ("reward/mean", "actor/pg_loss")
                         if k in metrics})
        if t.samples_freq > 0 and i % t.samples_freq == 0 and tracker.enabled:
            tracker.log_samples(sample_rows(batch, run.train_set, t.samples_to_log), i)
        if t.val_freq > 0 and (i % t.val_freq == 0 or i == run.steps):
            validate(i)
        if t.save_freq > 0 and (i % t.save_freq == 0 or i == run.steps):
            with timer("save_checkpoint"):
                C.save_checkpoint(run, i)
            tracker.log(timer.pop(), i)
    if not t.val_only:
        weights = run.actor.engine.full_state_dict()  # every rank takes part in gathering the shards
        if D.is_main():
            save_model(run.model, run.processor, os.path.join(run.outputs_dir, "final"), state_dict=weights,
                       merge_lora=t.hf_merge_lora)
        D.barrier()
    tracker.close()
    return run.outputs_dir
