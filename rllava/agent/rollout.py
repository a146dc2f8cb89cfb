"""The multi-turn Rollout role: K episodes per prompt, each a conversation of model turns and observations
(docs/agents.md, "What a rollout is").

    prompt -> turn 1 (model) -> observation 1 (tool text / images) -> turn 2 (model) -> ... -> <answer>

Each round generates the next turn of every unfinished episode in one batched engine call, then the environment reads
each new turn: `rllava.agent.tools.ToolEnv`, the classes of `rllava.agent.classes`, or your own with
`reset(sample, model_sizes)`, `step(state, text) -> Observation` and optionally `close(state)` at the episode's end. An
episode ends on an answer, a call-less turn, a turn cut by its token budget, `rollout.max_turns` turns, or the context
budget (turns and observations together within `data.max_response_length` tokens). Turns are trained; observations (user
turns of the chat template, tokenised by the processor like a prompt, pixels appended to `mm_inputs`) never are: the
training forward sees the interleaved sequence the engine continued."""

from __future__ import annotations

import ctypes
import hashlib
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from PIL import Image

from rllava.agent.tools import AgentState, Observation
from rllava.config.schema import AgentConfig
from rllava.data.dataset import encode_prompt
from rllava.data.images import resize_to_pixel_bounds, to_rgb
from rllava.data.protocol import Sample, Segment, Trajectory, concat_mm
from rllava.data.records import DataError
from rllava.engine.inference.base import Completion, GenerationRequest, SamplingParams
from rllava.roles.rollout import Rollout, model_image_sizes, raw_prompt_ids, truncate

MM_DROP = ("input_ids", "attention_mask", "mm_token_type_ids")
KEPT = ("turn_texts", "turn_rewards", "anchors", "last_observation", "response_tokens", "finish_reason")  # as they are
REPLY = "rllava-reply"  # a stand-in model turn, to find where the chat template closes one


@dataclass
class Episode:
    """One trajectory being rolled out: its tokens (expanded and raw), images and segments so far."""

    group: int
    sample: Sample
    ids: list[int]  # the conversation so far, image placeholders expanded (HF engine, training)
    raw: list[int]  # the same with one placeholder per image (vLLM / SGLang)
    mm: dict[str, torch.Tensor]
    segments: list[Segment]
    state: AgentState
    turn_texts: list[str] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)  # tool-level reward of each turn's call
    anchors: list[str] = field(default_factory=list)  # per turn: "" or the observation digest it followed (GiGPO)
    last_observation: str = ""
    response_tokens: int = 0  # turns + observations so far (the context budget counts both)
    finish_reason: str = ""  # "" while running; then "stop" or "length"


def _check_plain(value, where: str) -> None:
    """Raise (one line, naming `where`) unless `value` is data a weights_only checkpoint load reads back."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise DataError(f"{where}: key {k!r} is not a string or number; partial rollouts checkpoint it")
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_plain(v, where)
    elif not (value is None or isinstance(value, (str, int, float, bool, torch.Tensor))):
        raise DataError(f"{where} holds a {type(value).__name__}: rollout.partial_rollout checkpoints paused episodes "
                        "as data (numbers, strings, lists, dicts, tensors)")


def agent_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """How the agents behaved: turns per episode, tool calls (and the share that failed), images returned."""
    eps = [t for t in trajectories if t.agent is not None]
    if not eps:
        return {}
    calls = sum(len(t.agent.calls) for t in eps)
    programs = [t.agent.memory["program"] for t in eps if "program" in t.agent.memory]  # rllava.agent.program
    own = {"agent/retokenized_turns": sum(p["retokenized"] for p in programs) / len(programs),
           "agent/program_failures": sum(bool(p["error"]) for p in programs) / len(programs),
           "agent/requests_per_generate": sum(p["batching"] for p in programs) / len(programs)} if programs else {}
    return {**own, "agent/turns_mean": sum(len(t.turn_rewards) for t in eps) / len(eps),
            "agent/tool_calls_mean": calls / len(eps),
            "agent/episodes_with_calls": sum(bool(t.agent.calls) for t in eps) / len(eps),
            "agent/failed_call_ratio": sum(t.agent.failed_calls for t in eps) / calls if calls else 0.0,
            "agent/returned_images_mean": sum(len(t.agent.images) - len(t.sample.images) for t in eps) / len(eps)}


def _give_back_freed_memory() -> None:
    """Return to the system what the tool threads freed: glibc keeps each thread's freed blocks in that thread's
    arena (64 code calls of 4 images of 4096 x 4096 on 8 threads left +2 GB freed but held after the round: +120 MB
    once trimmed, docs/agents.md); glibc's malloc_trim took 1 ms there. Elsewhere (no malloc_trim): nothing."""
    with suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


