"""RLLaVA's `rollout.tool_config_path` / `rollout.env_config_path`: tools and environments given as classes in YAML
files, run by the same AgentRollout as registered tools (docs/agents.md, "RLLaVA's tool and environment files").

    # rollout.tool_config_path=tools.yaml            # rollout.env_config_path=env.yaml
    tools:                                           env:
      - class_name: my_tools.py:Calculator             class_name: my_env.py:MazeEnv
        config: {digits: 6}                            config: {size: 5}

`class_name` is `path/to/file.py:Class` or a dotted `module.Class`, built and called as in RLLaVA: a tool as
`Class(config)`, with `extract_tool_call(turn_text) -> call or None` and `execute(call) -> (result_text, success)`; an
environment once per episode as `Class(config=config)`, with `reset(sample)` (its `rllava.data.protocol.Sample`),
`extract_action(turn_text) -> action or None`, `step(action) -> (observation, reward, done, info)` and `close()`."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from omegaconf import OmegaConf
from PIL import Image

from rllava.agent.tools import AgentState, Observation, ToolEnv, answer_of
from rllava.data.protocol import Sample
from rllava.errors import ConfigError

# RLLaVA's own tool and environment classes, and what runs their job in rllava
SEARCH = ("rollout.agent.tools=[search] over a local corpus (rollout.agent.tool_kwargs.search.corpus=...; web search "
          "APIs need the internet)")
CODE = "rollout.agent.tools=[code] (the sandboxed code tool; limits: rollout.agent.tool_kwargs.code.*)"
ZOOM = "rollout.agent.tools=[zoom]"
RLLAVA_CLASSES = {"VisualCropTool": ZOOM, "WebSearchTool": SEARCH, "CodeExecuteTool": CODE, "AgentSearchEnv": SEARCH,
                  "AgentCodeEnv": CODE, "DeepEyesEnv": ZOOM}
BY_WORD = (("search", SEARCH), ("code", CODE), ("crop", ZOOM), ("zoom", ZOOM))  # another class, by its name


def load_class(spec: Any, key: str) -> type:
    """`path/to/file.py:Class` or `package.module.Class`."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"{key}: class_name must be 'path/to/file.py:Class' or 'module.Class', not {spec!r}")
    short = spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    if spec.startswith("rllava.ppo.") and short in RLLAVA_CLASSES:
        raise ConfigError(f"{key}: {spec} is RLLaVA's own class; in rllava use {RLLAVA_CLASSES[short]}")
    try:
        if ":" in spec:
            path, name = spec.rsplit(":", 1)
            if not os.path.isfile(path):
                raise ConfigError(f"{key}: file {path!r} (class_name {spec}) does not exist")
            module_name = f"rllava_class_{abs(hash(os.path.abspath(path)))}"
            module = sys.modules.get(module_name)
            if module is None:
                file_spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(file_spec)
                file_spec.loader.exec_module(module)
                sys.modules[module_name] = module
        else:
            module_name, name = spec.rsplit(".", 1) if "." in spec else ("", spec)
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as e:
        missing = (e.name or "") if isinstance(e, ModuleNotFoundError) else ""
        if missing.startswith("rllava.") and missing.split(".")[1] in ("ppo", "eval", "workflow"):
            use = RLLAVA_CLASSES.get(short) or next((v for k, v in BY_WORD if k in spec.lower()),
                "a tool of your own registered with @register_tool (rollout.agent.plugins; docs/agents.md)")
            raise ConfigError(f"{key}: {spec} is written against RLLaVA's internals ({missing}), which rllava does "
                              f"not have; in rllava use {use}") from e
        raise ConfigError(f"{key}: importing {spec} failed: {type(e).__name__}: {e}") from e
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{key}: {spec} names no class")
    return cls


def _entries(path: str, key: str, section: str) -> list[tuple[type, dict, str]]:
    """(class, config, where) of each `class_name`/`config` entry of the file's `section`."""
    if not os.path.isfile(path):
        raise ConfigError(f"{key}: file {path!r} does not exist")
    try:
        doc = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:
        raise ConfigError(f"{key}: {path} is not valid YAML: {e}") from e
    entries = doc.get(section) if isinstance(doc, dict) else None
    if section == "env" and isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        form = ("env: {class_name: ..., config: {...}}" if section == "env" else
                "tools: [{class_name: ..., config: {...}}]")
        raise ConfigError(f"{key}: {path} must hold {form}")
    out = []
    for i, entry in enumerate(entries):
        where = f"{key}: {path} {section}" + (f"[{i}]" if section == "tools" else "")
        if not isinstance(entry, dict) or not isinstance(entry.get("config", {}), dict):
            raise ConfigError(f"{where} must be {{class_name: ..., config: {{...}}}}")
        out.append((load_class(entry.get("class_name"), where), dict(entry.get("config") or {}), where))
    return out


