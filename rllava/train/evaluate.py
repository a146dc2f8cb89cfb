"""Validation: roll out the held-out prompts, score them, and average. Shared by every pipeline, as is what a run
logs of a generation (`generation_row`: a line of samples.jsonl / val_generations.jsonl) and of a reward:

`headline(details)`, by one rule in training and validation: a reward that returns an `accuracy` part is logged as
that accuracy (`reward/accuracy_mean`, `val/accuracy`; a sample without the part, e.g. scored 0 after an error,
counts 0); one without it, as an accuracy where every score of the batch is 0 or 1 (pass/fail), else as a score
(`reward/score`, `val/score`): a float reward is not an accuracy. Scores are what the function returned, before
the overlong penalty and tool rewards the trainer adds to `overall`.
"""

from __future__ import annotations

import json
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


def evaluate(train_engine, rollout: Rollout, reward: Scoring, dataset: PromptDataset, sampling: SamplingParams,
             batch_size: int, prefix: str = "val") -> tuple[dict[str, float], list[dict]]:
    """Metrics `{prefix}/reward_mean`, `{prefix}/accuracy` or `{prefix}/score` (`headline`), every part the reward
    returns, ... over every sample x sampling.n completions; and the generations (`generation_row`)."""
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
        solved = {}
        for g, v in zip(generations, values):
            solved[g["index"]] = solved.get(g["index"], False) or v >= 1.0
        metrics[f"{prefix}/pass@{sampling.n}"] = float(np.mean(list(solved.values())))
    for key in sorted({k for d in details for k in d} - {"overall"}):
        metrics[f"{prefix}/{key}"] = float(np.mean([d.get(key, 0.0) for d in details]))
    return metrics, generations


def validate(cfg, train_engine, rollout: Rollout, reward: Scoring, dataset: PromptDataset, step: int,
             outputs_dir: str) -> dict[str, float]:
    """Held-out metrics at `step`: sampled as `rollout.val_override_config` says (`val/...`), greedy too if
    `trainer.val_greedy` (`val_greedy/...`); the first val_generations_to_log generations to val_generations.jsonl."""
    metrics, generations = evaluate(train_engine, rollout, reward, dataset, sampling_params(cfg, validation=True),
                                    cfg.data.val_batch_size)
    if cfg.trainer.val_generations_to_log > 0 and D.is_main():
        with open(os.path.join(outputs_dir, "val_generations.jsonl"), "a") as f:
            f.writelines(json.dumps({"step": step, **g}, default=str) + "\n"
                         for g in generations[:cfg.trainer.val_generations_to_log])
    if cfg.trainer.val_greedy:
        metrics.update(evaluate(train_engine, rollout, reward, dataset, greedy_sampling(cfg), cfg.data.val_batch_size,
                                "val_greedy")[0])
    return metrics
