"""reasoning-gym's procedural tasks as records (docs/data.md, "reasoning-gym"):

    data.train_files=reasoning_gym:<task>?size=N&seed=S[&<field of the task's config>=<value>...]

Record i is `reasoning_gym.create_dataset(task, size=N, seed=S, ...)[i]`: its question as data.prompt_key, its
answer as data.answer_key ("" for tasks that accept several answers and give none), and `reasoning_gym` (the spec)
and `reasoning_gym_index` (i), from which the reward (`rllava.reward.reasoning_gym`) takes the entry again and
scores with the task's own `score_answer`. The same seed gives the same records (reasoning-gym draws item i from
Random(seed + i)). A value is read as JSON when it is JSON (`min_terms=2`, `allow_negative=false`), else as text.

Errors, one line each: an unknown task (naming the closest), a parameter the task's config has not or a value it
rejects, no seed (reasoning-gym would draw one: other records every run), reasoning-gym not installed."""

from __future__ import annotations

import dataclasses
import difflib
import json
from functools import lru_cache
from urllib.parse import parse_qsl

from rllava.data.records import DataError

PREFIX = "reasoning_gym:"


def is_reasoning_gym(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@lru_cache(maxsize=16)
def task_dataset(spec: str, key: str = "data.train_files"):
    """The reasoning-gym ProceduralDataset `spec` names, or a DataError naming `key` (the config key giving it)."""
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as e:
        raise DataError(f"{key}={spec}: needs the reasoning-gym package: pip install 'rllava[reasoning-gym]'") from e
    task, _, query = spec[len(PREFIX):].partition("?")
    if task not in DATASETS:
        close = difflib.get_close_matches(task, DATASETS, n=1, cutoff=0)
        raise DataError(f"{key}={spec}: reasoning-gym has no task {task!r} (the closest: {close[0]!r}; "
                        f"all {len(DATASETS)}: reasoning_gym.factory.DATASETS)")
    try:
        params = {k: _value(v) for k, v in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))}
    except ValueError as e:
        raise DataError(f"{key}={spec}: the query must be name=value pairs joined by '&' ({e})") from e
    fields = [f.name for f in dataclasses.fields(DATASETS[task][1])]
    unknown = [k for k in params if k not in fields]
    if unknown:
        raise DataError(f"{key}={spec}: {task} takes no parameter {unknown[0]!r} (its config: {', '.join(fields)})")
    if "seed" not in params:
        raise DataError(f"{key}={spec}: give seed=S (without one reasoning-gym draws a seed: other records every run)")
    for name, least in (("size", 1), ("seed", 0)):
        value = params.get(name, least)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise DataError(f"{key}={spec}: {name}={value!r} must be an integer >= {least}")
    try:
        return reasoning_gym.create_dataset(task, **params)
    except Exception as e:  # the config's own checks: AssertionError, ValueError, TypeError
        reason = (str(e).strip().splitlines() or [""])[0]
        raise DataError(f"{key}={spec}: {task} rejects its parameters ({type(e).__name__}: {reason})") from e


def reasoning_gym_records(spec: str, prompt_key: str, answer_key: str, key: str) -> list[dict]:
    """The task's entries as records (see the module docstring)."""
    dataset = task_dataset(spec, key)
    records = []
    for i in range(len(dataset)):
        entry = dataset[i]
        answer = entry["answer"]
        records.append({prompt_key: entry["question"], answer_key: "" if answer is None else str(answer),
                        "reasoning_gym": spec, "reasoning_gym_index": i})
    return records
