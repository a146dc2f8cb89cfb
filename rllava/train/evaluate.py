"""Validation: roll out the held-out prompts, score them, and average. Shared by every pipeline, as is what a run
logs of a generation (`generation_row`: a line of samples.jsonl / val_generations.jsonl) and of a reward:

`headline(details)`, by one rule in training and validation: a reward that returns an `accuracy` part is logged as
that accuracy (`reward/accuracy_mean`, `val/accuracy`; a sample without the part, e.g. scored 0 after an error,
counts 0); one without it, as an accuracy where every score of the batch is 0 or 1 (pass/fail), else as a score
(`reward/score`, `val/score`): a float reward is not an accuracy. Scores are what the function returned, before
the overlong penalty and tool rewards the trainer adds to `overall`. data.val_files' named sets: `val/<name>/...`.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from tqdm import tqdm

from rllava import distributed as D
from rllava.data.dataset import PromptDataset
from rllava.data.images import normalize_image_list
from rllava.data.protocol import Trajectory
from rllava.engine.inference.base import SamplingParams, generate_context
from rllava.reward.scoring import Scoring
from rllava.roles.rollout import Rollout
from rllava.train.builders import greedy_sampling, sampling_params

ADDED = ("overlong_penalty", "repetition_penalty", "tool_reward")  # parts the Scoring stage adds to the sum


def headline(details: list[dict[str, float]]) -> tuple[str, list[float]]:
    """The reward's headline (module docstring): ("accuracy" or "score", its value per sample)."""
    if any("accuracy" in d for d in details):
        return "accuracy", [d.get("accuracy", 0.0) for d in details]
    named = {k for d in details for k in d if k.endswith("/accuracy")}  # reward.reward_functions: one source's part
    if len(named) == 1:
        return "accuracy", [d.get(next(iter(named)), 0.0) for d in details]
    score = [d["overall"] - sum(d.get(k, 0.0) for k in ADDED) for d in details]
    binary = [float(round(s)) for s in score]
    if all(b in (0.0, 1.0) and abs(s - b) < 1e-6 for s, b in zip(score, binary)):
        return "accuracy", binary
    return "score", score


def generation_row(t: Trajectory, reward: float | None, parts: dict[str, float] | None, dataset: PromptDataset) -> dict:
    """A generation as a researcher reads it: record index, prompt, image files, ground truth, response, reward and its
    parts (None without a reward: SFT); an agent's `turns` (text, call, observation, error, tool reward, the indices
    of the images shown); a hybrid's `expert` ("prefix": starts with expert tokens; "demonstration": SFT only)."""
    images = normalize_image_list(dataset.records[t.sample.index][dataset.cfg.image_key]) if dataset.has_images else []
    images = [os.path.join(dataset.image_dir or "", x) if isinstance(x, str) else f"<{type(x).__name__}>"
              for x in images]
    row = {"index": t.sample.index, "prompt": t.sample.prompt, "images": images, "ground_truth": t.sample.ground_truth,
           "response": t.response, "reward": reward, "reward_parts": parts or None}
    if t.agent is not None and getattr(t.agent, "log", None):
        row["turns"] = t.agent.log
    if t.expert:
        row["expert"] = t.expert
    return row


def at_k(prompts: list[int], values: list[float], k: int) -> dict[str, float]:
    """Over k samples of each prompt (`prompts`: each sample's prompt, `values`: its headline value):
    - mean@k: the mean value of a prompt's k samples, averaged over the prompts;
    - pass@k: the share of prompts with at least one sample fully right (value >= 1). Every prompt has exactly n = k
      samples, where Chen et al.'s (2021) unbiased estimator 1 - C(n - c, k) / C(n, k) is this plain share;
    - best@k: the highest value among a prompt's k samples, averaged over the prompts (pass@k for a 0/1 accuracy)."""
    groups: dict[int, list[float]] = {}
    for prompt, value in zip(prompts, values):
        groups.setdefault(prompt, []).append(value)
    return {f"mean@{k}": float(np.mean([np.mean(g) for g in groups.values()])),
            f"pass@{k}": float(np.mean([max(g) >= 1.0 for g in groups.values()])),
            f"best@{k}": float(np.mean([max(g) for g in groups.values()]))}


