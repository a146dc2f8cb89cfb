"""Validation: roll out the held-out prompts, score them, and average. Shared by every pipeline."""

from __future__ import annotations

import json
import os

import numpy as np

from rllava import distributed as D
from rllava.data.dataset import PromptDataset
from rllava.engine.inference.base import SamplingParams, generate_context
from rllava.reward.scoring import Scoring
from rllava.roles.rollout import Rollout


def accuracy_of(details: dict[str, float]) -> float:
    """A trajectory's accuracy: the reward's `accuracy` entry if it reports one (with reward.reward_functions: the
    source named `accuracy`, else the one source's `<name>/accuracy` part), else its `overall` score."""
    if "accuracy" in details:
        return details["accuracy"]
    parts = [v for k, v in details.items() if k.endswith("/accuracy")]
    return parts[0] if len(parts) == 1 else details["overall"]


def evaluate(train_engine, rollout: Rollout, reward: Scoring, dataset: PromptDataset, sampling: SamplingParams,
             batch_size: int, prefix: str = "val") -> tuple[dict[str, float], list[dict]]:
    """Metrics `{prefix}/reward_mean, {prefix}/accuracy, ...` over every sample x sampling.n completions, and
    the generations (prompt index, response, scores)."""
    mine = list(range(D.rank(), len(dataset), D.world_size()))  # under torchrun each rank scores a share
    size = len(mine) if batch_size <= 0 else max(batch_size // D.world_size(), 1)
    details, lengths, generations = [], [], []
    with generate_context(rollout.engine, train_engine):
        for start in range(0, len(mine), size):
            trajectories = rollout.generate([dataset[i] for i in mine[start:start + size]], sampling)
            _, scored = reward.score(trajectories)
            details += scored
            lengths += [t.num_response_tokens for t in trajectories]
            generations += [{"index": t.sample.index, "response": t.response, **d} for t, d in zip(trajectories, scored)]
    details, lengths, generations = D.gather(details), D.gather(lengths), D.gather(generations)
    metrics = {f"{prefix}/reward_mean": float(np.mean([d["overall"] for d in details])),
               f"{prefix}/accuracy": float(np.mean([accuracy_of(d) for d in details])),
               f"{prefix}/response_length": float(np.mean(lengths))}
    if sampling.n > 1:  # pass@n: a prompt counts if any of its n samples is fully right
        solved = {}
        for g, d in zip(generations, details):
            solved[g["index"]] = solved.get(g["index"], False) or accuracy_of(d) >= 1.0
        metrics[f"{prefix}/pass@{sampling.n}"] = float(np.mean(list(solved.values())))
    for key in sorted({k for d in details for k in d} - {"overall"}):
        metrics[f"{prefix}/{key}"] = float(np.mean([d.get(key, 0.0) for d in details]))
    return metrics, generations


def validate(cfg, train_engine, rollout: Rollout, reward: Scoring, dataset: PromptDataset | None, step: int,
             outputs_dir: str) -> dict[str, float]:
    """Held-out metrics at `step`: sampled as `rollout.val_override_config` says (`val/...`), greedy too if
    `trainer.val_greedy` (`val_greedy/...`); the first `trainer.val_generations_to_log` generations go to
    `outputs_dir/val_generations.jsonl`."""
    from rllava.train.builders import greedy_sampling, sampling_params

    if dataset is None:
        return {}
    metrics, generations = evaluate(train_engine, rollout, reward, dataset, sampling_params(cfg, validation=True),
                                    cfg.data.val_batch_size)
    if cfg.trainer.val_generations_to_log > 0 and D.is_main():
        with open(os.path.join(outputs_dir, "val_generations.jsonl"), "a") as f:
            f.writelines(json.dumps({"step": step, **g}) + "\n"
                         for g in generations[:cfg.trainer.val_generations_to_log])
    if cfg.trainer.val_greedy:
        metrics.update(evaluate(train_engine, rollout, reward, dataset, greedy_sampling(cfg), cfg.data.val_batch_size,
                                "val_greedy")[0])
    return metrics
