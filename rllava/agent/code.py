"""The `code` tool: the agent's Python runs in the sandbox (`rllava.agent.sandbox`) on the images shown so far.

    rollout.agent.tools=[code] rollout.agent.tool_kwargs.code.wall_s=10 (every field of sandbox.Limits)
    rollout.agent.tool_kwargs.code.allow_weaker=true  (run where the full jail cannot be made: warned, not isolated)

What the snippet prints and the images it saves are the observation; a failure (an exception, a limit) is an error
observation. `state.memory["code"]` counts the calls and those that ran cleanly (`ran`)."""

from __future__ import annotations

from dataclasses import fields

from rllava.agent.sandbox import Limits, check, run_code
from rllava.agent.tools import AgentState, Observation, ToolError, register_tool
from rllava.config import ConfigError


@register_tool("code")
class Code:
    def __init__(self, allow_weaker: bool = False, **limits):
        known = {f.name for f in fields(Limits)}
        unknown = sorted(set(limits) - known)
        if unknown:
            raise ConfigError(f"rollout.agent.tool_kwargs.code.{unknown[0]}: not a sandbox limit (limits: "
                              f"{', '.join(sorted(known))}; and allow_weaker)")
        if not isinstance(allow_weaker, bool):
            raise ConfigError(f"rollout.agent.tool_kwargs.code.allow_weaker={allow_weaker!r} must be true or false")
        try:
            self.limits = Limits(**{k: type(getattr(Limits, k))(v) for k, v in limits.items()})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"rollout.agent.tool_kwargs.code: {e}") from e
        bad = [k for k in known if getattr(self.limits, k) <= 0]
        if bad:
            raise ConfigError(f"rollout.agent.tool_kwargs.code.{bad[0]}={getattr(self.limits, bad[0])} must be > 0")
        self.allow_weaker = allow_weaker
        check(allow_weaker)  # fail closed, before the model loads

    def __call__(self, args, state: AgentState) -> Observation:
        code = args.get("code") if isinstance(args, dict) else args
        if not isinstance(code, str) or not code.strip():
            raise ToolError("code takes a Python snippet")
        images = state.images[-1:] + state.images[:-1]  # image.png: the last shown; image_1.png, ...: the rest in order
        result = run_code(code, images, self.limits, self.allow_weaker)
        memory = state.memory.setdefault("code", {"calls": 0, "ran": 0})
        memory["calls"] += 1
        memory["ran"] += int(result.ok)
        if not result.ok:
            raise ToolError(result.text())
        return Observation(text=result.text(), images=result.images)
