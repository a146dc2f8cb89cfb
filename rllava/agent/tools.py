"""Tools an agent calls between its turns, and the environment that runs them (docs/agents.md, "Tools").

    turn text --parse--> (tool name, arguments) --tool(arguments, state)--> Observation(text, images, reward)

A tool is registered by name (`@register_tool("zoom")`): a function `fn(args, state) -> Observation`, or a class whose
instances are one, built with `rollout.agent.tool_kwargs.<name>.*`; `rollout.agent.tools` picks them. A tool rejects
its arguments by raising `ToolError`; any exception it raises becomes an error observation the model reads next turn,
and the calling turn is credited `rollout.agent.invalid_call_penalty` (negative). Any other exception is a bug of the
tool, not of the model: the first of each kind is also a warning line naming the tool, the call and the line that
raised, and a tool whose first BROKEN_AFTER calls all raised stops the run with that line (docs/agents.md, "Tools")."""

from __future__ import annotations

import json
import logging
import os
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from rllava.algorithms.registry import _register
from rllava.data.protocol import Sample
from rllava.errors import ConfigError, RllavaError

log = logging.getLogger(__name__)
TOOLS: dict[str, Callable] = {}
BROKEN_AFTER = 8  # a tool whose first calls all raised (none ran or rejected its arguments) is broken


def register_tool(name: str):
    """Register a tool function `fn(args, state) -> Observation`, or a class whose instances are one, as `name`."""
    return _register(TOOLS, "tool", name)


class ToolError(Exception):
    """A tool call the tool cannot run (bad arguments): its message is what the model reads."""


def _raised_at(e: BaseException) -> str:
    """`file.py:line` where `e` was raised (the innermost frame)."""
    frame = traceback.extract_tb(e.__traceback__)[-1]
    return f"{os.path.basename(frame.filename)}:{frame.lineno}"


@dataclass
class Observation:
    """What the environment shows the model after a turn (a user turn of text and images)."""

    text: str = ""
    images: list = field(default_factory=list)  # PIL images, appended to the trajectory's images
    reward: float = 0.0  # tool-level reward, credited to the turn that made the call
    done: bool = False  # the episode ends here (nothing is shown)
    error: bool = False  # the call was invalid or the tool failed


@dataclass
class AgentState:
    """One trajectory's episode as tools see it."""

    sample: Sample
    images: list = field(default_factory=list)  # every image shown so far: the sample's, then observations'
    model_sizes: list[tuple[int, int]] = field(default_factory=list)  # (w, h) of each image as the model saw it
    calls: list[tuple[str, Any]] = field(default_factory=list)  # (tool, arguments) of every call so far
    failed_calls: int = 0  # calls that were invalid or whose tool failed
    memory: dict = field(default_factory=dict)  # free space for a tool's own state
    log: list[dict] = field(default_factory=list)  # per turn, for samples.jsonl: its text, call, what it was shown
    step_reward: float = 0.0  # RLLaVA's: the step rewards summed over the observations shown (ToolEnv.step_reward)


def parse_tags(text: str, names: list[str]) -> tuple[str, Any] | None:
    """The first `<name>arguments</name>` of a registered tool in `text`, or None."""
    m = re.search(r"<(%s)>(.*?)</\1>" % "|".join(map(re.escape, names)), text, re.DOTALL) if names else None
    return (m.group(1), m.group(2).strip()) if m else None