def _observation(obs: Any, reward: float = 0.0, done: bool = False) -> Observation:
    """An RLLaVA observation (text, PIL image, or {"text", "image"} dict) as rllava's."""
    if isinstance(obs, Observation):
        return obs
    if obs is None or isinstance(obs, (str, Image.Image)):  # text or an image alone: the dict form's one entry
        obs = {"text": obs} if isinstance(obs, str) else {"image": obs}
    if not isinstance(obs, dict):
        raise TypeError(f"an observation is a string, a PIL image or a dict with text/image, not {type(obs).__name__}")
    images = obs.get("image", obs.get("images")) or []
    images = images if isinstance(images, (list, tuple)) else [images]
    if not all(isinstance(im, Image.Image) for im in images):
        raise TypeError("an observation's image must be a PIL image")
    return Observation(text=str(obs.get("text", "")), images=list(images), reward=reward, done=done)


class ClassToolsEnv(ToolEnv):
    """`rollout.tool_config_path`: tool objects that find their own calls in a turn (the first that does runs)."""

    def __init__(self, path: str, *, answer_tag: str = "answer", invalid_call_penalty: float = 0.0):
        tools = []
        for cls, config, where in _entries(path, "rollout.tool_config_path", "tools"):
            for method in ("extract_tool_call", "execute"):
                if not callable(getattr(cls, method, None)):
                    raise ConfigError(f"{where}: {cls.__name__} has no {method}() (a tool has extract_tool_call "
                                      "and execute)")
            try:
                tools.append(cls(config))
            except Exception as e:
                raise ConfigError(f"{where}: {cls.__name__}({config}) failed: {type(e).__name__}: {e}") from e
        super().__init__({type(t).__name__: t for t in tools}, answer_tag=answer_tag,
                         invalid_call_penalty=invalid_call_penalty)

    def step(self, state: AgentState, text: str) -> Observation:
        if answer_of(text, self.answer_tag) is not None:
            return Observation(done=True)
        for name, tool in self.tools.items():
            call = None
            try:
                call = tool.extract_tool_call(text)
                if call is None:
                    continue
                state.calls.append((name, call))
                result = tool.execute(call)
                out, ok = result if isinstance(result, tuple) and len(result) == 2 else (result, True)
                obs = _observation(out)
            except Exception as e:  # the model's text reached a tool that could not take it: it reads why
                return self._raised(state, name, call, e)
            self.worked.add(name)
            return obs if ok else self._error(state, obs.text or f"{name} failed")
        return Observation(done=True)


class ClassEnv(ToolEnv):
    """`rollout.env_config_path`: one environment object per episode, kept in the episode's state."""

    def __init__(self, path: str, *, answer_tag: str = "answer", invalid_call_penalty: float = 0.0):
        ((cls, config, where),) = _entries(path, "rollout.env_config_path", "env")
        for method in ("reset", "extract_action", "step"):
            if not callable(getattr(cls, method, None)):
                raise ConfigError(f"{where}: {cls.__name__} has no {method}() (an environment has reset, "
                                  "extract_action and step)")
        self.cls, self.config, self.where = cls, config, where
        super().__init__({}, answer_tag=answer_tag, invalid_call_penalty=invalid_call_penalty)

    def reset(self, sample: Sample, model_sizes=None) -> AgentState:
        state = super().reset(sample, model_sizes)
        try:
            env = self.cls(config=dict(self.config))
            env.reset(sample)
        except Exception as e:
            raise ConfigError(f"{self.where}: {self.cls.__name__} failed to start an episode of {sample.where}: "
                              f"{type(e).__name__}: {e}") from e
        state.memory["env"] = env
        return state

    def step(self, state: AgentState, text: str) -> Observation:
        if answer_of(text, self.answer_tag) is not None:
            return Observation(done=True)
        env, name, action = state.memory["env"], self.cls.__name__, None
        try:
            action = env.extract_action(text)
            if action is None:
                return Observation(done=True)
            state.calls.append((name, action))
            obs, reward, done, _info = env.step(action)
            obs = _observation(obs, float(reward or 0.0), bool(done))
        except Exception as e:  # the model's action broke the environment: it reads why, the step goes on
            return self._raised(state, name, action, e)
        self.worked.add(name)
        return obs

    def step_reward(self, obs: Observation) -> float:
        """The environment's own step reward, as RLLaVA sums it into `step_reward` (0 where its step raised)."""
        return 0.0 if obs.error else obs.reward

    def close(self, state: AgentState) -> None:
        close = getattr(state.memory.pop("env", None), "close", None)
        if close is not None:
            close()
