"""The loop every pipeline (RLVR, SFT, hybrids, agents) shares: the pipeline supplies `step(samples, timer) ->
(metrics, batch)`; everything that wraps a step (draw, time, log, validate, save) lives here, once:

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

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
from tqdm import tqdm

from rllava import distributed as D
from rllava.algorithms.curriculum import build_sampler
from rllava.algorithms.hybrid import HYBRID_LOSSES
from rllava.config.schema import agent_on
from rllava.data.dataset import PromptDataset
from rllava.data.protocol import Batch, Sample
from rllava.data.sampler import EpochSampler
from rllava.errors import RllavaError
from rllava.model.loader import adopt_policy, save_model
from rllava.reward.scoring import Scoring
from rllava.roles.actor import Actor
from rllava.roles.rollout import Rollout
from rllava.train import builders as B
from rllava.train import checkpoint as C
from rllava.train import evaluate as E
from rllava.train import outputs as O
from rllava.train import tracker_hub
from rllava.train.memory.auto import size_run
from rllava.train.scorers import old_logprobs
from rllava.train.tracker import Timer, Tracker

StepFn = Callable[[list[Sample], Timer], tuple[dict[str, float], Batch]]


@dataclass(kw_only=True)
class Run:
    """What every pipeline builds from the config before its first step."""

    cfg: object
    device: torch.device
    outputs_dir: str
    model: torch.nn.Module
    processor: object
    train_set: PromptDataset
    val_set: PromptDataset | dict[str, PromptDataset] | None = None  # a dict: data.val_files' named sets
    val_rewards: dict[str, Scoring] = field(default_factory=dict)  # the named sets' own reward functions
    sampler: EpochSampler  # or another data.sampler (rllava.algorithms.curriculum)
    steps: int
    actor: Actor | None  # None on an asynchronous run's rollout ranks
    rollout: Rollout | None  # None only for SFT without a reward to validate with
    reward: Scoring | None
    scorers: list = field(default_factory=list)  # RL's passes before the advantage (rllava.train.scorers)
    hybrid: object = None  # SFT+RL: the expert side (rllava.train.hybrid_step), built by the pipeline
    tracker: Tracker | None = None  # created by train_loop once the run owns outputs_dir
    resume_from: str | None = None  # the checkpoint train_loop starts from (trainer.resume)
    fresh: bool = False  # the old run's files in outputs_dir are deleted first (outputs.check_outputs)
    step: int = 0  # the step running now (1-based); the checkpoint's step after a resume
    partial: object = None  # rollout.partial_rollout: the paused responses (PartialRollouts), saved per rank
    rollout_rng: list | None = None  # async: the rollout ranks' RNG states and paused responses after the last batch

    def held(self) -> tuple[dict, dict]:
        """What a checkpoint holds besides sampler, RNG states and paused responses, by file name: (engines and moving
        weights, saved with DCP; objects whose state_dict() goes in state.json), from actor, scorers, hybrid."""
        engines, states = ({"actor": self.actor.engine} if self.actor else {}), {}
        for s in self.scorers:
            engines.update(s.engines)
            states.update(s.states)
        if self.hybrid is not None:
            states["hybrid"] = self.hybrid
        return engines, states

    def next_samples(self) -> list[Sample]:
        """This rank's share of the next prompts (a resumable sampler, the same on every rank; reshuffled per epoch)."""
        return [self.train_set[j] for j in D.shard(self.sampler.next_batch(), "prompts")]


@dataclass
class Given:
    """What `rllava.api.RLVRPipeline` hands `build_run`: policy, processor, train and val records (None: config's)."""

    model: torch.nn.Module | None = None
    processor: object = None
    train: object = None
    val: object = None


