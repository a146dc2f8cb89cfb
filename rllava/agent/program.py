"""Agents written for an OpenAI client, as a rollout driver (docs/agents.md, "Agents written for an OpenAI client"):
`rollout.agent.program=path/to/agent.py:run`,

    async def run(client: openai.AsyncOpenAI, sample) -> float | dict | None     (or a plain def with openai.OpenAI)

K = rollout.n episodes per prompt, each the program run once in a thread of its own, its client pointed at the
policy (`rllava.agent.endpoint`) with the episode's key. The return is the reward, a dict {"reward": r, name:
value, ...} (the other entries logged as reward details), or None: the reward file scores the episode.

Exact tokens. The trainer trains on the ids the engine sampled with its log-probs, never on a re-tokenisation:
each request's prompt ids and sampled ids are recorded, and the episode is assembled from them. Turn t+1's prompt
continues the row when it starts with turn t's prompt + sampled ids (and the same pixels): its new suffix (the
tool result, the next user turn) is a given segment. A prompt that does not (the template re-rendered history
differently: Qwen3 drops earlier <think> blocks; a program that rewrote its messages) starts a new row of the
episode, with its group and reward, counted in `agent/retokenized_turns`. This is the assembly of verl's agent
loop (verl/experimental/agent_loop/tool_agent_loop.py: prompt_ids += response_ids + tool_response_ids, the
response mask 1 on the model's ids only) with slime's and AReaL's proxy rule for requests that do not extend the
last one (a sequence of their own) instead of re-tokenising.

A program that raises, runs past rollout.agent.episode_timeout, never calls the endpoint, or asks for another
model: that episode scores 0 with one warning naming the sample and the reason (reward.strict=true: an error)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import replace

import torch

from rllava.agent.endpoint import EpisodeLog, PolicyEndpoint, Turn
from rllava.agent.tools import AgentState
from rllava.data.dataset import encode_prompt
from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.engine.inference.base import SamplingParams
from rllava.errors import RllavaError
from rllava.reward.function import RewardError, load_reward_function
from rllava.roles.rollout import Rollout, model_image_sizes

log = logging.getLogger(__name__)


def _same_pixels(before: Turn, after: Turn) -> bool:
    """`after` shows the images of `before` first, with the same pixels (equal ids can hide other pixels)."""
    for name, tensor in before.mm.items():
        later = after.mm.get(name)
        if later is None or later.shape[0] < tensor.shape[0] or not torch.equal(later[:tensor.shape[0]], tensor):
            return False
    return True


def chains(turns: list[Turn]) -> tuple[list[list[list]], int]:
    """The episode's requests as rows of [turn, choice index]: a request continues the row whose last prompt +
    sampled choice its prompt starts with (that choice is the row's), else starts a row (counted: retokenized).
    A row's last turn keeps choice 0; choices no request continues are not trained."""
    rows, retokenized = [], 0
    for turn in turns:
        found = None
        for row in reversed(rows):
            last = row[-1][0]
            for k, c in enumerate(last.choices):
                prefix = last.prompt_ids + c.token_ids
                if len(turn.prompt_ids) > len(prefix) and turn.prompt_ids[:len(prefix)] == prefix \
                        and _same_pixels(last, turn):
                    found = (row, k)
                    break
            if found:
                break
        if found:
            found[0][-1][1] = found[1]
            found[0].append([turn, 0])
        else:
            retokenized += bool(rows)
            rows.append([[turn, 0]])
    return rows, retokenized


def program_value(value, where: str) -> tuple[float | None, dict, str]:
    """(reward or None, metrics, error) of what a program returned."""
    if value is None:
        return None, {}, ""
    if isinstance(value, dict):
        reward, metrics = value.get("reward"), {k: v for k, v in value.items() if k != "reward"}
        bad = [k for k, v in metrics.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            return None, {}, f"returned metrics that are not numbers: {', '.join(map(repr, bad))}"
    else:
        reward, metrics = value, {}
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                               or not math.isfinite(reward)):
        return None, {}, (f"returned {type(value).__name__} {value!r:.80}: expected a finite number, a dict with "
                          "'reward', or None")
    return None if reward is None else float(reward), metrics, ""


class ProgramRollout(Rollout):
    """rollout.agent.program: K runs of the user's program per prompt against the endpoint, rows assembled from
    the tokens the endpoint recorded (`chains`). `program`: its spec, or the function (rllava.agent.verifiers_env)."""

    def __init__(self, engine, processor, program, *, max_turns: int, max_context: int,
                 episode_timeout: float, strict: bool = False, min_pixels=None, max_pixels=None,
                 skip_special_tokens: bool = True, window: float = 0.2, key: str = "rollout.agent.program"):
        super().__init__(engine, processor, skip_special_tokens=skip_special_tokens)
        self.key = key  # the config key errors name
        self.program = program if callable(program) else load_reward_function(program, key="rollout.agent.program")
        self.max_turns, self.timeout, self.strict = max_turns, episode_timeout, strict
        self.endpoint = PolicyEndpoint(processor, max_context=max_context, min_pixels=min_pixels,
                                       max_pixels=max_pixels, window=window)

    def close(self) -> None:
        self.endpoint.close()

    def generate(self, samples: list[Sample], sampling: SamplingParams, prefixes=None) -> list[Trajectory]:
        if prefixes is not None:
            raise ValueError("agent programs do not start responses with expert prefixes")
        episodes = [(i, s, EpisodeLog(uuid.uuid4().hex, s.where, self.max_turns), Future())
                    for i, s in enumerate(samples) for _ in range(sampling.n)]
        logs = [e for _, _, e, _ in episodes]
        self.endpoint.sampling = replace(sampling, n=1)
        self.endpoint.begin(logs)
        try:
            for _, sample, episode, result in episodes:
                threading.Thread(target=self._run, args=(episode, sample, result), daemon=True,
                                 name=f"rllava-agent-{episode.id[:8]}").start()
            deadline = time.monotonic() + self.timeout
            live = lambda: [e for e in logs if not e.done]  # noqa: E731
            while live() and time.monotonic() < deadline:
                self.endpoint.pump(self.engine, live, timeout=min(1.0, deadline - time.monotonic()))
            for e in live():  # hung: its requests are 409s from now on, its thread is left to end by itself
                self.endpoint.finish(e, f"ran past rollout.agent.episode_timeout={self.timeout:g}s")
        finally:
            self.endpoint.end()
        batching = self.endpoint.batched_requests / max(self.endpoint.generate_calls, 1)  # requests per engine call
        out = []
        for i, sample, episode, result in episodes:
            value = result.result() if result.done() else None
            out += self._rows(i, sample, episode, value, batching)
        return out

    def _run(self, episode: EpisodeLog, sample: Sample, result: Future) -> None:
        """The program on one episode (in this thread, with its own event loop when it is async)."""
        import openai

        kw = dict(base_url=self.endpoint.url, api_key=self.endpoint.client_key(episode), max_retries=0,
                  timeout=self.timeout)
        try:
            if inspect.iscoroutinefunction(self.program):
                async def main():
                    async with openai.AsyncOpenAI(**kw) as client:
                        return await self.program(client, sample)
                value = asyncio.run(main())
            else:
                with openai.OpenAI(**kw) as client:
                    value = self.program(client, sample)
        except BaseException as e:  # noqa: BLE001 (the user's program: any failure is this episode's)
            first = (str(e).splitlines() or [""])[0][:200]
            self.endpoint.finish(episode, f"raised {type(e).__name__}: {first}")
            result.set_result(None)
            return
        result.set_result(value)
        rejected = f" (its requests were refused, the last: {episode.rejected})" if episode.rejected else ""
        self.endpoint.finish(episode, "" if episode.turns else "returned without calling the endpoint" + rejected)

    def _rows(self, group: int, sample: Sample, episode: EpisodeLog, value, batching: float) -> list[Trajectory]:
        """The episode's rows (`chains`), every one with the episode's texts, calls and what the program returned;
        `batching`: the rollout's requests per batched engine call (`agent/requests_per_generate`)."""
        reward, metrics, error = program_value(value, sample.where)
        error = episode.error or error
        if error:
            message = f"{self.key}: the episode of {sample.where} {error}"
            if self.strict:
                raise RllavaError(message + " (reward.strict=true; false scores such an episode 0)")
            log.warning("%s: scored 0", message)
        rows, retokenized = chains(episode.turns)
        turns = [(t, k) for row in rows for t, k in row]
        texts = [t.texts[k] for t, k in turns]
        state = AgentState(sample, calls=[(c["function"]["name"], c["function"]["arguments"])
                                          for t, k in turns for c in t.calls[k]],
                           log=[{"turn": text, "call": None} for text in texts],
                           memory={"program": {"reward": reward, "metrics": metrics, "error": error,
                                               "retokenized": retokenized, "batching": batching}})
        if not rows:  # no request: the dataset's prompt and no response
            ids, mm = encode_prompt(self.processor, sample)
            state.images = list(sample.images)
            segments = [Segment(ids, False), Segment([], True, logprobs=[])]
            return [Trajectory(sample=sample, group_id=group, segments=segments, mm_inputs=mm, agent=state,
                               model_image_sizes=model_image_sizes(self.processor, sample, mm))]
        out = []
        for row in rows:
            segments, seen = [Segment(row[0][0].prompt_ids, False)], []
            for turn, k in row:
                if seen:
                    segments.append(Segment(turn.prompt_ids[len(seen):], False))
                c = turn.choices[k]
                segments.append(Segment(list(c.token_ids), True, logprobs=list(c.logprobs)))
                seen = turn.prompt_ids + c.token_ids
            last = row[-1][0]
            sizes = model_image_sizes(self.processor, replace(sample, images=last.images), last.mm)
            state.images, state.model_sizes = list(last.images), sizes
            out.append(Trajectory(sample=sample, group_id=group, segments=segments, mm_inputs=last.mm,
                                  response="\n".join(texts), finish_reason=last.choices[row[-1][1]].finish_reason,
                                  model_image_sizes=sizes, turn_rewards=[0.0] * len(row), agent=state))
        return out


def program_info(t: Trajectory) -> dict:
    return t.agent.memory["program"]


class ProgramScore:
    """The reward source of a run with rollout.agent.program: each episode's returned reward (its metrics as
    details), 0 for a failed episode, and `inner` (the Scoring of the reward files and reward models) for episodes
    that returned None."""

    def __init__(self, inner):
        self.inner, self.last_error = inner, None

    @property
    def errors(self) -> int:
        return self.inner.errors

    def score(self, trajectories: list[Trajectory], train: bool = False):
        scores, details = torch.zeros(len(trajectories)), [{} for _ in trajectories]
        rest = [i for i, t in enumerate(trajectories) if program_info(t)["reward"] is None
                and not program_info(t)["error"]]
        if rest and not self.inner.sources:
            raise RewardError(f"rollout.agent.program returned None for the episode of "
                              f"{trajectories[rest[0]].sample.where} and no reward.reward_function or reward model "
                              "scores it: return the reward, or set reward.reward_function")
        if rest:
            inner, parts = self.inner.score([trajectories[i] for i in rest], train)
            for i, s, d in zip(rest, inner.tolist(), parts):
                scores[i], details[i] = s, d
        for i, t in enumerate(trajectories):
            info = program_info(t)
            if i not in rest:
                scores[i] = 0.0 if info["error"] else info["reward"]
                details[i] = {"overall": scores[i].item(), **({} if info["error"] else info["metrics"])}
            details[i]["program_failed"] = float(bool(info["error"]))
        return scores, details

    def close(self) -> None:
        self.inner.close()
