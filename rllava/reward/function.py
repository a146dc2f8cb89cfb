"""Reward functions from a user file: `reward.reward_function=path/to/file.py:compute_score`.

Two call styles (`reward.reward_type`):
- sequential: `fn(response: str, ground_truth, **reward_function_kwargs)` per trajectory; any other parameter
  the function names after the first two that is a per-sample field (below) and not a configured kwarg gets
  that sample's value: `def compute_score(response, ground_truth, model_image_sizes=())`.
- batch:      `fn(reward_inputs: list[dict], **reward_function_kwargs)` once per batch, each dict holding
  every per-sample field; returns one result per input.
- auto (default): sequential if the function has two or more required positional parameters, else batch.
Per-sample fields: `response`, `response_length` (tokens), `ground_truth`, the record's other fields,
`image_sizes` ((width, height) of each image as stored) and `model_image_sizes` (as the model saw it, after its
processor's resize: what a Qwen2.5-VL box is measured in).
A result is a float or a dict of named floats with an `overall` entry (the scalar used for training).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import sys
from typing import Any, Callable

import torch

from rllava.data.protocol import Trajectory
from rllava.errors import RllavaError


class RewardError(RllavaError):
    pass


def load_reward_function(spec: str) -> Callable:
    """Import `fn` from `file.py:fn`; every failure names the spec."""
    if not spec:
        raise RewardError("reward.reward_function is not set (expected path/to/file.py:function_name)")
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name:
        raise RewardError(f"reward.reward_function={spec!r}: expected 'path/to/file.py:function_name'")
    if not os.path.isfile(path):
        raise RewardError(f"reward.reward_function={spec!r}: file {path!r} does not exist")
    module_name = f"rllava_reward_{abs(hash(os.path.abspath(path)))}"
    try:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
    except Exception as e:  # a syntax or import error inside the user's file
        sys.modules.pop(module_name, None)
        raise RewardError(f"reward.reward_function={spec!r}: importing {path} failed: "
                          f"{type(e).__name__}: {e}") from e
    fn = getattr(module, name, None)
    if fn is None:
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise RewardError(f"reward.reward_function={spec!r}: {path} has no function {name!r} "
                          f"(callables there: {', '.join(found) or 'none'})")
    if not callable(fn):
        raise RewardError(f"reward.reward_function={spec!r}: {name!r} is not callable")
    return fn


def _positional_params(fn: Callable) -> int:
    """Positional parameters without a default: 2 = fn(response, ground_truth), 1 = fn(reward_inputs)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds and p.default is inspect.Parameter.empty
               for p in inspect.signature(fn).parameters.values())


def _sample_params(fn: Callable, configured: dict) -> list[str]:
    """Parameters after (response, ground_truth) that are filled per sample: named, not **kwargs, not configured."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind in kinds]
    return [p.name for p in params[2:] if p.name not in configured]


def sample_fields(t: Trajectory) -> dict:
    """What a reward function may read about one trajectory (see the module docstring)."""
    return {**t.sample.extra, "response": t.response, "response_length": t.num_response_tokens,
            "ground_truth": t.sample.ground_truth, "image_sizes": t.sample.image_sizes,
            "model_image_sizes": t.model_image_sizes}


def _as_scores(result: Any, spec: str, where: str) -> dict[str, float]:
    """A float or a dict with `overall` -> {name: float}; anything else is the user's bug, named."""
    if isinstance(result, dict):
        if "overall" not in result:
            raise RewardError(f"{spec} returned a dict without 'overall' for {where}: keys {sorted(result)}")
        items = result.items()
    else:
        items = [("overall", result)]
    scores = {}
    for k, v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise RewardError(f"{spec} returned {k}={v!r} for {where}: expected a finite number")
        scores[k] = float(v)
    return scores


def overlong_penalty(length: int, max_len: int, buffer_len: int, factor: float) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476), added to the reward:

        0                                     if |y| <= L_max - L_buf
        factor * ((L_max - L_buf) - |y|) / L_buf   if L_max - L_buf < |y| <= L_max   (linear, down to -factor)
    """
    start = max_len - buffer_len
    return 0.0 if length <= start else factor * max(start - length, -buffer_len) / buffer_len


class RewardFunction:
    """The Reward role: trajectories -> one scalar score each, plus the named parts for logging."""

    def __init__(self, spec: str, reward_type: str = "auto", kwargs: dict | None = None, *,
                 overlong: tuple[int, int, float] | None = None):
        self.spec, self.fn, self.kwargs = spec, load_reward_function(spec), dict(kwargs or {})
        self.overlong = overlong  # (max_response_length, buffer length, penalty factor) for training rewards
        if reward_type == "auto":
            reward_type = "sequential" if _positional_params(self.fn) >= 2 else "batch"
        if reward_type == "sequential" and _positional_params(self.fn) < 2:
            raise RewardError(f"reward.reward_function={spec!r}: reward_type=sequential needs "
                              "fn(response, ground_truth); this one takes fewer positional parameters")
        self.reward_type = reward_type
        self.per_sample = _sample_params(self.fn, self.kwargs) if reward_type == "sequential" else []

    def score(self, trajectories: list[Trajectory], train: bool = False) -> tuple[torch.Tensor, list[dict[str, float]]]:
        """Returns scores [B] (the `overall` entries) and the per-trajectory dicts of named scores. `train`:
        also apply the overlong penalty (`reward.overlong_buffer`) to `overall`, as DAPO does in training."""
        if self.reward_type == "batch":
            inputs = [sample_fields(t) for t in trajectories]
            results = self._call(lambda: self.fn(inputs, **self.kwargs), "the batch")
            if not isinstance(results, (list, tuple)) or len(results) != len(trajectories):
                raise RewardError(f"{self.spec} (batch) must return a list of {len(trajectories)} results, got "
                                  f"{type(results).__name__}" + (f" of {len(results)}" if hasattr(results, "__len__") else ""))
        else:
            results = [self._call(lambda t=t: self.fn(t.response, t.sample.ground_truth, **self.kwargs,
                                                      **self._per_sample(t)), f"sample {t.sample.index}")
                       for t in trajectories]
        details = [_as_scores(r, self.spec, f"sample {t.sample.index}") for r, t in zip(results, trajectories)]
        if train and self.overlong is not None:
            for d, t in zip(details, trajectories):
                d["overlong_penalty"] = overlong_penalty(t.num_response_tokens, *self.overlong)
                d["overall"] += d["overlong_penalty"]
        return torch.tensor([d["overall"] for d in details], dtype=torch.float32), details

    def _per_sample(self, t: Trajectory) -> dict:
        fields = sample_fields(t) if self.per_sample else {}
        return {k: fields[k] for k in self.per_sample if k in fields}

    def _call(self, thunk, where: str):
        try:
            return thunk()
        except Exception as e:
            raise RewardError(f"reward function {self.spec} raised on {where}: {type(e).__name__}: {e}") from e
