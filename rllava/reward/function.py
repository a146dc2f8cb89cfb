"""Reward functions from a user file: `reward.reward_function=path/to/file.py:compute_score`.

Three call forms, as RLLaVA's reward manager calls them (`reward.reward_type`):
- sequential: `fn(reward_input: dict, **reward_function_kwargs)` once per trajectory (RLLaVA's meaning):
  the dict holds every per-sample field (below). RLLaVA's grounding/OVD/counting rewards take this form.
- batch:      `fn(reward_inputs: list[dict], **reward_function_kwargs)` once per batch; returns one result
  per input (RLLaVA's math reward).
- named (rllava's own form): `fn(response, ground_truth, **reward_function_kwargs)` per trajectory; any other
  parameter after the first two that is a per-sample field and not a configured kwarg gets that sample's
  value: `def compute_score(response, ground_truth, model_image_sizes=())`. A function with two or more
  required positional parameters is called this way under `auto` and `sequential` (it cannot take one dict).
- auto (default): named with two or more required positional parameters; otherwise the first parameter
  decides: annotated `dict`/`Mapping` or named `reward_input` -> sequential, anything else -> batch
  (RLLaVA's files say which they want: `reward_input: dict[str, Any]` / `reward_inputs: list[dict[...]]`).
The form is checked when the reward is built, so a mismatch (a batch reward with a two-argument signature, a
sequential one annotated `list`, a configured kwarg the function does not take) stops the run at start-up.
Per-sample fields: `response`, `response_length` (tokens), `ground_truth`, the record's other fields,
`image_sizes` ((width, height) of each image as stored) and `model_image_sizes` (as the model saw it, after its
processor's resize: what a Qwen2.5-VL box is measured in); for agent rollouts (`rollout.agent.tools`) the
response is every model turn joined by newlines, plus `tool_calls` ((tool, arguments) of each call), `num_turns`,
`returned_images` (images the tools showed: count tool use by these, not by tags in the text) and `tool_memory`
(what the tools noted, e.g. the ids of the documents each search returned).
Agents' tool-level rewards (`rollout.agent.invalid_call_penalty`) are added to `overall` as `tool_reward`.
A result is a float or a dict of named floats with an `overall` entry (the scalar used for training).

The function is untrusted code (`rllava.reward.sandbox`): each call has `reward.timeout` seconds; raising,
timing out, exiting the process or returning something that is not a finite number is reported with the
function, the sample index and what happened. `reward.on_error=raise` stops the run with that line;
`zero` scores the sample 0, logs the line as a warning and counts it (`reward/errors` in the step's metrics).
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import math
import os
import sys
from functools import partial
from typing import Any, Callable

import torch

from rllava.data.protocol import Trajectory
from rllava.errors import RllavaError
from rllava.reward.sandbox import make_runner
from rllava.reward.shaping import repetition_penalty, response_token_ids

log = logging.getLogger(__name__)


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
    except (Exception, SystemExit) as e:  # a syntax or import error inside the user's file, or an exit
        sys.modules.pop(module_name, None)
        hint = " (install that package in this environment)" if isinstance(e, ModuleNotFoundError) else ""
        raise RewardError(f"reward.reward_function={spec!r}: importing {path} failed: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hint}") from e
    fn = getattr(module, name, None)
    if fn is None:
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise RewardError(f"reward.reward_function={spec!r}: {path} has no function {name!r} "
                          f"(callables there: {', '.join(found) or 'none'})")
    if not callable(fn):
        raise RewardError(f"reward.reward_function={spec!r}: {name!r} is not callable")
    return fn


POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _positional_params(fn: Callable) -> int:
    """Positional parameters without a default: 2 = fn(response, ground_truth), 1 = fn(reward_input(s))."""
    return sum(p.kind in POSITIONAL and p.default is inspect.Parameter.empty
               for p in inspect.signature(fn).parameters.values())


def _input_kind(param: inspect.Parameter) -> str | None:
    """What the first parameter says it takes: 'dict' (one sample), 'list' (the batch) or None (silent).
    Annotations may be strings (`from __future__ import annotations`): read the outer type's name."""
    ann = param.annotation
    if ann is not inspect.Parameter.empty:
        text = (ann if isinstance(ann, str) else getattr(ann, "__name__", None) or str(ann)).strip()
        outer = text.split("[")[0].split(".")[-1].lower()
        if outer in ("dict", "mapping", "rewardinput", "typeddict"):
            return "dict"
        if outer in ("list", "sequence", "tuple", "iterable"):
            return "list"
    return "dict" if param.name == "reward_input" else None


