"""RL with verifiable rewards: the paper's four stages per step.

    python -m rllava.train.pipeline.rlvr config=examples/config.yaml data.train_files=... k=v
    torchrun --nproc_per_node=1 -m rllava.train.pipeline.rlvr config=... k=v

    for each step:
        1. rollout    K responses per prompt                (Rollout role, through a rollout engine)
        2. reward     one score per response                (Reward role: the user's file.py:fn)
           scorers    old / reference / teacher log-probs, values, KL-shaped rewards   (rllava.train.scorers)
        3. advantage  scores -> per-token advantages        (registered estimator, e.g. grpo)
        4. update     the loss's terms: policy loss, KL to the reference, a teacher's per-token reverse KL
                      (algorithm.distill), actor.loss_terms, entropy   (Actor role, through a train engine)

Stages 1-2 are `make_produce`, 3-4 `learn`: one after the other here, or overlapped with
`trainer.async_training=true`, where rollout processes of the same launch produce (rllava.train.async_rl).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from rllava import distributed as D
from rllava.agent.rollout import agent_metrics
from rllava.algorithms.filtering import fill_batch
from rllava.config import ConfigError
from rllava.data.protocol import Batch, Sample, Trajectory, collate
from rllava.engine.inference.base import generate_context
from rllava.roles.rollout import PartialRollouts, tag_versions
from rllava.train import async_rl
from rllava.train import builders as B
from rllava.train.cli import run_cli
from rllava.train.evaluate import headline
from rllava.train.hybrid_step import build_hybrid
from rllava.train.loop import Given, Run, build_run, train_loop
from rllava.train.tracker import Timer


@dataclass(kw_only=True)
class Rollouts:
    """Stages 1-2 of a step, what stages 3-4 start from (`collate` makes the Batch)."""

    trajectories: list[Trajectory]
    scores: torch.Tensor  # [rows] one reward per response
    details: list[dict]  # [rows] the reward's parts
    dropped: list[int]  # rows out of the loss (HPT: a group trained on its demonstration instead)
    baseline: torch.Tensor | None  # [rows] ReMax: the reward of the greedy answer to the row's prompt
    metrics: dict[str, float]  # DAPO's filtering


def batch_metrics(batch: Batch) -> dict[str, float]:
    """What a researcher watches besides the loss: reward (`evaluate.headline`, parts), lengths, groups with signal."""
    rows = [i for i, t in enumerate(batch.trajectories) if not t.sft_only]  # a hybrid's demonstrations: no reward
    scores, trajs = batch.need("scores")[rows], [batch.trajectories[i] for i in rows]
    details = [batch.reward_details[i] for i in rows]
    lengths = np.array([t.num_response_tokens for t in trajs])
    metrics = {"reward/mean": scores.mean().item(), "reward/std": scores.std().item() if len(scores) > 1 else 0.0,
               "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
               "response_length/clip_ratio": float(np.mean([t.finish_reason == "length" for t in trajs])),
               "prompt_length/mean": float(batch.attention_mask[rows].sum(-1).float().mean() - lengths.mean())}
    name, values = headline(details)
    metrics[{"accuracy": "reward/accuracy_mean", "score": "reward/score"}[name]] = float(np.mean(values))
    for key in sorted({k for d in details for k in d} - {"overall"}):
        metrics[f"reward/{key}_mean"] = float(np.mean([d.get(key, 0.0) for d in details]))
    groups = {}
    for g, s in zip(batch.group_ids[rows].tolist(), scores.tolist()):
        groups.setdefault(g, []).append(s)
    metrics["batch/groups_without_signal"] = float(np.mean([max(v) == min(v) for v in groups.values()]))
    return {**metrics, **agent_metrics(trajs)}


def group_outcomes(trajectories: list[Trajectory], details: list[dict], positions: dict[int, int]) -> list:
    """Per group: (its prompt's index in the train set, its responses' headline values), what a curriculum observes."""
    _, values = headline(details)
    groups = {}
    for t, v in zip(trajectories, values):
        groups.setdefault(t.group_id, (positions[t.sample.index], []))[1].append(v)
    return list(groups.values())


def make_produce(run: Run, hybrid, needs_baseline: bool, train_engine,
                 version: Callable[[int], int] = lambda step: step - 1) -> Callable[[list[Sample], Timer], Rollouts]:
    """Stages 1-2 as a function of the prompts, here (`train`) or on an async run's rollout rank (`async_rl.serve`):
    `run` gives the roles, step and more prompts; `train_engine` the weights (those of update `version(step)`)."""
    cfg, rollout, reward, a = run.cfg, run.rollout, run.reward, run.cfg.algorithm
    sampling, greedy = B.sampling_params(cfg), B.greedy_sampling(cfg)
    tagged = cfg.trainer.async_training or cfg.rollout.partial_rollout  # tokens carry the version that wrote them
    positions = {row: j for j, row in enumerate(run.train_set.indices)}  # a record's index in the train set
    if cfg.rollout.partial_rollout:  # paused responses go on next step; checkpointed with the run
        run.partial = PartialRollouts(rollout, run.train_set, cfg.rollout.partial_rollout_tokens or max(
            1, cfg.data.max_response_length // 4), sampling.max_new_tokens, cfg.trainer.max_staleness)

    def rollout_and_score(samples: list[Sample], timer: Timer, params=sampling):
        # a hybrid's responses may start with expert tokens (LUFFY's expert samples, UFT's hints)
        prefixes = hybrid.prefixes(samples, run.step) if hybrid is not None and params is sampling else None
        with timer("rollout"), generate_context(rollout.engine, train_engine):
            if run.partial is not None and params is sampling:  # the pool tags each round's tokens itself
                run.partial.waiting += samples
                trajectories = run.partial.next_batch(run.next_samples, params, len(samples), version(run.step),
                                                     run.step - 1)
            else:
                trajectories = rollout.generate(samples, params, prefixes)  # 1. rollout
                if tagged:
                    tag_versions(trajectories, version(run.step))
        with timer("reward"):
            scores, details = reward.score(trajectories, train=True)  # 2. reward
        if params is sampling and hasattr(run.sampler, "observe"):  # a curriculum learns every group's pass rate
            run.sampler.observe(D.gather(group_outcomes(trajectories, details, positions)))
        return trajectories, scores, details

    def produce(samples: list[Sample], timer: Timer) -> Rollouts:
        """Stages 1-2, with what hangs on them: DAPO's filtering, a hybrid's demonstrations, ReMax's baseline."""
        metrics = {}
        if a.online_filtering:  # DAPO dynamic sampling: draw more prompts until every group carries signal
            draws = iter([samples])
            trajectories, scores, details, metrics = fill_batch(
                lambda: rollout_and_score(next(draws, None) or run.next_samples(), timer), len(samples),
                filter_key=a.filter_key, low=a.filter_low, high=a.filter_high, max_tries=cfg.trainer.max_try_make_batch)
        else:
            trajectories, scores, details = rollout_and_score(samples, timer)
        dropped = []
        if hybrid is not None:  # demonstration rows beside the groups (HPT, CHORD)
            trajectories, scores, details, dropped = hybrid.demonstrations(trajectories, scores, details)
        baseline = None
        if needs_baseline:  # ReMax: each group's baseline is its greedy answer's reward
            prompts = {t.group_id: t.sample for t in trajectories}
            _, baseline, _ = rollout_and_score([prompts[g] for g in range(len(prompts))], timer, greedy)
            baseline = baseline[[t.group_id for t in trajectories]]
        if hasattr(run.sampler, "metrics"):  # data.sampler=difficulty_pools: its pools' sizes
            metrics.update(run.sampler.metrics())
        if run.partial is not None:  # groups over trainer.max_staleness this step (PartialRollouts)
            metrics["async/dropped_stale"], run.partial.dropped = float(run.partial.dropped), 0
        return Rollouts(trajectories=trajectories, scores=scores, details=details, dropped=dropped,
                        baseline=baseline, metrics=metrics)

    return produce