def build_run(cfg, *, role: str = "rl", given: Given | None = None) -> Run:
    """Policy, data, sampler, Actor (with RL's scorers), and the Rollout and Reward roles when the run samples or
    validates. `role`: "rl", "sft" or "rollout" (an async run's rollout rank: frozen policy, no Actor); no writes."""
    given, sft, serving = given or Given(), role == "sft", role == "rollout"
    outputs_dir = B.run_outputs_dir(cfg)
    # every rank checks outputs_dir (a finished run ends them all: RunFinished) and finds the checkpoint
    resume_from = C.find_resume(cfg, outputs_dir)  # a bad path fails here, before any write
    fresh = O.check_outputs(cfg, outputs_dir, resume_from) and not serving  # another run's outputs there: one line
    resume_from = None if serving else resume_from  # a rollout rank reads its own (async_rl.serve)
    # the reward file first: a typo in it fails in a second, not after loading the model
    scores = (cfg.reward.reward_function or cfg.reward.reward_functions or cfg.reward.model.model_path
              or B.uses_reasoning_gym(cfg.data))
    reward = B.build_reward(cfg) if not sft or (cfg.data.val_files and scores) else None
    val_rewards = B.build_val_rewards(cfg) if not serving else {}
    sampled = reward is not None or (sft and agent_on(cfg))  # the run samples (agents' SFT replays through tools)
    env = B.build_agent_env(cfg) if sampled else None  # the agent's tools, before the model loads
    if not serving:  # the data paths, the plugins and each registered name the run uses (estimator, losses, ...)
        B.check_data_paths(cfg, given=(given.train, given.val))
        B.named_algorithm(cfg, sft=sft)
        if D.is_main():  # trainer.logger's outside trackers are installed (rank 0 logs)
            tracker_hub.require(cfg.trainer.logger)
        size_run(cfg)  # actor.*=auto: planned before the process group and the model
    device, outputs_dir = B.setup_run(cfg)
    reward = B.add_reward_models(reward, cfg, device) if reward is not None else None
    if given.model is None:
        model, processor = B.build_policy(cfg.actor.model, device, trainable=not serving)
    else:
        model, processor = adopt_policy(given.model, cfg.actor.model, device), given.processor
    expert = sft or cfg.actor.policy_loss.loss_mode in HYBRID_LOSSES  # SFT and hybrids read the expert response
    train_set, val_set = B.build_datasets(cfg, processor, target_key=cfg.data.target_key if expert else None,
                                          given=(given.train, given.val))
    sampler = build_sampler(cfg, len(train_set), sft=sft)  # data.sampler (rllava.algorithms.curriculum)
    steps = B.total_steps(cfg, sampler)
    engine = None if serving else B.build_engine(cfg, model, device, steps, sft=sft)  # before a rollout engine
    if sft and val_set is None and reward is not None:  # nothing to validate on
        reward.close()
        reward = None
    # agents' SFT replays the expert's turns through the agent driver (its tools make the observations)
    rollout = B.build_rollout(cfg, processor, device, env) if reward is not None or env is not None else None
    B.seed_sampling(cfg)  # what the scorers' models draw at their making (a value head) comes from the run's seed
    actor = None if serving else B.build_actor(cfg, model, device, steps, sft=sft, processor=processor, engine=engine)
    scorers = [] if actor is None or sft else [old_logprobs(actor), *actor.scorers]
    return Run(cfg=cfg, device=device, outputs_dir=outputs_dir, model=model, processor=processor,
               train_set=train_set, val_set=None if serving else val_set, sampler=sampler, steps=steps, actor=actor,
               rollout=rollout, reward=reward, scorers=scorers, resume_from=resume_from, fresh=fresh,
               val_rewards=val_rewards)


def sample_rows(batch: Batch, dataset: PromptDataset, k: int) -> list[dict]:
    """`k` generations of a batch (`evaluate.generation_row`) from as many prompts as possible, expert rows last."""
    rank, seen = [], {}  # rank[j]: (row j is a hybrid's expert row, it is the nth such row of its group)
    for t, g in zip(batch.trajectories, batch.group_ids.tolist()):
        expert = t.expert is not None
        seen[g, expert] = seen.get((g, expert), 0) + 1
        rank.append((expert, seen[g, expert]))
    scores = batch.scores.tolist() if batch.scores is not None else [None] * len(batch)
    parts = batch.reward_details or [None] * len(batch)
    return [E.generation_row(batch.trajectories[j], scores[j], parts[j], dataset)
            for j in sorted(range(len(batch)), key=lambda j: rank[j])[:k]]


# A NaN in the probabilities sampled from: the weights went non-finite (torch's multinomial says so, deep down)
NON_FINITE_SAMPLING = "probability tensor contains either `inf`, `nan` or element < 0"


