"""The `code` tool: the agent's snippet runs in the sandbox on the images shown; a failure is an error
observation; fenced blocks call it; its limits come from rollout.agent.tool_kwargs.code."""

import os

import pytest
from PIL import Image

from rllava.agent.code import Code
from rllava.agent.tools import AgentState, ToolEnv, build_tools, parse_fenced
from rllava.config import ConfigError
from rllava.data.protocol import Sample

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's full jail needs root")


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
])
def test_bad_limits_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        Code(**options)
