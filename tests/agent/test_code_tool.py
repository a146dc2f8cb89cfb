"""The `code` tool: the agent's snippet runs in the sandbox on the images shown; a failure is an error
observation; fenced blocks call it; its limits come from rollout.agent.tool_kwargs.code."""

import os

import pytest
from PIL import Image

from rllava.agent.code import Code
from rllava.agent.sandbox import check
from rllava.agent.tools import AgentState, ToolEnv, build_tools, parse_fenced
from rllava.config import ConfigError
from rllava.data.protocol import Sample



@pytest.fixture(autouse=True)
def jail(request):
    """Skip where the sandbox's jail cannot be made here (the reason is its start-up error); the config
    errors need none."""
    if "bad_limits" not in request.node.name:
        try:
            check()
        except ConfigError as e:
            pytest.skip(str(e))


def _state(*images):
    return AgentState(Sample(0, [], list(images), None), images=list(images))


def test_the_snippet_sees_the_last_image_and_returns_what_it_saved():
    first, last = Image.new("RGB", (30, 10), "red"), Image.new("RGB", (12, 40), "blue")
    env = ToolEnv(build_tools(["code"], {"code": {"wall_s": 5}}))
    state = _state(first, last)
    obs = env.step(state, "<code>from PIL import Image\nim = Image.open('image.png')\n"
                          "print(im.size, Image.open('image_1.png').size)\n"
                          "im.transpose(Image.Transpose.ROTATE_90).save('r.png')</code>")
    assert not obs.error and "(12, 40) (30, 10)" in obs.text and [im.size for im in obs.images] == [(40, 12)]
    assert obs.images[0].getpixel((0, 0)) == (0, 0, 255)
    assert state.memory["code"] == {"calls": 1, "ran": 1}


def test_a_failing_snippet_is_an_error_observation_and_counted():
    env = ToolEnv(build_tools(["code"], {}), invalid_call_penalty=-0.5)
    state = _state(Image.new("RGB", (8, 8)))
    obs = env.step(state, "<code>print('before')\n1 / 0</code>")
    assert obs.error and obs.reward == -0.5 and "ZeroDivisionError" in obs.text and "before" in obs.text
    obs = env.step(state, "<code>   </code>")
    assert obs.error and "takes a Python snippet" in obs.text
    assert state.memory["code"] == {"calls": 1, "ran": 0} and state.failed_calls == 2


def test_fenced_blocks_call_code_and_tags_still_work():
    assert parse_fenced("look:\n```python\nprint(1)\n```\nthen", ["code", "zoom"]) == ("code", "print(1)\n")
    assert parse_fenced("<zoom>[1, 2, 3, 4]</zoom>", ["code", "zoom"]) == ("zoom", "[1, 2, 3, 4]")
    assert parse_fenced("```python\nprint(1)\n```", ["zoom"]) is None  # no code tool: a block is plain text
    obs = ToolEnv(build_tools(["code"], {}), tool_format="fenced").step(_state(), "```python\nprint(6 * 7)\n```")
    assert obs.text.strip() == "42"


@pytest.mark.parametrize("options, message", [
    ({"wall": 3}, "tool_kwargs.code.wall: not a sandbox limit"),
    ({"cpu_s": 0}, "tool_kwargs.code.cpu_s=0 must be > 0"),
    ({"memory_mb": "lots"}, "rollout.agent.tool_kwargs.code:"),
    ({"allow_weaker": "yes"}, "tool_kwargs.code.allow_weaker='yes' must be true or false"),
])
def test_bad_limits_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        Code(**options)


def _agent_code_reward():
    import importlib.util

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("agent_code_f1", os.path.join(repo, "examples", "reward_function",
                                                                                "agent_code_f1.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_agent_code_records_are_restored_by_the_experts_snippet(tmp_path):
    """Every degradation of the synthetic agent_code set is undone by its expert's snippet run through the code
    tool: the black bar comes back to the top and the upper half holds the answer's colour."""
    import json
    import re

    import numpy as np

    from rllava.data.synthetic import COLORS, make_dataset

    paths = make_dataset("agent_code", str(tmp_path / "d"), n_train=30, n_val=10)
    rows = {s: [json.loads(line) for line in open(paths[s])] for s in ("train", "val")}
    assert {r["op"] for r in rows["train"] + rows["val"]} == {"rotate90", "rotate180", "rotate270", "flip", "dark"}
    guesses = [r for r in rows["train"] if len(r["turns"]) == 1]
    assert 0 < len(guesses) < 15 and all(len(r["turns"]) == 2 for r in rows["val"])
    env = ToolEnv(build_tools(["code"], {}))
    root = os.path.dirname(paths["train"])
    for r in [r for r in rows["train"] + rows["val"] if r not in guesses]:
        state = _state(Image.open(os.path.join(root, r["images"][0])).convert("RGB"))
        assert r["turns"][1] == f"<answer> {r['answer']}</answer>"
        obs = env.step(state, r["turns"][0])
        assert not obs.error and len(obs.images) == 1, obs.text
        fixed = np.asarray(obs.images[0]).astype(int)
        size = fixed.shape[0]
        assert fixed[:size // 20].max() < 60, r["op"]  # the bar is at the top again
        upper = fixed[size // 10:size // 2].reshape(-1, 3)
        near = np.abs(upper - np.array(COLORS[r["answer"]])).sum(-1) < 40  # brightened 5x: within rounding
        assert near.sum() > 50, (r["op"], r["answer"])
    assert all(re.fullmatch(r"<answer> \w+</answer>", r["turns"][0]) for r in guesses)


def test_agent_code_reward_by_hand():
    r = _agent_code_reward()
    s = r.score_one("<code>x</code>\n<answer> red</answer>", "red", tool_calls=[("code", "x")],
                    tool_memory={"code": {"calls": 1, "ran": 1}})
    assert s == {"overall": pytest.approx(1.0), "f1": 1.0, "format": 1.0, "ran": 1.0, "coded": 1.0, "accuracy": 1.0}
    failed = r.score_one("<code>x</code>\n<code>y</code>\n<answer> blue</answer>", "red",
                         tool_calls=[("code", "x"), ("code", "y")], tool_memory={"code": {"calls": 2, "ran": 1}})
    assert failed["overall"] == pytest.approx(0.1 + 0.05) and failed["ran"] == 0.5 and failed["accuracy"] == 0.0
    guess = r.score_one("<answer> red</answer>", "red")
    assert guess["overall"] == pytest.approx(0.9) and guess["coded"] == 0.0 and guess["ran"] == 0.0