def check_finite(metrics: dict[str, float], step: int, cfg) -> None:
    """A non-finite loss or gradient norm stops the run before anything of its step is saved (the engines skip such an
    optimizer step: the weights stay). DeepSpeed with fp16 overflows gradients routinely: its norms go unchecked."""
    fp16_scaling = cfg.actor.strategy == "deepspeed" and cfg.actor.deepspeed.torch_dtype == "fp16"
    bad = [f"{k}={v}" for k, v in metrics.items() if (k.endswith("loss") or (k.endswith("grad_norm")
           and not fp16_scaling)) and isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise RllavaError(f"step {step}: {', '.join(bad)} is not finite; the run stops before saving anything of "
                          "this step (is actor.optim.lr too high? are the rewards or the data sane?)")


def train_loop(run: Run, step: StepFn, name: str, draw: Callable[[], list[Sample]] | None = None) -> str:
    """Run `step` up to run.steps (from the checkpoint's when resuming), logging, validating, saving; `final/` only when
    every step ran. `draw`: each step's prompts (default `run.next_samples`). Returns outputs_dir."""
    try:
        return _train_loop(run, step, name, draw or run.next_samples)
    finally:
        for reward in [run.reward, *run.val_rewards.values()]:
            if reward is not None:
                reward.close()  # the worker processes (reward.num_cpus > 1)
        if run.tracker is not None:
            run.tracker.close()
        if hasattr(run.rollout, "close"):  # rollout.agent.program: its endpoint stops with the run
            run.rollout.close()
        C.wait_for_save()  # actor.checkpoint.async_save: the last checkpoint is whole before the run ends


def _train_loop(run: Run, step: StepFn, name: str, draw: Callable[[], list[Sample]]) -> str:
    cfg, t = run.cfg, run.cfg.trainer
    start = run.step = C.load_checkpoint(run, run.resume_from) if run.resume_from else 0
    O.claim(cfg, run.outputs_dir, resuming=run.resume_from is not None, fresh=run.fresh)  # the run owns it now
    tracker = run.tracker = B.build_tracker(cfg, run.outputs_dir)
    if start:
        tracker.rewind(start)
        if D.is_main():
            print(f"resumed from {run.resume_from} at step {start} of {run.steps}", flush=True)

    def validate(at: int) -> None:
        if run.reward is not None and run.val_set is not None:
            tracker.log(E.validate(cfg, run.actor.engine, run.rollout, run.reward, run.val_set, at, tracker,
                                   run.val_rewards), at)

    if (t.val_before_train and not start) or t.val_only:
        validate(start)
    timer = Timer()
    bar = tqdm(range(start + 1, run.steps + 1) if not t.val_only else [], desc=name, initial=start,
               total=run.steps, disable=not sys.stderr.isatty())
    for i in bar:
        run.step = i
        errors = run.reward.errors if run.reward is not None else 0
        with timer("step"):
            try:
                metrics, batch = step(draw(), timer)
            except RuntimeError as e:
                if NON_FINITE_SAMPLING not in str(e):
                    raise
                raise RllavaError(f"step {i}: sampling met non-finite probabilities: the policy's weights are no "
                                  "longer finite (is actor.optim.lr too high?)") from e
        metrics.update(timer.pop(), **{"actor/lr": run.actor.engine.scheduler.get_last_lr()[0]})
        if run.reward is not None and not run.reward.strict:
            metrics["reward/errors"] = float(run.reward.errors - errors)
        world = D.world_size()  # throughput of all ranks together
        metrics["perf/tokens_per_s"] = world * batch.attention_mask.sum().item() / metrics["timing/step"]
        if "timing/rollout" in metrics:
            metrics["perf/completions_per_s"] = world * len(batch) / metrics["timing/rollout"]
        metrics = D.mean_metrics(metrics)
        if "reward/errors" in metrics:
            metrics["reward/errors"] *= world  # a count over all ranks, not a mean
        check_finite(metrics, i, cfg)
        tracker.log(metrics, i)
        bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in ("reward/mean", "actor/pg_loss")
                         if k in metrics})
        if t.samples_freq > 0 and (i % t.samples_freq == 0 or i in (1, run.steps)) and tracker.enabled:
            tracker.log_samples(sample_rows(batch, run.train_set, t.samples_to_log), i)
        del batch  # nothing of a step outlives it (benchmarks/soak.py)
        if t.val_freq > 0 and (i % t.val_freq == 0 or i == run.steps):
            validate(i)
        if t.save_freq > 0 and (i % t.save_freq == 0 or i == run.steps):
            with timer("save_checkpoint"):
                C.save_checkpoint(run, i)
            tracker.log(timer.pop(), i)
    if not t.val_only:
        C.wait_for_save()
        weights = run.actor.engine.full_state_dict()  # every rank takes part in gathering the shards
        if D.is_main():
            save_model(run.model, run.processor, os.path.join(run.outputs_dir, "final"), state_dict=weights,
                       merge_lora=t.hf_merge_lora, pixels=(cfg.data.min_pixels, cfg.data.max_pixels))
        del weights
        D.barrier()
    return run.outputs_dir