def parse_json(text: str, names: list[str]) -> tuple[str, Any] | None:
    """The first `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in `text`, or None. A call that is not
    such a JSON object is returned as ("", reason), an invalid call."""
    m = re.search(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
    if m is None:
        return None
    try:
        call = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        return "", f"the tool call is not valid JSON ({e.msg})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return "", 'a tool call is {"name": "<tool>", "arguments": {...}}'
    return call["name"], call.get("arguments", {})


def parse_fenced(text: str, names: list[str]) -> tuple[str, Any] | None:
    """A fenced ```python block as a call of the `code` tool (the first block), else `<name>...</name>` tags."""
    m = re.search(r"```(?:python|py)[ \t]*\n(.*?)```", text, re.DOTALL) if "code" in names else None
    return ("code", m.group(1)) if m else parse_tags(text, names)


PARSERS = {"tags": parse_tags, "json": parse_json, "fenced": parse_fenced}


def answer_of(text: str, tag: str = "answer") -> str | None:
    """The text of the first `<answer>...</answer>`, or None: the turn that ends the episode."""
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return m.group(1).strip() if m else None


class ToolEnv:
    """The environment of tool-using agents: `reset(sample) -> state`, `step(state, turn_text) -> Observation`.
    An answer or a call-less turn ends the episode; an unknown tool or a tool's exception is an error observation."""

    def __init__(self, tools: dict[str, Callable], *, tool_format: str = "tags", answer_tag: str = "answer",
                 invalid_call_penalty: float = 0.0):
        self.tools, self.parse, self.answer_tag = tools, PARSERS[tool_format], answer_tag
        self.invalid_call_penalty = invalid_call_penalty
        self.raised, self.worked, self.warned = {}, set(), set()  # per tool: calls that raised; ran once; warned

    def reset(self, sample: Sample, model_sizes: list[tuple[int, int]] | None = None) -> AgentState:
        return AgentState(sample, images=list(sample.images), model_sizes=list(model_sizes or []))

    def step(self, state: AgentState, text: str) -> Observation:
        call = None if answer_of(text, self.answer_tag) is not None else self.parse(text, list(self.tools))
        if call is None:  # an answer, or a turn without a call: the episode ends
            return Observation(done=True)
        name, args = call
        state.calls.append((name, args))
        if name not in self.tools:
            return self._error(state, args if name == "" else f"there is no tool {name!r} (tools: "
                                                              f"{', '.join(self.tools)})")
        try:
            obs = self.tools[name](args, state)
        except ToolError as e:
            self.worked.add(name)  # it ran its own checks
            return self._error(state, f"{name}: {e}")
        except Exception as e:  # a tool's bug or a hostile argument: the model reads it, the step goes on
            return self._raised(state, name, args, e)
        if not isinstance(obs, Observation):
            return self._error(state, f"{name} returned {type(obs).__name__}, not an Observation")
        self.worked.add(name)
        return obs

    def _raised(self, state: AgentState, name: str, call, e: Exception) -> Observation:
        """The error observation for tool `name` raising `e` on `call`. The first `e` of its kind is also a warning
        line, and the BROKEN_AFTER-th call of a tool that never ran without raising stops the run."""
        where = _raised_at(e)
        line = f"the {name} tool raised {type(e).__name__}: {e} ({where}) on the call {str(call)[:80]!r}"
        self.raised[name] = self.raised.get(name, 0) + 1  # (tool threads: a count off by one at most)
        if name not in self.worked and self.raised[name] >= BROKEN_AFTER:
            raise RllavaError(f"{line}, as on each of its first {BROKEN_AFTER} calls: fix the tool (a call it "
                              "rejects raises ToolError, which the model reads)") from e
        if (name, type(e), where) not in self.warned:
            self.warned.add((name, type(e), where))
            log.warning("%s; the model reads it as an error observation (raise ToolError for a call the tool "
                        "rejects)", line)
        return self._error(state, f"{name} failed: {type(e).__name__}: {e}")

    def step_reward(self, obs: Observation) -> float:
        """RLLaVA's step reward (AgentSearchEnv, AgentCodeEnv), summed into `step_reward`: 1 if the call ran, else 0."""
        return 0.0 if obs.error else 1.0

    def _error(self, state: AgentState, reason: str) -> Observation:
        state.failed_calls += 1
        return Observation(text=f"Error: {reason}", reward=self.invalid_call_penalty, error=True)


def build_tools(names: list[str], kwargs: dict[str, dict]) -> dict[str, Callable]:
    """Instantiate the tools `rollout.agent.tools` names with their `rollout.agent.tool_kwargs`."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ConfigError(f"rollout.agent.tools: {', '.join(map(repr, unknown))} not registered (registered: "
                          f"{', '.join(sorted(TOOLS))}); a file of your own registers with @register_tool and is "
                          "listed in rollout.agent.plugins")
    extra = sorted(set(kwargs) - set(names))
    if extra:
        raise ConfigError(f"rollout.agent.tool_kwargs.{extra[0]}: {extra[0]!r} is not in rollout.agent.tools")
    tools = {}
    for name in names:
        fn, options = TOOLS[name], dict(kwargs.get(name) or {})
        if isinstance(fn, type):
            try:
                tools[name] = fn(**options)
            except ConfigError:
                raise  # already names its key
            except Exception as e:  # bad options, or a bug in the tool's __init__
                raise ConfigError(f"rollout.agent.tool_kwargs.{name}: building the {name} tool raised "
                                  f"{type(e).__name__}: {e} ({_raised_at(e)})") from e
        elif options:
            raise ConfigError(f"rollout.agent.tool_kwargs.{name}: the {name} tool takes no options")
        else:
            tools[name] = fn
    return tools


MIN_SIDE = 28  # pixels: Qwen-VL's smallest image (one 2 x 2 block of 14 px patches)


@register_tool("zoom")
def zoom(args, state: AgentState) -> Observation:
    """Crop of the last image shown, as a new image (DeepEyes' "thinking with images"). The box is in pixels of the
    image *as the model saw it* (`state.model_sizes[-1]`), scaled to the stored image, clamped to it, and grown around
    its centre to at least MIN_SIDE pixels a side; an empty box, or one outside the image, is an error observation."""
    if not state.images:
        raise ToolError("there is no image to zoom into")
    if isinstance(args, dict):
        args = args.get("bbox_2d", args.get("box"))
    if isinstance(args, str):
        args = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", args)]
    if not isinstance(args, (list, tuple)) or len(args) != 4 or not all(isinstance(v, (int, float)) for v in args):
        raise ToolError("zoom takes one box [x1, y1, x2, y2]")
    x1, y1, x2, y2 = (float(v) for v in args)
    if x2 <= x1 or y2 <= y1:
        raise ToolError(f"the box [{x1:g}, {y1:g}, {x2:g}, {y2:g}] is empty (it needs x1 < x2 and y1 < y2)")
    image = state.images[-1]
    W, H = image.size
    w, h = state.model_sizes[-1] if len(state.model_sizes) == len(state.images) else (W, H)
    x1, x2 = max(0.0, x1 * W / w), min(float(W), x2 * W / w)
    y1, y2 = max(0.0, y1 * H / h), min(float(H), y2 * H / h)
    if x2 <= x1 or y2 <= y1:
        raise ToolError(f"the box is outside the image ({w} x {h})")
    side = min(MIN_SIDE, W, H)
    if x2 - x1 < side:
        cx = min(max((x1 + x2) / 2, side / 2), W - side / 2)
        x1, x2 = cx - side / 2, cx + side / 2
    if y2 - y1 < side:
        cy = min(max((y1 + y2) / 2, side / 2), H - side / 2)
        y1, y2 = cy - side / 2, cy + side / 2
    crop = image.crop((round(x1), round(y1), round(x2), round(y2)))
    return Observation(text="", images=[crop])
