"""Agents written for an OpenAI client (rllava.agent.program, rllava.agent.endpoint): the official client parses
every response, the key and the rollout gate, bad requests, batching, exact tokens, failing programs."""

import json
import os
import urllib.error
import urllib.request

import openai
import pytest
from PIL import Image

from rllava.agent.endpoint import EpisodeLog, parse_reply
from rllava.agent.program import ProgramRollout, ProgramScore
from rllava.agent.rollout import agent_metrics
from rllava.data.protocol import Sample
from rllava.engine.inference.base import Completion, SamplingParams
from rllava.model.processor import get_tokenizer, load_processor
from rllava.model.tiny import build_tiny

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs.py")
CALL = '<tool_call>\n{"name": "zoom", "arguments": {"bbox": [0, 0, 28, 28]}}\n</tool_call>'


class ScriptedEngine:
    """Writes turn k of every episode as `script[k]` (k: the assistant turns in the prompt so far), with EOS and
    log-probs -0.1 * position; records each call's request count and every completion it returned."""

    shares_train_model = True

    def __init__(self, tokenizer, script):
        self.tok, self.script, self.calls, self.sampled = tokenizer, script, [], []

    def generate(self, requests, sampling):
        self.calls.append(len(requests))
        out = []
        for r in requests:
            k = self.tok.decode(r.prompt_ids).count("<|im_start|>assistant") - 1
            choices = []
            for j in range(sampling.n):
                ids = (self.tok.encode(self.script[min(k, len(self.script) - 1)] + " " * j) +
                       [self.tok.eos_token_id])[:sampling.max_new_tokens]
                choices.append(Completion(ids, [-0.1 * (i + 1) for i in range(len(ids))], "stop"))
                self.sampled.append(ids)
            out.append(choices)
        return out


@pytest.fixture(scope="module")
def proc(tiny_model_dir):
    return load_processor(tiny_model_dir)


def _sample(i):
    image = Image.new("RGB", (56, 56), (40 * i % 255, 90, 160))
    return Sample(i, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"count {i}"}]}],
                  [image], None, source="t.jsonl")


def _rollout(proc, name, script=("<answer>2</answer>",), **kw):
    engine = ScriptedEngine(get_tokenizer(proc), list(script))
    args = dict(max_turns=4, max_context=4096, episode_timeout=60, window=60.0) | kw
    return ProgramRollout(engine, proc, f"{PROGRAMS}:{name}", **args), engine


def _seen(rollout):
    return rollout.program.__globals__["SEEN"]


# Qwen2.5's way with tools, reduced: the tools in the system turn, calls as <tool_call> JSON, results as user turns
TOOLS_TEMPLATE = (  # a newline right after a tag as an expression: HF's jinja trims it (trim_blocks)
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ '\n' + t | tojson }}{% endfor %}"
    "{{ '\n' }}</tools><|im_end|>{{ '\n' }}{% endif %}{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant{% if m.content %}{{ '\n' + m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}{{ '\n<tool_call>\n' }}{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}{{ '\n</tool_call>' }}{% endfor %}<|im_end|>{{ '\n' }}"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>"
    "{{ '\n' }}{% else %}<|im_start|>{{ m.role }}{{ '\n' }}{% if m.content is string %}{{ m.content }}{% else %}"
    "{% for p in m.content %}{% if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>{{ '\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}{% endif %}")


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_vl+tools_template"])
def test_trained_ids_are_the_sampled_ids_over_image_and_tool_turns(arch, tmp_path, tiny_model_dir):
    name = arch.split("+")[0]
    p = load_processor(tiny_model_dir if name == "qwen2_vl" else build_tiny(name, str(tmp_path / name), size="small"))
    if arch.endswith("+tools_template"):  # the template renders tools and calls itself
        p.chat_template = TOOLS_TEMPLATE
    rollout, engine = _rollout(p, "tools", ["I zoom.\n" + CALL, CALL, "<answer>2</answer>"])
    try:
        rows = rollout.generate([_sample(0), _sample(1)], SamplingParams(n=2, max_new_tokens=200))
    finally:
        rollout.close()
    assert len(rows) == 4 and [t.group_id for t in rows] == [0, 0, 1, 1]
    assert engine.calls == [4, 4, 4]  # K=2 agents x 2 prompts: one batched call per turn
    for t in rows:
        trained = [s for s in t.segments if s.trained]
        assert [s.trained for s in t.segments] == [False, True] * 3
        assert [s.token_ids for s in trained] == engine.sampled[::4]  # every episode's turn k is the same
        assert [s.logprobs for s in trained] == [[-0.1 * (i + 1) for i in range(len(s.token_ids))] for s in trained]
        assert t.agent.memory["program"] == {"reward": 1.0, "metrics": {"turns": 8.0}, "error": "", "retokenized": 0,
                                             "batching": 4.0}  # 12 requests in 3 engine calls
        assert t.mm_inputs["image_grid_thw"].shape[0] == 3  # the sample's image and two crops
        assert t.agent.calls == [("zoom", '{"bbox": [0, 0, 28, 28]}')] * 2
    assert agent_metrics(rows)["agent/requests_per_generate"] == 4.0
    r = _seen(rollout)[-1]
    assert r.choices[0].message.content == "<answer>2</answer>" and r.choices[0].finish_reason == "stop"



