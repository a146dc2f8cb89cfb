"""RLLaVA's tool and environment class files (rollout.tool_config_path, rollout.env_config_path): the classes a
user's RLLaVA agent script names, run by rllava's AgentRollout."""

import pytest
from PIL import Image

from rllava.agent.classes import ClassEnv, ClassToolsEnv
from rllava.config import ConfigError, load_config
from rllava.data.protocol import Sample

USER_CLASSES = '''
import re
from PIL import Image

CLOSED = []


class Calculator:  # an RLLaVA tool: extract_tool_call / execute -> (text, success)
    def __init__(self, config):
        self.digits = config.get("digits", 2)

    def extract_tool_call(self, content):
        m = re.search(r"<calc>(.*?)</calc>", content)
        return m.group(1) if m else None

    def execute(self, expr):
        if expr == "boom":
            raise RuntimeError("overflow")
        if not re.fullmatch(r"[0-9+*/ -]+", expr):
            return f"cannot evaluate {expr!r}", False
        return f"{eval(expr):.{self.digits}f}", True


class CropEnv:  # an RLLaVA environment: built per episode, reset(sample), extract_action, step, close
    def __init__(self, config):
        self.side, self.steps = config["side"], 0

    def reset(self, data):
        self.image, self.answer = data.images[0], data.ground_truth

    def extract_action(self, content):
        m = re.search(r"<crop>(.*?)</crop>", content)
        return m.group(1) if m else None

    def step(self, action):
        self.steps += 1
        if action == "bad":
            raise ValueError("no such region")
        crop = self.image.crop((0, 0, self.side, self.side))
        return {"text": f"crop {self.steps} of {self.answer}", "image": crop}, 0.5, self.steps >= 2, {}

    def close(self):
        CLOSED.append(self.steps)


class NoStep:
    def __init__(self, config):
        pass

    def reset(self, data):
        pass

    def extract_action(self, content):
        return content
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_agent.py"
    path.write_text(USER_CLASSES)
    return path


def _yaml(tmp_path, text):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return str(path)


def _sample():
    return Sample(3, [], [Image.new("RGB", (64, 48), "red")], "seven", source="train.jsonl")


def test_tool_classes_find_and_run_their_calls(tmp_path, user_file):
    env = ClassToolsEnv(_yaml(tmp_path, f"tools:\n  - class_name: {user_file}:Calculator\n    config: {{digits: 1}}\n"),
                        invalid_call_penalty=-0.2)
    state = env.reset(_sample())
    obs = env.step(state, "let me compute <calc>6 * 7</calc>")
    assert (obs.text, obs.reward, obs.error, obs.done) == ("42.0", 0.0, False, False)
    bad = env.step(state, "<calc>import os</calc>")  # success false: an error observation with the penalty
    assert (bad.text, bad.reward, bad.error) == ("Error: cannot evaluate 'import os'", -0.2, True)
    crash = env.step(state, "<calc>boom</calc>")  # the tool raised: the model reads why, the run goes on
    assert crash.text == "Error: Calculator failed: RuntimeError: overflow" and crash.reward == -0.2
    assert state.calls == [("Calculator", "6 * 7"), ("Calculator", "import os"), ("Calculator", "boom")]
    assert state.failed_calls == 2
    assert env.step(state, "<answer>42</answer><calc>1+1</calc>").done  # the answer ends the episode
    assert env.step(state, "no call at all").done


def test_an_environment_per_episode_with_image_observations(tmp_path, user_file):
    env = ClassEnv(_yaml(tmp_path, f"env:\n  class_name: {user_file}:CropEnv\n  config: {{side: 30}}\n"),
                   invalid_call_penalty=-0.1)
    a, b = env.reset(_sample()), env.reset(_sample())
    assert a.memory["env"] is not b.memory["env"]  # one environment object per episode
    obs = env.step(a, "<crop>top left</crop>")
    assert obs.text == "crop 1 of seven" and obs.reward == 0.5 and not obs.done
    assert [im.size for im in obs.images] == [(30, 30)] and obs.images[0].getpixel((0, 0)) == (255, 0, 0)
    bad = env.step(b, "<crop>bad</crop>")
    assert bad.text == "Error: CropEnv failed: ValueError: no such region"
    assert (env.step_reward(obs), env.step_reward(bad)) == (0.5, 0.0)  # RLLaVA's step_reward: the env's rewards
    assert env.step(a, "<crop>again</crop>").done  # the environment's done ends the episode
    assert env.step(b, "<answer>seven</answer>").done and env.step(b, "nothing to do").done
    import sys

    closed = next(m for m in sys.modules.values() if getattr(m, "CropEnv", None) is env.cls).CLOSED
    env.close(a), env.close(b)
    assert closed[-2:] == [2, 1] and "env" not in a.memory  # each episode's environment released at its end


@pytest.mark.parametrize("text, message", [
    ("tools:\n  - class_name: rllava.ppo.tool.visual_crop_tool.VisualCropTool\n",
     "rollout.tool_config_path: {yaml} tools[0]: rllava.ppo.tool.visual_crop_tool.VisualCropTool is RLLaVA's own "
     "class; in rllava use rollout.agent.tools=[zoom]"),
    ("tools:\n  - class_name: rllava.ppo.tool.web_search_tool.WebSearchTool\n",
     "WebSearchTool is RLLaVA's own class; in rllava use rollout.agent.tools=[search] over a local corpus"),
    ("tools:\n  - class_name: {file}:Missing\n", "tools[0]: {file}:Missing names no class"),
    ("tools:\n  - class_name: /nowhere/tools.py:Calc\n", "file '/nowhere/tools.py' (class_name /nowhere/tools.py:Calc) "
                                                          "does not exist"),
    ("tools:\n  - class_name: {file}:CropEnv\n", "CropEnv has no extract_tool_call()"),
    ("tools:\n  - class_name: {file}:Calculator\n    config: [1, 2]\n", "tools[0] must be {{class_name: ..., config"),
    ("env:\n  class_name: {file}:Calculator\n", "tools: [{{class_name"),
    ("tools: [\n", "is not valid YAML"),
])
def test_tool_file_errors(tmp_path, user_file, text, message):
    path = _yaml(tmp_path, text.format(file=user_file))
    with pytest.raises(ConfigError) as e:
        ClassToolsEnv(path)
    assert message.format(yaml=path, file=user_file) in str(e.value)


RLLAVA_SEARCH_ENV = """from rllava.ppo.env.base import BaseEnv
from rllava.eval.agent_search.tools.web_search import web_search_BOCHA_API


class AgentSearchEnv(BaseEnv):
    pass
"""


def test_rllavas_own_environment_files_name_rllavas_equivalent(tmp_path):
    """RLLaVA's agent_search_env.py (its first lines, as in its repository) imports RLLaVA's internals and a web
    search API: the error names the search tool over a local corpus, as docs/agents.md says."""
    env_file = tmp_path / "agent_search_env.py"
    env_file.write_text(RLLAVA_SEARCH_ENV)
    path = _yaml(tmp_path, f"env:\n  class_name: \"{env_file}:AgentSearchEnv\"\n  config:\n    backend: bocha\n")
    with pytest.raises(ConfigError) as e:
        ClassEnv(path)
    assert f"{env_file}:AgentSearchEnv is written against RLLaVA's internals (rllava.ppo), which rllava does not " \
           "have; in rllava use rollout.agent.tools=[search] over a local corpus" in str(e.value)
    code_env = tmp_path / "my_code_env.py"
    code_env.write_text("import rllava.workflow.context\n")
    with pytest.raises(ConfigError, match=r"in rllava use rollout.agent.tools=\[code\] \(the sandboxed code tool"):
        ClassEnv(_yaml(tmp_path, f"env:\n  class_name: {code_env}:Whatever\n"))


def test_environment_file_errors(tmp_path, user_file):
    with pytest.raises(ConfigError, match=r"NoStep has no step\(\) \(an environment has reset, extract_action"):
        ClassEnv(_yaml(tmp_path, f"env:\n  class_name: {user_file}:NoStep\n"))
    env = ClassEnv(_yaml(tmp_path, f"env:\n  class_name: {user_file}:CropEnv\n  config: {{}}\n"))
    with pytest.raises(ConfigError, match="CropEnv failed to start an episode of train.jsonl record 3: KeyError"):
        env.reset(_sample())


@pytest.mark.parametrize("args, message", [
    (["rollout.agent.tools=[zoom]", "rollout.env_config_path=env.yaml"],
     "rollout.agent.tools and rollout.env_config_path both pick the agent's tools: set one"),
    (["rollout.tool_config_path=t.yaml", "rollout.agent.tool_format=json"],
     "rollout.agent.tool_format=json is read only by registered tools (rollout.agent.tools), not by "
     "rollout.tool_config_path's classes"),
])
def test_class_file_config_errors(args, message):
    with pytest.raises(ConfigError) as e:
        load_config(["config=examples/config.yaml", *args])
    assert message in str(e.value)


@pytest.mark.parametrize("key", ["rollout.tool_config_path", "rollout.env_config_path"])
def test_class_files_reach_the_driver(tmp_path, user_file, tiny_model_dir, key):
    import torch

    from rllava.model.processor import load_processor
    from rllava.train import builders as B

    text = (f"tools:\n  - class_name: {user_file}:Calculator\n" if key == "rollout.tool_config_path" else
            f"env:\n  class_name: {user_file}:CropEnv\n  config: {{side: 8}}\n")
    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
                       f"{key}={_yaml(tmp_path, text)}", "rollout.max_turns=4",
                       "rollout.agent.invalid_call_penalty=-0.3"])
    rollout = B.build_rollout(cfg, load_processor(tiny_model_dir), torch.device("cpu"))
    assert rollout.max_turns == 4  # the agent driver, though rollout.agent.tools is empty
    state = rollout.env.reset(_sample())
    assert rollout.env.step(state, "<calc>boom</calc><crop>bad</crop>").reward == -0.3