def call_form(fn: Callable, reward_type: str, spec: str) -> str:
    """'named' | 'sequential' | 'batch' for `fn` under `reward.reward_type` (see the module docstring); a
    signature that cannot work with it is a RewardError now, not at the first reward call."""
    name = getattr(fn, "__name__", "the function")
    try:
        params = [p for p in inspect.signature(fn).parameters.values() if p.kind in POSITIONAL]
    except (TypeError, ValueError):  # a builtin without a signature: trust reward_type
        return "batch" if reward_type in ("auto", "batch") else "sequential"
    required = _positional_params(fn)
    if required >= 2:
        if reward_type == "batch":
            raise RewardError(f"reward.reward_function={spec!r}: reward_type=batch calls {name}(reward_inputs: "
                              f"list[dict]) once per batch, but {name} takes {required} positional parameters "
                              f"({', '.join(p.name for p in params[:required])}): set reward.reward_type=auto "
                              "for the fn(response, ground_truth) form")
        return "named"
    if not params:
        raise RewardError(f"reward.reward_function={spec!r}: {name} takes no positional parameter; expected "
                          f"{name}(reward_input: dict), {name}(reward_inputs: list[dict]) or "
                          f"{name}(response, ground_truth)")
    kind = _input_kind(params[0])
    if reward_type == "auto":
        return "sequential" if kind == "dict" else "batch"
    said = {"sequential": "dict", "batch": "list"}[reward_type]
    if kind is not None and kind != said:
        other = "batch" if kind == "list" else "sequential"
        raise RewardError(f"reward.reward_function={spec!r}: {name}({params[0].name}) takes a {kind} but "
                          f"reward_type={reward_type} passes a {said}: set reward.reward_type={other} (or auto)")
    return reward_type


def _check_kwargs(fn: Callable, kwargs: dict, spec: str) -> None:
    """A configured kwarg the function cannot take fails at start-up (with **kwargs it takes anything)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return
    names = {p.name for p in params if p.kind != inspect.Parameter.POSITIONAL_ONLY}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise RewardError(f"reward.reward_function_kwargs: {spec} takes no parameter {unknown[0]!r} "
                          f"(its parameters: {', '.join(sorted(names)) or 'none'})")


def _sample_params(fn: Callable, configured: dict) -> list[str]:
    """Parameters after (response, ground_truth) that are filled per sample: named, not **kwargs, not configured."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind in kinds]
    return [p.name for p in params[2:] if p.name not in configured]


def sample_fields(t: Trajectory) -> dict:
    """What a reward function may read about one trajectory (see the module docstring): RLLaVA's reward_input
    (response, response_length, ground_truth, the record's other fields) plus the image sizes."""
    fields = {**t.sample.extra, "response": t.response, "response_length": t.num_response_tokens,
              "ground_truth": t.sample.ground_truth, "image_sizes": t.sample.image_sizes,
              "model_image_sizes": t.model_image_sizes}
    if t.agent is not None:  # agents: the calls made (tool, arguments) and how many images came back
        fields.update(tool_calls=list(t.agent.calls), num_turns=len(t.turn_rewards),
                      returned_images=len(t.agent.images) - len(t.sample.images), tool_memory=dict(t.agent.memory))
    return fields


