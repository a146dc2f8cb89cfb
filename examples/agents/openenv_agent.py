"""An OpenEnv environment driven by an agent program (docs/agents.md, "OpenEnv"):

    rllava train config=... rollout.agent.program=examples/agents/openenv_agent.py:run reward.reward_function=null

`pip install openenv-core` (0.3). The environment is an OpenEnv server of its own (`SayEnvironment`: say the
record's answer; two tries), served by OpenEnv's `create_app` with uvicorn on 127.0.0.1 (a free port, a thread of
this process, started by the first episode; no docker). Each episode opens an OpenEnv client session on it
(`SayClient`, a WebSocket), resets it with the record's answer, and alternates: the policy's reply (through
`client`, the endpoint rllava serves) as the action, the environment's observation as the next user turn, until
the environment says done. Its last reward is the episode's. Written only against `openai` and `openenv`.
"""

import socket
import threading
import time

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field


class SayAction(Action):
    message: str = Field(..., description="what the agent says")


class SayObservation(Observation):
    prompt: str = Field(default="", description="what the environment says next")


class SayEnvironment(Environment):
    """Reset with `target`: "Say X."; a step whose message has X ends with reward 1, else "No: say X." once more,
    and after the second try the episode ends with reward 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    TRIES = 2

    def __init__(self):
        super().__init__()
        self._state, self.target = State(step_count=0), ""

    def reset(self, seed=None, episode_id=None, target: str = "", **kwargs) -> SayObservation:
        self._state, self.target = State(episode_id=episode_id, step_count=0), str(target)
        return SayObservation(prompt=f"Say {self.target}.", done=False, reward=0.0)

    def step(self, action: SayAction, timeout_s=None, **kwargs) -> SayObservation:
        self._state.step_count += 1
        if self.target.lower() in action.message.lower():
            return SayObservation(prompt="Right.", done=True, reward=1.0)
        done = self._state.step_count >= self.TRIES
        return SayObservation(prompt=f"No: say {self.target}.", done=done, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class SayClient(EnvClient[SayAction, SayObservation, State]):
    def _step_payload(self, action: SayAction) -> dict:
        return {"message": action.message}

    def _parse_result(self, payload: dict) -> StepResult[SayObservation]:
        observation = SayObservation(**payload.get("observation", {}), done=payload.get("done", False),
                                     reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))


_server = {}
_lock = threading.Lock()


def server_url(sessions: int = 64) -> str:
    """The environment server's URL, started on the first call: 127.0.0.1, a free port, a daemon thread."""
    import uvicorn

    with _lock:
        if "url" not in _server:
            app = create_app(SayEnvironment, SayAction, SayObservation, env_name="say", max_concurrent_envs=sessions)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
            threading.Thread(target=server.run, daemon=True, name="openenv-say").start()
            deadline = time.monotonic() + 30
            while not server.started:
                if time.monotonic() > deadline:
                    raise RuntimeError("the OpenEnv server did not start in 30 s")
                time.sleep(0.05)
            _server["url"] = f"http://127.0.0.1:{port}"
        return _server["url"]


async def run(client, sample):
    """One episode: the environment's observations as user turns, the policy's replies as its actions."""
    async with SayClient(base_url=server_url()) as env:
        result = await env.reset(target=sample.ground_truth)
        messages = [{"role": "user", "content": result.observation.prompt}]
        while not result.done:
            reply = await client.chat.completions.create(model="policy", messages=messages)
            text = reply.choices[0].message.content or ""
            result = await env.step(SayAction(message=text))
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": result.observation.prompt}]
        return {"reward": float(result.reward or 0.0), "steps": float(len(messages) // 2)}
