"""Reward functions from a user file: `reward.reward_function=path/to/file.py:compute_score`, one source of the
Scoring stage (`rllava.reward.scoring`, which also combines several: `reward.reward_functions`).

Call forms (`reward.reward_type`; the first two as RLLaVA's reward manager calls them; `**kw`: the configured
`reward.reward_function_kwargs`):
- sequential: `fn(reward_input: dict, **kw)` once per trajectory, the dict holding every per-sample field (below):
  RLLaVA's grounding/OVD/counting rewards.
- batch:      `fn(reward_inputs: list[dict], **kw)` once per batch, one result per input (RLLaVA's math reward).
- named (rllava's own): `fn(response, ground_truth, **kw)` per trajectory; each further parameter that is a
  per-sample field and not a configured kwarg gets that sample's value (`compute_score(response, ground_truth,
  prompt, images=())`). Under `auto` and `sequential`, every function with two or more required positional
  parameters is called this way (it cannot take one dict).
- auto (default): named as above; otherwise the first parameter decides: annotated `dict`/`Mapping` or named
  `reward_input` -> sequential, else batch (RLLaVA's files annotate `reward_input: dict[str, Any]` /
  `reward_inputs: list[dict[...]]`).
A mismatch (a batch reward with a two-argument signature, a sequential one annotated `list`, a configured kwarg
the function does not take) stops the run when the reward is built.

Per-sample fields: `prompt` (the prompt text as the model saw it: the last user message, template applied,
`<image>`/`<video>` where those sit), `response`, `response_length` (tokens), `ground_truth`, the record's other fields,
`image_sizes` ((width, height) of each image as stored), `model_image_sizes` (as the model saw it, after its processor's
resize: what a Qwen2.5-VL box is measured in), and two heavy ones: `images` (the sample's images, PIL, as given to the
processor) and `videos` (each video's sampled frames, a list of PIL). The dict forms' dicts hold all but the heavy two,
copied (and pickled to `reward.num_cpus` workers) only for a function naming a parameter `images` / `videos` after its
input: `fn(reward_input, images=())` the sample's, `fn(reward_inputs, images=None)` one entry per input.
Agent rollouts (`rollout.agent.tools`): the response is every model turn joined by newlines, plus `tool_calls` ((tool,
arguments) of each call), `num_turns`, `returned_images` (images the tools showed: count tool use by these, not by tags
in the text), `tool_memory` (what the tools noted, e.g. each search's document ids), `turn_texts` (each model turn's
text; RLLaVA's agentic workflow scores the last as the response) and `step_reward` (RLLaVA's: the step rewards summed
over the observations shown: 1 per call that ran for rllava's tools, its own for a rollout.env_config_path class).
A result is a float or a dict of named floats with an `overall` entry (the scalar used for training).

The function is untrusted code (`rllava.reward.guard`): each call has `reward.timeout` seconds; raising, timing out,
exiting the process or returning anything but finite numbers is a failure, one line naming the function and the sample
index. `reward.strict=true` stops the run with it; otherwise (the default) the line is a warning, the sample scores
`reward.fallback_score` and counts in `reward/errors` (`reward.on_error=raise|zero`: the older spelling of strict /
non-strict with fallback 0). A call failing on every sample still stops the run (`rllava.reward.scoring`)."""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import sys
from functools import partial
from typing import Any, Callable

import torch

from rllava.data.protocol import Trajectory
from rllava.errors import RllavaError
from rllava.reward.guard import make_runner

log = logging.getLogger(__name__)
FLOAT32_MAX = torch.finfo(torch.float32).max
HEAVY = ("images", "videos")  # PIL: given to a function only when it names them (see the module docstring)


class RewardError(RllavaError):
    pass


def load_reward_function(spec: str, key: str = "reward.reward_function") -> Callable:
    """Import `fn` from `file.py:fn`; every failure names the key and the spec."""
    if not spec:
        raise RewardError(f"{key} is not set (expected path/to/file.py:function_name, or several with "
                          "reward.reward_functions=[{function: a.py:fn, weight: 1.0}, ...])")
    path, sep, name = spec.rpartition(":")
    path = os.path.expanduser(path)  # reward.reward_functions entries: `~` as in the path keys
    if not sep or not path.endswith(".py") or not name:
        raise RewardError(f"{key}={spec!r}: expected 'path/to/file.py:function_name'")
    if not os.path.isfile(path):
        raise RewardError(f"{key}={spec!r}: file {path!r} does not exist")
    module_name = f"rllava_reward_{abs(hash(os.path.abspath(path)))}"
    try:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a syntax or import error inside the user's file, or an exit
        sys.modules.pop(module_name, None)
        hint = " (install that package in this environment)" if isinstance(e, ModuleNotFoundError) else ""
        raise RewardError(f"{key}={spec!r}: importing {path} failed: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hint}") from e
    fn = getattr(module, name, None)
    if fn is None:
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise RewardError(f"{key}={spec!r}: {path} has no function {name!r} "
                          f"(callables there: {', '.join(found) or 'none'})")
    if not callable(fn):
        raise RewardError(f"{key}={spec!r}: {name!r} is not callable")
    return fn