def _as_scores(result: Any) -> dict[str, float] | str:
    """A float or a dict with `overall` -> {name: float}; anything else -> what is wrong with it (one line)."""
    if isinstance(result, dict):
        if "overall" not in result:
            return f"returned a dict without 'overall' (keys {sorted(map(str, result))})"
        items = result.items()
    else:
        items = [("overall", result)]
    scores = {}
    for k, v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
            return f"returned {k}={shown}: expected a finite number"
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
                 overlong: tuple[int, int, float] | None = None, timeout: float | None = None,
                 on_error: str = "raise", num_cpus: int = 1, repetition: tuple[int, float] | None = None):
        self.spec, self.fn, self.kwargs = spec, load_reward_function(spec), dict(kwargs or {})
        self.overlong = overlong  # (max_response_length, buffer length, penalty factor) for training rewards
        self.repetition = repetition  # (n-gram size, penalty factor) for training rewards
        self.reward_type = call_form(self.fn, reward_type, spec)  # 'named' | 'sequential' | 'batch'
        _check_kwargs(self.fn, self.kwargs, spec)
        self.per_sample = _sample_params(self.fn, self.kwargs) if self.reward_type == "named" else []
        if on_error not in ("raise", "zero"):
            raise RewardError(f"reward.on_error={on_error!r}: choose raise or zero")
        self.on_error, self.errors = on_error, 0  # errors: samples scored 0 so far (on_error=zero)
        self.runner = make_runner(partial(self.fn, **self.kwargs), timeout, num_cpus)

    def score(self, trajectories: list[Trajectory], train: bool = False) -> tuple[torch.Tensor, list[dict[str, float]]]:
        """Returns scores [B] (the `overall` entries) and the per-trajectory dicts of named scores. `train`:
        also apply the overlong penalty (`reward.overlong_buffer`) to `overall`, as DAPO does in training, and
        the n-gram repetition penalty (`reward.repetition_penalty`, `rllava.reward.shaping`)."""
        if self.reward_type == "batch":
            details = self._score_batch(trajectories)
        else:
            calls = [((t.response, t.sample.ground_truth), self._per_sample(t)) if self.reward_type == "named"
                     else ((sample_fields(t),), {}) for t in trajectories]
            details = [self._checked(o.error or _as_scores(o.value), t)
                       for o, t in zip(self.runner.run(calls), trajectories)]
        for d, t in zip(details, trajectories):  # agents: each turn's tool-level reward adds to the episode's
            if t.turn_rewards:
                d["tool_reward"] = float(sum(t.turn_rewards))
                d["overall"] += d["tool_reward"]
        if train and self.overlong is not None:
            for d, t in zip(details, trajectories):
                d["overlong_penalty"] = overlong_penalty(t.num_response_tokens, *self.overlong)
                d["overall"] += d["overlong_penalty"]
        if train and self.repetition is not None:
            for d, t in zip(details, trajectories):
                d["repetition_penalty"] = repetition_penalty(response_token_ids(t), *self.repetition)
                d["overall"] += d["repetition_penalty"]
        return torch.tensor([d["overall"] for d in details], dtype=torch.float32), details

    def _score_batch(self, trajectories: list[Trajectory]) -> list[dict[str, float]]:
        (outcome,) = self.runner.run([(([sample_fields(t) for t in trajectories],), {})])
        results = outcome.value
        problem = outcome.error
        if problem is None and (not isinstance(results, (list, tuple)) or len(results) != len(trajectories)):
            problem = (f"returned {type(results).__name__}" + (f" of {len(results)}" if hasattr(results, "__len__")
                                                               else "") + f": expected a list of {len(trajectories)} results")
        if problem is not None:  # the whole batch failed: every sample shares the report
            first, last = trajectories[0].sample.index, trajectories[-1].sample.index
            return [self._checked(problem, t, where=f"the batch (samples {first}..{last})") for t in trajectories]
        return [self._checked(_as_scores(r), t) for r, t in zip(results, trajectories)]

    def _checked(self, scores: dict[str, float] | str, t: Trajectory, where: str | None = None) -> dict[str, float]:
        """Scores as they are, or a problem (a string): raised (on_error=raise) or the sample scored 0."""
        if not isinstance(scores, str):
            return scores
        message = f"reward function {self.spec}, {where or f'sample {t.sample.index}'}: {scores}"
        if self.on_error == "raise":
            raise RewardError(message + " (reward.on_error=zero scores such samples 0 instead)")
        log.warning("%s: scored 0 (reward.on_error=zero)", message)
        self.errors += 1
        return {"overall": 0.0}

    def _per_sample(self, t: Trajectory) -> dict:
        fields = sample_fields(t) if self.per_sample else {}
        return {k: fields[k] for k in self.per_sample if k in fields}

    def close(self) -> None:
        """Stop the worker processes (reward.num_cpus > 1)."""
        self.runner.close()