def evaluate(train_engine, rollout: Rollout, reward: Scoring, dataset: PromptDataset, sampling: SamplingParams,
             batch_size: int, prefix: str = "val", mean_best: bool = False) -> tuple[dict[str, float], list[dict]]:
    """Metrics `{prefix}/reward_mean`, `{prefix}/accuracy` or `{prefix}/score` (`headline`), every part the reward
    returns, ... over every sample x sampling.n completions, pass@n for n > 1 (and mean@n, best@n with `mean_best`:
    `at_k`); and the generations (`generation_row`)."""
    mine = list(range(D.rank(), len(dataset), D.world_size()))  # under torchrun each rank scores a share
    size = len(mine) if batch_size <= 0 else max(batch_size // D.world_size(), 1)
    details, lengths, generations = [], [], []
    if D.is_main():  # its size first: a long validation is never silent
        print(f"{prefix}: {len(dataset)} prompts x {sampling.n} sample{'s' if sampling.n > 1 else ''}, "
              f"{-(-len(mine) // size)} batch{'es' if -(-len(mine) // size) > 1 else ''} per rank", flush=True)
    with generate_context(rollout.engine, train_engine):
        for start in tqdm(range(0, len(mine), size), desc=prefix, leave=False,
                          disable=not (D.is_main() and sys.stderr.isatty())):
            trajectories = rollout.generate([dataset[i] for i in mine[start:start + size]], sampling)
            _, scored = reward.score(trajectories)
            details += scored
            lengths += [t.num_response_tokens for t in trajectories]
            generations += [generation_row(t, d["overall"], d, dataset) for t, d in zip(trajectories, scored)]
    details, lengths, generations = D.gather(details), D.gather(lengths), D.gather(generations)
    name, values = headline(details)
    metrics = {f"{prefix}/reward_mean": float(np.mean([d["overall"] for d in details])),
               f"{prefix}/{name}": float(np.mean(values)), f"{prefix}/response_length": float(np.mean(lengths))}
    if sampling.n > 1:  # pass@n: a prompt counts if any of its n samples is fully right (accuracy or score 1)
        for key, value in at_k([g["index"] for g in generations], values, sampling.n).items():
            if mean_best or key.startswith("pass@"):
                metrics[f"{prefix}/{key}"] = value
    for key in sorted({k for d in details for k in d} - {"overall"}):
        metrics[f"{prefix}/{key}"] = float(np.mean([d.get(key, 0.0) for d in details]))
    return metrics, generations


def validate(cfg, train_engine, rollout: Rollout, reward: Scoring, dataset, step: int, tracker,
             rewards: dict[str, Scoring] | None = None) -> dict[str, float]:
    """Held-out metrics at `step`: sampled as `rollout.val_override_config` says (`val/...`), greedy too if
    `trainer.val_greedy` (`val_greedy/...`); the first val_generations_to_log generations to `tracker.log_generations`
    (val_generations.jsonl, the trackers' tables).
    `dataset`: data.val_files' set, or its named sets {name: PromptDataset}, each logged as `val/<name>/...` (with
    mean@n and best@n), scored by its own reward in `rewards` where it has one, its generations marked `set`."""
    metrics = {}
    for name, data in (dataset.items() if isinstance(dataset, dict) else [(None, dataset)]):
        where = "" if name is None else f"/{name}"
        scoring = (rewards or {}).get(name, reward)
        found, generations = evaluate(train_engine, rollout, scoring, data, sampling_params(cfg, validation=True),
                                      cfg.data.val_batch_size, f"val{where}", mean_best=name is not None)
        metrics.update(found)
        if cfg.trainer.val_generations_to_log > 0:
            named = {} if name is None else {"set": name}
            tracker.log_generations([{**named, **g} for g in generations[:cfg.trainer.val_generations_to_log]], step)
        if cfg.trainer.val_greedy:
            metrics.update(evaluate(train_engine, rollout, scoring, data, greedy_sampling(cfg),
                                    cfg.data.val_batch_size, f"val_greedy{where}")[0])
    return metrics