def _input_kind(param: inspect.Parameter) -> str | None:
    """What the first parameter says it takes: 'dict' (one sample), 'list' (the batch) or None (silent).
    Annotations may be strings (`from __future__ import annotations`): read the outer type's name."""
    ann = "" if param.annotation is inspect.Parameter.empty else param.annotation
    text = (ann if isinstance(ann, str) else getattr(ann, "__name__", None) or str(ann)).strip()
    kinds = {**dict.fromkeys(("dict", "mapping", "rewardinput", "typeddict"), "dict"),
             **dict.fromkeys(("list", "sequence", "tuple", "iterable"), "list")}
    return kinds.get(text.split("[")[0].split(".")[-1].lower()) or ("dict" if param.name == "reward_input" else None)


def call_form(fn: Callable, reward_type: str, spec: str, key: str = "reward.reward_function") -> str:
    """'named' | 'sequential' | 'batch' for `fn` under `reward.reward_type` (see the module docstring); a
    signature that cannot work with it is a RewardError now, not at the first reward call."""
    name = getattr(fn, "__name__", "the function")
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # a builtin without a signature: trust reward_type
        return "batch" if reward_type in ("auto", "batch") else "sequential"
    # positional parameters without a default: 2 = fn(response, ground_truth), 1 = fn(reward_input(s))
    required = sum(p.default is inspect.Parameter.empty for p in params)
    if required >= 2:
        if reward_type == "batch":
            raise RewardError(f"{key}={spec!r}: reward_type=batch calls {name}(reward_inputs: "
                              f"list[dict]) once per batch, but {name} takes {required} positional parameters "
                              f"({', '.join(p.name for p in params[:required])}): set reward.reward_type=auto "
                              "for the fn(response, ground_truth) form")
        return "named"
    if not params:
        raise RewardError(f"{key}={spec!r}: {name} takes no positional parameter; expected "
                          f"{name}(reward_input: dict), {name}(reward_inputs: list[dict]) or "
                          f"{name}(response, ground_truth)")
    kind = _input_kind(params[0])
    if reward_type == "auto":
        return "sequential" if kind == "dict" else "batch"
    said = {"sequential": "dict", "batch": "list"}[reward_type]
    if kind is not None and kind != said:
        other = "batch" if kind == "list" else "sequential"
        raise RewardError(f"{key}={spec!r}: {name}({params[0].name}) takes a {kind} but "
                          f"reward_type={reward_type} passes a {said}: set reward.reward_type={other} (or auto)")
    return reward_type


def _sample_params(fn: Callable, configured: dict, form: str, spec: str, key: str) -> list[str]:
    """Parameters filled per sample: after (response, ground_truth) any not configured (named form), after the dict or
    list only `images` / `videos`; a configured kwarg the function cannot take fails at start-up (unless **kwargs)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    names = {p.name for p in params if p.kind != inspect.Parameter.POSITIONAL_ONLY}
    unknown = sorted(set(configured) - names)
    if unknown and not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        raise RewardError(f"{key}: {spec} takes no parameter {unknown[0]!r} "
                          f"(its parameters: {', '.join(sorted(names)) or 'none'})")
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    filled = [p.name for p in params if p.kind in kinds]
    named = [p for p in filled[2:] if p not in configured]
    return named if form == "named" else [p for p in filled[1:] if p in HEAVY and p not in configured]


def sample_fields(t: Trajectory, heavy=()) -> dict:
    """One trajectory's per-sample fields (module docstring); the heavy ones (images, videos) only if in `heavy`."""
    fields = {**t.sample.extra, "prompt": t.sample.prompt, "response": t.response,
              "response_length": t.num_response_tokens, "ground_truth": t.sample.ground_truth,
              "image_sizes": t.sample.image_sizes, "model_image_sizes": t.model_image_sizes}
    if "images" in heavy:
        fields["images"] = list(t.sample.images)
    if "videos" in heavy:
        fields["videos"] = [list(v.frames) for v in t.sample.videos]
    if t.agent is not None:  # agents: the calls made (tool, arguments) and how many images came back
        fields.update(tool_calls=list(t.agent.calls), num_turns=len(t.turn_rewards),
                      returned_images=len(t.agent.images) - len(t.sample.images), tool_memory=dict(t.agent.memory),
                      turn_texts=[entry["turn"] for entry in t.agent.log], step_reward=t.agent.step_reward)
    return fields


