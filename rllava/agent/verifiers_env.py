"""A verifiers Environment as the agent (docs/agents.md, "verifiers environments"):

    rollout.agent.environment=verifiers:<module or path/file.py>[:<function>]   rollout.agent.environment_kwargs={...}

`function` (default `load_environment`, verifiers' convention) is called with the kwargs and returns a
`verifiers.Environment` (SingleTurnEnv, MultiTurnEnv, ToolEnv, ...; verifiers >= 0.3, whose classic API
`import verifiers as vf` is). Its `dataset` gives the training records and its `eval_dataset` the validation
records (`environment_records`); each episode is the env's own `run_rollout` on its row, with the policy as the
env's OpenAI client (an agent program, `rllava.agent.program.ProgramRollout`: the exact-token assembly, the
timeout, the failures are that driver's), and the env's rubric scores it: its `reward` is the episode's, its
`metrics` the reward details."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import os
import sys
from functools import lru_cache

from rllava.errors import ConfigError

PREFIX = "verifiers:"
KEY = "rollout.agent.environment"


def _load_module(target: str):
    """A module by import name, or the .py file at `target` (a ConfigError naming the key otherwise)."""
    if target.endswith(".py"):
        path = os.path.abspath(os.path.expanduser(target))
        if not os.path.isfile(path):
            raise ConfigError(f"{KEY}: file {target!r} does not exist")
        name = f"rllava_verifiers_env_{abs(hash(path))}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        raise ConfigError(f"{KEY}: no module {target!r} ({e}); give an installed environment's module or a "
                          "path/to/env.py") from e


@lru_cache(maxsize=4)
def _cached(spec: str, kwargs_json: str):
    try:
        import verifiers as vf
    except ImportError as e:
        raise ConfigError(f"{KEY}={spec}: needs the verifiers package: pip install 'rllava[verifiers]'") from e
    if not spec.startswith(PREFIX) or not spec[len(PREFIX):]:
        raise ConfigError(f"{KEY}={spec!r}: expected verifiers:<module or path/env.py>[:<function>]")
    target, _, name = spec[len(PREFIX):].partition(":")
    module = _load_module(target)
    name = name or "load_environment"
    function = getattr(module, name, None)
    if not callable(function):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(name, names, n=1)
        raise ConfigError(f"{KEY}={spec}: {target} has no function {name!r}"
                          + (f" (did you mean {close[0]!r}?)" if close else ""))
    try:
        env = function(**json.loads(kwargs_json))
    except Exception as e:  # noqa: BLE001 (the user's loader)
        first = (str(e).splitlines() or [""])[0][:200]
        raise ConfigError(f"{KEY}={spec}: {name}(**rollout.agent.environment_kwargs) raised "
                          f"{type(e).__name__}: {first}") from e
    if not isinstance(env, vf.Environment):
        raise ConfigError(f"{KEY}={spec}: {name} returned a {type(env).__name__}, expected a verifiers.Environment")
    return env


def load_verifiers_env(spec: str, kwargs: dict):
    """The Environment `spec` names, loaded once per run (the records and the rollout share it)."""
    return _cached(spec, json.dumps(dict(kwargs), sort_keys=True))


def environment_records(env, split: str, prompt_key: str, answer_key: str) -> list[dict] | None:
    """The env's `dataset` ("train") or `eval_dataset` ("eval") as records: the last user message's text (what
    logs and the no-request fallback show; the env renders its own prompt), the answer, and `verifiers_row`
    ([split, index]) naming the row the episode runs. None: the env has no such dataset."""
    dataset = env.build_dataset() if split == "train" else env.build_eval_dataset()  # built from a source if lazy
    if dataset is None:
        return None
    records = []
    for i, row in enumerate(dataset):
        users = [m for m in row["prompt"] if m.get("role") == "user"]
        content = users[-1]["content"] if users else ""
        if not isinstance(content, str):
            content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
        records.append({prompt_key: content, answer_key: str(row.get("answer") or ""), "verifiers_row": [split, i]})
    return records


def environment_program(env):
    """The agent program running `env` on a sample's row: `run(client, sample) -> {"reward", metrics...}`."""
    from verifiers.clients import OpenAIChatCompletionsClient

    datasets = {}

    def row(sample) -> dict:
        split, index = sample.extra["verifiers_row"]
        if split not in datasets:
            datasets[split] = env.build_dataset() if split == "train" else env.build_eval_dataset()
        return dict(datasets[split][index])

    async def run(client, sample):
        output = await env.run_rollout(row(sample), OpenAIChatCompletionsClient(client), "policy", {})
        if output.get("error"):
            raise RuntimeError(f"the verifiers rollout ended with an error: {output['error']}")
        metrics = {k: float(v) for k, v in (output.get("metrics") or {}).items()}
        return {"reward": float(output["reward"]), **metrics}

    return run