def train(cfg, given: Given | None = None) -> str:
    """Run RLVR as configured; returns outputs_dir. `given`: a model and records built in Python (rllava.api)."""
    if cfg.trainer.async_training and given is not None and any(vars(given).values()):
        raise ConfigError("trainer.async_training=true: the rollout ranks load actor.model and the data from the "
                          "config, so a model or records given in Python cannot reach them; give their paths in the "
                          "config instead")
    if cfg.trainer.async_training and D.split_roles(cfg.trainer.rollout_ranks) == "rollout":
        return async_rl.serve(cfg, make_produce)  # this process generates for the trainers
    run = build_run(cfg, given=given)  # the Actor and the scorers (rllava.train.scorers) among the rest
    actor, pad_id = run.actor, run.rollout.tokenizer.pad_token_id
    use_reward = actor.distill is None or cfg.algorithm.distill.use_reward
    hybrid = build_hybrid(cfg, run)  # SFT+RL (LUFFY, SRFT, UFT, HPT, CHORD): the expert side; None for pure RL
    produce = make_produce(run, hybrid, actor.algorithm.needs("baseline_scores"), actor.engine)

    def learn(r: Rollouts, timer: Timer) -> tuple[dict[str, float], Batch]:
        """Stages 3-4 on what `produce` made (here, or in the rollout ranks of an asynchronous run)."""
        metrics = {**r.metrics, **async_rl.staleness_metrics(r.trajectories, run.step)}
        batch = collate(r.trajectories, pad_id)
        batch.scores, batch.reward_details, batch.baseline_scores = r.scores, r.details, r.baseline
        batch.loss_mask[r.dropped] = 0  # HPT: the rollouts of a group trained on its demonstration instead
        for scorer in run.scorers:  # old / reference / teacher log-probs, values, KL-shaped rewards: one field each
            if scorer.when(batch):
                with timer(scorer.name):
                    metrics.update(scorer.fill(batch))
        with timer("advantage"):
            batch.advantages = actor.algorithm.compute_advantage(batch)  # 3. advantage
            if not use_reward:  # pure distillation: the reward is logged, the teacher's term trains alone
                batch.advantages = torch.zeros_like(batch.advantages)
            if batch.sft_only is not None:  # demonstrations are in no group: no advantage
                batch.advantages[batch.sft_only] = 0.0
        with timer("update"):
            if run.step > cfg.trainer.critic_warmup:  # the actor waits for the critic's warm-up steps
                rl_coef, sft_coef = hybrid.coefficients(run.step) if hybrid is not None else (1.0, 1.0)
                metrics.update(actor.update(batch, rl_coef=rl_coef, sft_coef=sft_coef))  # 4. update
            for scorer in run.scorers:  # the critic's own update, the reference's resets (algorithm.ref_reset_freq)
                if scorer.after_update is not None:
                    metrics.update(scorer.after_update(batch, run.step))
        if hybrid is not None:
            metrics.update(hybrid.metrics(batch, run.step))
        return {**metrics, **batch_metrics(batch)}, batch

    if cfg.trainer.async_training:  # the trainers' side; the rollout ranks run `serve` (above)
        return async_rl.train(run, learn)
    return train_loop(run, lambda samples, timer: learn(produce(samples, timer), timer), "rlvr")


def main(argv: list[str] | None = None) -> None:
    run_cli(train, argv)


if __name__ == "__main__":
    main()