def test_a_history_rendered_otherwise_starts_a_new_row(tiny_model_dir):
    """A template that writes the calls' arguments otherwise than the model did (indented JSON): each later prompt
    does not extend the sampled ids, so each turn is a row of its own, its ids still the sampled ones."""
    p = load_processor(tiny_model_dir)
    p.chat_template = TOOLS_TEMPLATE.replace("arguments | tojson", "arguments | tojson(indent=1)")
    rollout, engine = _rollout(p, "tools", ["I zoom.\n" + CALL, CALL, "<answer>2</answer>"])
    try:
        rows = rollout.generate([_sample(0)], SamplingParams(n=1, max_new_tokens=200))
    finally:
        rollout.close()
    assert len(rows) == 3 and {t.group_id for t in rows} == {0}
    assert [[s.token_ids for s in t.segments if s.trained] for t in rows] == [[ids] for ids in engine.sampled]
    assert rows[0].agent.memory["program"]["retokenized"] == 2 and rows[0].response == rows[2].response


def test_a_template_that_drops_earlier_thinking_starts_a_row_where_it_did(tiny_model_dir):
    """Qwen3's way: earlier turns' <think> blocks are not rendered again. The turn after the one that thought does
    not extend its sampled ids (a new row); the turn after that extends it (the same row): 2 rows, 1 retokenized."""
    p = load_processor(tiny_model_dir)
    p.chat_template = TOOLS_TEMPLATE.replace("{{ '\n' + m.content }}", "{{ '\n' + m.content.split('</think>')[-1] }}")
    assert p.chat_template != TOOLS_TEMPLATE
    rollout, engine = _rollout(p, "tools", ["<think>where?</think>I zoom.\n" + CALL, CALL, "<answer>2</answer>"])
    try:
        rows = rollout.generate([_sample(0)], SamplingParams(n=1, max_new_tokens=200))
    finally:
        rollout.close()
    assert [[s.token_ids for s in t.segments if s.trained] for t in rows] == [engine.sampled[:1], engine.sampled[1:]]
    assert rows[0].agent.memory["program"]["retokenized"] == 1

def test_the_openai_client_parses_tool_calls_logprobs_and_n(proc):
    rollout, engine = _rollout(proc, "many", ["I zoom.\n" + CALL])
    try:
        (t, *_) = rollout.generate([_sample(0)], SamplingParams(n=1, max_new_tokens=64))
    finally:
        rollout.close()
    r = _seen(rollout)[-1]
    assert len(r.choices) == 2 and r.choices[0].message.content == "I zoom.\n"
    lp = r.choices[0].logprobs.content
    assert [x.logprob for x in lp] == [-0.1 * (i + 1) for i in range(8)]  # max_tokens=8 cuts the turn
    assert t.segments[1].token_ids == engine.sampled[0][:8] and r.usage.completion_tokens == 16