def _as_scores(result: Any) -> dict[str, float] | str:
    """A float or a dict with `overall` -> {name: float}; anything else -> what is wrong with it (one line). The
    scores train as float32: a number past its range (|x| > 3.4e38, e.g. 1e39) would be inf there, so it fails too."""
    if isinstance(result, dict) and "overall" not in result:
        return f"returned a dict without 'overall' (keys {sorted(map(str, result))})"
    items = result.items() if isinstance(result, dict) else [("overall", result)]
    scores = {}
    for k, v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(float(v)) <= FLOAT32_MAX:
            shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
            return f"returned {k}={shown}: expected a finite number (float32, |x| <= 3.4e38)"
        scores[k] = float(v)
    return scores


class Fallible:
    """A reward source's failure policy (reward.strict / reward.fallback_score): a sample whose scoring failed
    stops the run with a line naming the source (`name`) and sample, or scores the fallback, counted in `errors`."""

    def __init__(self, name: str, strict: bool = False, fallback_score: float = 0.0):
        self.name, self.strict, self.fallback_score = name, strict, float(fallback_score)
        self.errors, self.last_error = 0, None  # samples given the fallback so far, and the latest one's line

    def fail(self, message: str) -> dict[str, float]:
        if self.strict:
            raise RewardError(message + " (reward.strict=false scores such samples reward.fallback_score instead)")
        log.warning("%s: scored %g (reward.strict=false)", message, self.fallback_score)
        self.errors, self.last_error = self.errors + 1, message
        return {"overall": self.fallback_score}

    def finish(self, results: list[dict[str, float] | str], trajectories: list[Trajectory], where: str | None = None):
        """(scores [B], details): each sample's scores, or its problem (a string) via `fail`, naming it or `where`."""
        details = [self.fail(f"{self.name}, {where or f'sample {t.sample.index}'}: {r}") if isinstance(r, str) else r
                   for r, t in zip(results, trajectories)]
        return torch.tensor([d["overall"] for d in details], dtype=torch.float32), details


class RewardFunction(Fallible):
    """A rule-based reward source: trajectories -> one scalar score each, plus the named parts for logging."""

    def __init__(self, spec: str, reward_type: str = "auto", kwargs: dict | None = None, *,
                 timeout: float | None = None, strict: bool = False, fallback_score: float = 0.0, num_cpus: int = 1,
                 key: str = "reward.reward_function", kwargs_key: str = "reward.reward_function_kwargs"):
        self.spec, self.fn, self.kwargs = spec, load_reward_function(spec, key), dict(kwargs or {})
        self.reward_type = call_form(self.fn, reward_type, spec, key)  # 'named' | 'sequential' | 'batch'
        self.fields = _sample_params(self.fn, self.kwargs, self.reward_type, spec, kwargs_key)  # filled by name
        self.heavy = [k for k in self.fields if k in HEAVY]
        super().__init__(f"reward function {spec}", strict, fallback_score)
        self.runner = make_runner(partial(self.fn, **self.kwargs), timeout, num_cpus, f"{key}={spec}")

    def score(self, trajectories: list[Trajectory], train: bool = False) -> tuple[torch.Tensor, list[dict[str, float]]]:
        """Scores [B] (the `overall` entries) and each trajectory's named scores (a rule ignores `train`)."""
        fields = [sample_fields(t, self.heavy) for t in trajectories]
        light = [{k: v for k, v in f.items() if k not in HEAVY} for f in fields]  # the dict forms' input
        if self.reward_type != "batch":
            calls = [((t.response, t.sample.ground_truth) if self.reward_type == "named" else (d,),
                      {k: f[k] for k in self.fields if k in f}) for t, f, d in zip(trajectories, fields, light)]
            return self.finish([o.error or _as_scores(o.value) for o in self.runner.run(calls)], trajectories)
        named = {k: [f[k] for f in fields] for k in self.heavy}  # images / videos: one entry per input
        (outcome,) = self.runner.run([((light,), named)])
        results, problem = outcome.value, outcome.error
        if problem is None and (not isinstance(results, (list, tuple)) or len(results) != len(trajectories)):
            size = f" of {len(results)}" if hasattr(results, "__len__") else ""
            problem = f"returned {type(results).__name__}{size}: expected a list of {len(trajectories)} results"
        if problem is not None:  # the whole batch failed: every sample shares the report
            first, last = trajectories[0].sample.index, trajectories[-1].sample.index
            return self.finish([problem] * len(trajectories), trajectories, f"the batch (samples {first}..{last})")
        return self.finish([_as_scores(r) for r in results], trajectories)

    def close(self) -> None:
        """Stop the worker processes (reward.num_cpus > 1)."""
        self.runner.close()