class AgentRollout(Rollout):
    def __init__(self, engine, processor, env, *, max_turns: int, max_response_length: int,
                 observation_role: str = "user", min_pixels: int | None = None, max_pixels: int | None = None,
                 skip_special_tokens: bool = True, tool_workers: int = 1, asynchronous: bool = False,
                 round_image_mb: int = AgentConfig.round_image_mb):
        super().__init__(engine, processor, skip_special_tokens=skip_special_tokens)
        self.env, self.max_turns, self.budget = env, max_turns, max_response_length
        self.asynchronous = asynchronous  # rollout.async_mode: no rounds (`_generate_async`)
        self.tool_workers = tool_workers  # environment steps of one round run at once, at most this many
        self.observation_role, self.min_pixels, self.max_pixels = observation_role, min_pixels, max_pixels
        self.round_image_mb, self.round_bytes, self.lock = round_image_mb, 0, threading.Lock()

    def generate(self, samples: list[Sample], sampling: SamplingParams, prefixes=None) -> list[Trajectory]:
        """`sampling.n` episodes per sample (group i for sample i), each turn within `sampling.max_new_tokens`."""
        if prefixes is not None:
            raise ValueError("agent rollouts do not start responses with expert prefixes")
        episodes = self._episodes(samples, sampling.n)
        if self.asynchronous:
            self._generate_async(episodes, sampling)
        while active := [e for e in episodes if not e.finish_reason]:  # async: all finished already
            self._round(active, sampling)
        return [self._trajectory(e) for e in episodes]

    def _round(self, active: list[Episode], sampling: SamplingParams) -> None:
        """`_turns`, then the environment on each in up to `tool_workers` threads (a slow tool delays only its own)."""
        stepping = self._turns(active, sampling)
        if self.tool_workers <= 1 or len(stepping) <= 1:
            observations = [self._step(e) for e in stepping]
        else:
            with ThreadPoolExecutor(min(self.tool_workers, len(stepping))) as pool:
                observations = list(pool.map(self._step, stepping))
            _give_back_freed_memory()
        for e, obs in zip(stepping, observations):
            self._observe(e, obs)

    def _turns(self, active: list[Episode], sampling: SamplingParams) -> list[Episode]:
        """The next turn of every episode in `active` (one batched engine call); returns those the environment reads."""
        budgets = [min(sampling.max_new_tokens, self.budget - e.response_tokens) for e in active]
        self.round_bytes = 0  # the images the observations of this round add (async: of this engine call's turns)
        requests = [GenerationRequest(e.ids, e.mm, e.raw, list(e.state.images), e.sample.videos) for e in active]
        completions = self.engine.generate(requests, replace(sampling, n=1, max_new_tokens=max(budgets)))
        return [e for e, (c,), budget in zip(active, completions, budgets)
                if self._add_turn(e, truncate(c, budget), last=len(e.turn_texts) == self.max_turns - 1)]

    def _generate_async(self, episodes: list[Episode], sampling: SamplingParams) -> None:
        """rollout.async_mode: no rounds. Each tool call runs in its own thread (at most `tool_workers` at once) and
        its episode goes on when it returns: each engine call takes the episodes ready by then. Which episodes share
        an engine call depends on the tools' timing, so sampled runs are not bit-reproducible (rounds are)."""
        ready, calls = list(episodes), {}
        with ThreadPoolExecutor(max(1, self.tool_workers)) as pool:
            while ready or calls:
                for e in self._turns(ready, sampling) if ready else []:
                    calls[pool.submit(self._step, e)] = e
                ready = []
                if calls:  # the first call to return, and any others done by then
                    finished, _ = wait(calls, return_when=FIRST_COMPLETED)
                    for future in [f for f in calls if f in finished]:  # in submission order
                        e = calls.pop(future)
                        self._observe(e, future.result())
                        if not e.finish_reason:
                            ready.append(e)

    # rollout.partial_rollout (roles.rollout.PartialRollouts): an episode pauses between turns, a round is one turn
    def partial_begin(self, samples: list[Sample], sampling: SamplingParams, chunk: int, max_new: int) -> list[list]:
        episodes = self._episodes(samples, sampling.n)
        self._round(episodes, sampling)
        return [[e for e in episodes if e.group == i] for i in range(len(samples))]

    def partial_advance(self, episodes: list[Episode], sampling: SamplingParams, chunk: int, max_new: int) -> None:
        self._round(episodes, sampling)

    def partial_done(self, e: Episode, max_new: int) -> bool:
        return bool(e.finish_reason)

    def partial_finish(self, e: Episode) -> Trajectory:
        return self._trajectory(e)

    def partial_state(self, e: Episode) -> dict:
        """The episode as data (a checkpoint is loaded with weights_only): tokens, pixels, the images the tools
        showed, and the tools' state, which must be plain data (numbers, strings, lists, dicts, tensors)."""
        s = e.state
        _check_plain(s.memory, f"episode of {e.sample.where}: the tools' state (AgentState.memory)")
        return {"index": e.sample.index, "ids": e.ids, "raw": e.raw, "mm": dict(e.mm),
                "segments": [[g.token_ids, g.trained, g.logprobs, g.version] for g in e.segments],
                "images": [torch.from_numpy(np.asarray(to_rgb(im))) for im in s.images[len(e.sample.images):]],
                "model_sizes": [list(x) for x in s.model_sizes], "calls": [list(c) for c in s.calls],
                "failed_calls": s.failed_calls, "memory": s.memory, "log": s.log, "step_reward": s.step_reward,
                **{k: getattr(e, k) for k in KEPT}}

    def partial_load(self, st: dict, dataset) -> Episode:
        sample = dataset[st["index"]]
        state = self.env.reset(sample, [tuple(x) for x in st["model_sizes"][:len(sample.images)]])
        state.images += [Image.fromarray(t.numpy()) for t in st["images"]]
        state.model_sizes = [tuple(x) for x in st["model_sizes"]]
        state.calls, state.failed_calls = [tuple(c) for c in st["calls"]], st["failed_calls"]
        state.memory, state.log, state.step_reward = st["memory"], st["log"], st.get("step_reward", 0.0)
        return Episode(0, sample, st["ids"], st["raw"], st["mm"],
                       [Segment(ids, trained=t, logprobs=lps, version=v) for ids, t, lps, v in st["segments"]],
                       state, *(st[k] for k in KEPT))

    def _step(self, e: Episode) -> Observation:
        """The environment on the episode's last turn, its observation bounded as it arrives: non-UTF-8 text (a lone
        surrogate, which the tokenizer rejects) gets U+FFFD; images come to data.min/max_pixels now; once the round's
        images pass `rollout.agent.round_image_mb` (as RGB) the rest are dropped, with a note the model reads."""
        obs = self.env.step(e.state, e.turn_texts[-1])
        text = obs.text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        images = [resize_to_pixel_bounds(to_rgb(im), self.min_pixels, self.max_pixels) for im in obs.images]
        rgb_bytes, kept = [3 * im.width * im.height for im in images], 0
        with self.lock:
            while kept < len(images) and self.round_bytes + rgb_bytes[kept] <= self.round_image_mb << 20:
                self.round_bytes += rgb_bytes[kept]
                kept += 1
        if kept < len(images):
            text += (f"\n[{len(images) - kept} image{'s' * (len(images) - kept > 1)} not shown: this round's "
                     f"observations passed rollout.agent.round_image_mb={self.round_image_mb}]")
        return replace(obs, text=text, images=images[:kept])

    def replay(self, samples: list[Sample]) -> list[Trajectory]:
        """Multi-turn SFT: each sample's expert turns (`sample.target`, a list of turn texts or one) written as the
        model's, the tools run on them as in a rollout (the observations the policy will see). Turns are trained,
        off-policy (teacher-forced); an episode the environment ends early drops the expert's remaining turns."""
        out = []
        for i, sample in enumerate(samples):
            turns = sample.target if isinstance(sample.target, (list, tuple)) else [sample.target]
            if not turns or not all(isinstance(t, str) for t in turns):
                raise DataError(f"{sample.where}: an agent's expert trajectory (data.target_key) is a list of turn "
                                f"texts, not {type(sample.target).__name__}")
            (e,) = self._episodes([sample], 1)
            for k, text in enumerate(turns):
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                ids = ids[:self.budget - e.response_tokens - 1] + [self.tokenizer.eos_token_id]
                last = k == min(len(turns), self.max_turns) - 1
                if self._add_turn(e, Completion(ids, [0.0] * len(ids), "stop"), last=last):
                    self.round_bytes = 0  # a turn of one sample is a round
                    self._observe(e, self._step(e))
                if e.finish_reason:
                    break
            t = self._trajectory(e)
            for s in t.segments:
                s.off_policy, s.logprobs = s.trained, None
            out.append(replace(t, group_id=i))
        return out

    def _episodes(self, samples: list[Sample], n: int) -> list[Episode]:
        """`n` fresh episodes per sample (group id i for sample i): the encoded prompt and a reset environment."""
        episodes = []
        for i, sample in enumerate(samples):
            ids, mm = encode_prompt(self.processor, sample)
            raw, sizes = raw_prompt_ids(self.processor, sample, ids), model_image_sizes(self.processor, sample, mm)
            episodes += [Episode(i, sample, list(ids), list(raw), dict(mm), [Segment(ids, trained=False)],
                                 self.env.reset(sample, sizes)) for _ in range(n)]
        return episodes

    def _add_turn(self, e: Episode, c: Completion, last: bool) -> bool:
        """Append a model turn; True when the episode goes on and the environment is to read the turn."""
        text = self.tokenizer.decode(c.token_ids, skip_special_tokens=self.skip_special_tokens)
        e.segments.append(Segment(list(c.token_ids), trained=True, logprobs=list(c.logprobs)))
        e.ids, e.raw = e.ids + c.token_ids, e.raw + c.token_ids
        e.response_tokens += len(c.token_ids)
        e.turn_texts.append(text)
        e.state.log.append({"turn": text, "call": None})
        e.turn_rewards.append(0.0)
        e.anchors.append(e.last_observation)
        # cut mid-turn: no complete call to run; rollout.max_turns: no turn left to read an observation in, no tool runs
        e.finish_reason = "length" if c.finish_reason == "length" else "stop" if last else e.finish_reason
        return not e.finish_reason

    def _observe(self, e: Episode, obs: Observation) -> None:
        """The environment's answer to the last turn: its reward, and (unless the episode ends) what it shows."""
        e.turn_rewards[-1] = obs.reward
        entry = e.state.log[-1]
        if len(e.state.calls) > sum(x["call"] is not None for x in e.state.log[:-1]):
            entry["call"] = list(e.state.calls[-1])
        if obs.done:
            e.finish_reason = "stop"
            return
        shown = len(e.state.images)
        entry.update(observation=obs.text, error=obs.error, tool_reward=obs.reward,
                     images=list(range(shown, shown + len(obs.images))))  # indices into the episode's images
        text = self.observation_text(obs)
        ids = raw = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        mm, sizes, images = {}, [], []
        if obs.images:
            images = [resize_to_pixel_bounds(to_rgb(im), self.min_pixels, self.max_pixels) for im in obs.images]
            enc = self.processor(text=[text], images=images, return_tensors="pt")
            mm = {k: v for k, v in enc.items() if k not in MM_DROP}
            sizes = model_image_sizes(self.processor, replace(e.sample, images=images), mm)
            ids = enc["input_ids"][0].tolist()
        if e.response_tokens + len(ids) >= self.budget:  # no room for the observation and one more token
            e.finish_reason = "length"
            return
        e.segments.append(Segment(ids, trained=False))
        e.ids, e.raw, e.mm = e.ids + ids, e.raw + raw, concat_mm([e.mm, mm])
        e.response_tokens += len(ids)
        e.state.images += images
        e.state.model_sizes += sizes
        h = hashlib.sha1(obs.text.encode())  # equal for equal observations (text and pixels): GiGPO's anchor state
        for im in obs.images:
            h.update(repr((im.mode, im.size)).encode() + im.tobytes())
        e.last_observation = h.hexdigest()
        step_reward = getattr(self.env, "step_reward", None)  # RLLaVA's sum over the observations shown
        e.state.step_reward += step_reward(obs) if step_reward is not None else float(not obs.error)

    def observation_text(self, obs: Observation) -> str:
        """The chat-template text between the end of a model turn (its EOS) and the start of the next one: the
        observation as a `rollout.agent.observation_role` turn, then the assistant's generation prompt."""
        content = [{"type": "image"} for _ in obs.images] + [{"type": "text", "text": obs.text}]
        turn = [{"role": "user", "content": [{"type": "text", "text": "question"}]},
                {"role": "assistant", "content": [{"type": "text", "text": REPLY}]}]
        base = self.processor.apply_chat_template(turn, tokenize=False)
        full = self.processor.apply_chat_template(turn + [{"role": self.observation_role, "content": content}],
                                                  add_generation_prompt=True, tokenize=False)
        if not full.startswith(base):
            raise ValueError("the chat template renders an earlier turn differently once a later one follows; "
                             "multi-turn rollouts need a template that appends turns")
        tail = base[base.rindex(REPLY) + len(REPLY):]  # what closes an assistant turn, e.g. "<|im_end|>\n"
        eos = self.tokenizer.eos_token or ""
        return (tail[len(eos):] if eos and tail.startswith(eos) else tail) + full[len(base):]

    def _trajectory(self, e: Episode) -> Trajectory:
        if hasattr(self.env, "close"):  # the episode is over: an environment of its own releases what it holds
            self.env.close(e.state)
        return Trajectory(sample=e.sample, group_id=e.group, segments=e.segments, mm_inputs=e.mm,
                          response="\n".join(e.turn_texts), finish_reason=e.finish_reason,
                          model_image_sizes=e.state.model_sizes, turn_rewards=e.turn_rewards,
                          turn_anchors=e.anchors, agent=e.state)