def test_parse_reply_reads_qwen_tool_calls():
    content, calls = parse_reply("I zoom.\n" + CALL)
    assert content == "I zoom." and calls[0]["function"] == {"name": "zoom", "arguments": '{"bbox": [0, 0, 28, 28]}'}
    assert parse_reply("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


class Reply:
    def __init__(self, status, body):
        self.status_code, self.body = status, body

    def json(self):
        return json.loads(self.body)


def _post(rollout, body, key=None, path="/chat/completions"):
    request = urllib.request.Request(rollout.endpoint.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {key or rollout.endpoint.key}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return Reply(r.status, r.read())
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read())


def test_the_key_the_rollout_gate_and_bad_requests(proc, tmp_path):
    rollout, engine = _rollout(proc, "never_calls")
    try:
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        r = _post(rollout, body, key="wrong")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = _post(rollout, body)  # no rollout is running
        assert r.status_code == 409 and "no rollout is running" in r.json()["error"]["message"]
        client = openai.OpenAI(base_url=rollout.endpoint.url, api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        episode = EpisodeLog("e1", "x", 4)
        rollout.endpoint.begin([episode])
        key = rollout.endpoint.client_key(episode)
        bad = [({**body, "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}, "remote_image"),
               ({**body, "messages": "hi"}, None), ({**body, "temperature": "hot"}, None),
               ({**body, "messages": [{"role": "wizard", "content": "hi"}]}, None),
               ({**body, "stream": True}, None)]
        for request, code in bad:
            r = _post(rollout, request, key=key)
            err = r.json()["error"]
            assert r.status_code == 400 and set(err) == {"message", "type", "param", "code"}, request
            assert err["type"] == "invalid_request_error" and (code is None or err["code"] == code)
        assert _post(rollout, {**body, "model": "gpt-4o"}, key=key).status_code == 404
        assert "gpt-4o" in episode.error
        models = openai.OpenAI(base_url=rollout.endpoint.url, api_key=key, max_retries=0).models.list()
        assert [m.id for m in models.data] == ["policy"]
        rollout.endpoint.end()
        assert _post(rollout, body, key=key).status_code == 409
    finally:
        rollout.close()
    assert engine.calls == []


@pytest.mark.parametrize("name, reason", [("raises", "raised KeyError: 'the environment broke'"),
                                          ("hangs", "ran past rollout.agent.episode_timeout=1s"),
                                          ("never_calls", "returned without calling the endpoint"),
                                          ("wrong_model", "asked for model 'gpt-4o'")])
def test_a_failing_program_scores_0_with_one_warning(proc, caplog, name, reason):
    rollout, _ = _rollout(proc, name, episode_timeout=1)
    try:
        (t,) = rollout.generate([_sample(3)], SamplingParams(n=1, max_new_tokens=16))
    finally:
        rollout.close()
    info = t.agent.memory["program"]
    assert reason in info["error"]
    warnings = [r.getMessage() for r in caplog.records if "rollout.agent.program" in r.getMessage()]
    assert len(warnings) == 1 and "t.jsonl record 3" in warnings[0] and reason in warnings[0]
    scores, details = ProgramScore(None).score([t])
    assert scores.tolist() == [0.0] and details[0]["program_failed"] == 1.0


def test_strict_makes_a_failing_program_an_error(proc):
    rollout, _ = _rollout(proc, "raises", strict=True)
    try:
        with pytest.raises(Exception, match="record 3 raised KeyError.*reward.strict=true"):
            rollout.generate([_sample(3)], SamplingParams(n=1, max_new_tokens=16))
    finally:
        rollout.close()


def test_two_grpo_steps_with_the_example_openai_agent(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    from rllava.train.pipeline import rlvr
    from rllava.train.outputs import keys_for

    out = str(tmp_path / "run")
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
               f"data.train_files={counting_dir}/train.jsonl", f"data.val_files={counting_dir}/val.jsonl",
               "data.max_samples=16", "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4",
               "data.max_prompt_length=1024", "data.max_response_length=24", "rollout.max_turns=3", *keys_for(out),
               "trainer.logger=[jsonl]",
               f"rollout.agent.program={os.path.dirname(HERE)}/../examples/agents/openai_agent.py:run",
               f"reward.reward_function={distinct_reward}", "trainer.val_before_train=false", "trainer.val_freq=-1",
               "trainer.max_steps=2"])
    rows = [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]
    assert len(rows) == 2 and all(r["agent/program_failures"] == 0.0 for r in rows)
    assert all(r["agent/turns_mean"] >= 1 for r in rows)


def test_a_program_that_is_not_there_is_a_start_up_error(tmp_path):
    from rllava.config import ConfigError, load_config
    from rllava.train import builders as B

    base = ["config=examples/tasks/counting/tiny_cpu.yaml"]
    with pytest.raises(ConfigError, match="rollout.agent.program='nope.py:run': file 'nope.py' does not exist"):
        load_config(base + ["rollout.agent.program=nope.py:run"])
    with pytest.raises(ConfigError, match="rollout.agent.tool_format=json is read only by rllava.s tools"):
        load_config(base + [f"rollout.agent.program={PROGRAMS}:tools", "rollout.agent.tool_format=json"])
    cfg = load_config(base + [f"rollout.agent.program={PROGRAMS}:missing"])
    with pytest.raises(Exception, match=r"rollout.agent.program=.*has no function 'missing' \(callables there: .*tools"):
        B.build_agent_env(cfg)
