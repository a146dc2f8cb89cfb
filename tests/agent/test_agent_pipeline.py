"""Agent rollouts inside the RLVR pipeline: a 2-step run with image observations, exact resume, the
agentic entry point, a user's tool file, and config errors."""

import json
import os
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from rllava.agent import tools as T
from rllava.config import ConfigError, load_config
from rllava.engine.inference import base
from rllava.engine.inference.base import Completion
from rllava.train import builders as B
from rllava.train.pipeline import agentic, rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


class ShortTurns:
    """The real HF engine, each turn cut at 6 tokens and closed with EOS: a random tiny model rarely ends a turn."""

    def __init__(self, engine, eos: int):
        self.engine, self.eos, self.shares_train_model = engine, eos, engine.shares_train_model

    def load(self, model):
        self.engine.load(model)

    def offload(self):
        self.engine.offload()

    def generate(self, requests, sampling):
        out = self.engine.generate(requests, replace(sampling, max_new_tokens=min(6, sampling.max_new_tokens)))
        return [[Completion([t for t in c.token_ids if t != self.eos] + [self.eos], [*c.logprobs[:len(
            [t for t in c.token_ids if t != self.eos])], 0.0], "stop") for c in cs] for cs in out]


@pytest.fixture
def short_turns(monkeypatch):
    """Every turn of the random tiny model a complete one (6 tokens and EOS)."""
    build = base.build_rollout_engine
    monkeypatch.setattr(base, "build_rollout_engine", lambda cfg, pad, stop, *a, **kw: ShortTurns(
        build(cfg, pad, stop, *a, **kw), stop[0]))


@pytest.fixture
def always_zoom(monkeypatch, short_turns):
    """... each read as `<zoom>[0, 0, 40, 40]</zoom>`."""
    monkeypatch.setitem(T.PARSERS, "tags", lambda text, names: ("zoom", "[0, 0, 40, 40]"))


def _args(model, data, out, reward, *extra):
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", "data.max_samples=16",
            "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.max_response_length=64",
            "rollout.agent.tools=[zoom]", "rollout.max_turns=3", *keys_for(out),
            "trainer.logger=[jsonl]", f"reward.reward_function={reward}", "trainer.val_before_train=false",
            "trainer.val_freq=-1", *extra]


def _rows(out):
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]


@pytest.mark.parametrize("credit", [[], ["algorithm.adv_estimator=gigpo", "rollout.discount=0.9",
                                         "algorithm.step_advantage_w=0.5", "rollout.agent.invalid_call_penalty=-0.1"]],
                         ids=["grpo", "gigpo"])
def test_two_agentic_steps_with_image_observations(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                   always_zoom, credit):
    out = str(tmp_path / "run")
    agentic.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=2", *credit))
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["agent/turns_mean"] > 1 and r["agent/returned_images_mean"] > 0 and r["agent/tool_calls_mean"] > 0
    before, after = load_file(f"{tiny_model_dir}/model.safetensors"), load_file(f"{out}/final/model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_distillation_on_agent_turns_with_image_observations(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                            always_zoom):
    """algorithm.distill on multi-turn episodes whose tools show crops: the teacher reads the whole episode, crops
    included (the student as its own teacher, one optimizer step per step: a KL of exactly 0), and scores the
    model's turns only
    (tests/train/test_distill.py::test_observation_tokens_get_no_kl)."""
    out = str(tmp_path / "run")
    agentic.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=1",
                       "actor.ppo_mini_batch_size=4", f"algorithm.distill.teacher_path={tiny_model_dir}"))
    (row,) = _rows(out)
    assert row["agent/returned_images_mean"] > 0 and abs(row["distill/reverse_kl"]) < 1e-5


def test_agentic_run_resumes_exactly(tiny_model_dir, counting_dir, distinct_reward, always_zoom, straight_and_resumed):
    args = _args(tiny_model_dir, counting_dir, "unused", distinct_reward, "trainer.max_steps=3", "trainer.save_freq=1")
    straight, stopped = straight_and_resumed(2, args)
    a, b = load_file(f"{straight}/final/model.safetensors"), load_file(f"{stopped}/final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["agent/turns_mean"] for r in _rows(stopped)] == [r["agent/turns_mean"] for r in _rows(straight)]


def test_two_agentic_steps_with_rllavas_environment_file(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                         short_turns):
    """A user's RLLaVA script: `rollout.env_config_path` naming an environment class that acts on every turn and
    shows a crop of the image, ending the episode at its second step."""
    (tmp_path / "crop_env.py").write_text(
        "class CropEnv:\n    def __init__(self, config):\n        self.side, self.steps = config['side'], 0\n"
        "    def reset(self, data):\n        self.image = data.images[0]\n"
        "    def extract_action(self, content):\n        return content\n"
        "    def step(self, action):\n        self.steps += 1\n"
        "        return {'image': self.image.crop((0, 0, self.side, self.side))}, 0.0, self.steps == 2, {}\n")
    (tmp_path / "env.yaml").write_text(f"env:\n  class_name: {tmp_path}/crop_env.py:CropEnv\n  config:\n    side: 40\n")
    out = str(tmp_path / "run")
    agentic.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=2",
                       "rollout.agent.tools=[]", f"rollout.env_config_path={tmp_path}/env.yaml"))
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # 2 turns (of max_turns 3: the environment's second step is done), its first image between them
        assert r["agent/turns_mean"] == 2 and r["agent/returned_images_mean"] == 1 and r["agent/tool_calls_mean"] == 2


def test_agent_samples_show_each_turn_its_call_and_what_it_was_shown(tmp_path, tiny_model_dir, counting_dir,
                                                                    distinct_reward, always_zoom):
    """samples.jsonl of an agent run (a short run: its first and last step) holds each turn's text, the call it
    made, the observation's text and the images it showed (indices among the episode's: the record's is 0)."""
    out = str(tmp_path / "run")
    agentic.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=2"))
    samples = [json.loads(line) for line in open(os.path.join(out, "samples.jsonl"))]
    assert sorted({s["step"] for s in samples}) == [1, 2]  # samples_freq=10: the first and the last step
    for s in samples:
        first = s["turns"][0]
        assert first["call"] == ["zoom", "[0, 0, 40, 40]"] and first["images"] == [1] and first["error"] is False
        assert first["turn"] and len(s["turns"]) >= 2 and s["turns"][-1].get("observation") is None


def test_a_tool_from_a_users_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text("from rllava.agent.tools import Observation, register_tool\n\n"
                    "@register_tool('shout')\nclass Shout:\n"
                    "    def __init__(self, times: int = 2):\n        self.times = times\n"
                    "    def __call__(self, args, state):\n        return Observation(text=args.upper() * self.times)\n")
    from rllava.algorithms.ppo import load_plugins

    load_plugins([str(path)], key="rollout.agent.plugins")
    tools = T.build_tools(["shout"], {"shout": {"times": 3}})
    assert T.ToolEnv(tools).step(T.AgentState(None), "<shout>hi</shout>").text == "HIHIHI"
    with pytest.raises(ConfigError, match=r"rollout.agent.tool_kwargs.shout: .*loud"):
        T.build_tools(["shout"], {"shout": {"loud": True}})
    with pytest.raises(ConfigError, match="rollout.agent.tools: 'shot' not registered"):
        T.build_tools(["shot"], {})
    with pytest.raises(ConfigError, match="rollout.agent.tool_kwargs.zoom: the zoom tool takes no options"):
        T.build_tools(["zoom"], {"zoom": {"x": 1}})


def test_the_docs_custom_tool_runs_as_copied_and_a_raising_tool_is_named(tmp_path, caplog):
    """docs/agents.md's `my_tools.py` as written (issue 62 item 8: it lacked `import json`, and the NameError of
    its __init__ was a traceback): it builds from tool_kwargs and answers; without the import, building it is one
    line naming the tool and the line. A tool raising on its calls: the model reads the error each time (as verl's
    tool_agent_loop.py L431-435 and verifiers' envs/tool_env.py L66-69 return it), the user reads one warning line
    naming the tool, the call and the line, and the BROKEN_AFTER-th call of a tool that never ran stops the run."""
    import re

    from rllava.algorithms.ppo import load_plugins
    from rllava.errors import RllavaError

    (snippet,) = re.findall(r"```python\n(# my_tools.py.*?)```", open(os.path.join(REPO, "docs", "agents.md")).read(),
                            re.DOTALL)
    (tmp_path / "my_tools.py").write_text(snippet)
    (tmp_path / "facts.json").write_text(json.dumps({"paris": "the capital of France"}))
    load_plugins([str(tmp_path / "my_tools.py")], key="rollout.agent.plugins")
    env = T.ToolEnv(T.build_tools(["lookup"], {"lookup": {"table": str(tmp_path / "facts.json")}}))
    assert env.step(T.AgentState(None), "<lookup>paris</lookup>").text == "the capital of France"
    assert env.step(T.AgentState(None), "<lookup>rome</lookup>").text == "Error: lookup: no entry 'rome'"
    broken = snippet.replace("import json\n", "").replace('"lookup"', '"lookup_unimported"')
    (tmp_path / "broken.py").write_text(broken)
    load_plugins([str(tmp_path / "broken.py")], key="rollout.agent.plugins")
    with pytest.raises(ConfigError) as e:
        T.build_tools(["lookup_unimported"], {"lookup_unimported": {"table": str(tmp_path / "facts.json")}})
    line = 1 + broken.splitlines().index("            self.facts = json.load(f)")
    assert str(e.value) == ("rollout.agent.tool_kwargs.lookup_unimported: building the lookup_unimported tool raised "
                            f"NameError: name 'json' is not defined (broken.py:{line})")

    def crash(args, state):
        return {}[args]

    env, state = T.ToolEnv({"crash": crash}), T.AgentState(None)
    with caplog.at_level("WARNING", logger="rllava.agent.tools"):
        texts = [env.step(state, f"<crash>k{i}</crash>").text for i in range(T.BROKEN_AFTER - 1)]
    assert texts == [f"Error: crash failed: KeyError: 'k{i}'" for i in range(T.BROKEN_AFTER - 1)]
    at = f"test_agent_pipeline.py:{crash.__code__.co_firstlineno + 1}"
    assert [r.getMessage() for r in caplog.records] == [
        f"the crash tool raised KeyError: 'k0' ({at}) on the call 'k0'; the model reads it as an error observation "
        "(raise ToolError for a call the tool rejects)"]
    with pytest.raises(RllavaError, match=rf"^the crash tool raised KeyError: 'k7' \({at}\) on the call 'k7', as on "
                                          r"each of its first 8 calls: fix the tool"):
        env.step(state, "<crash>k7</crash>")
    env.worked.add("crash")  # a tool that ran once is not broken: its errors stay observations
    assert env.step(state, "<crash>k8</crash>").error and state.failed_calls == 8


@pytest.mark.parametrize("args, message", [
    (["rollout.agent.tools=[zoom]", "rollout.agent.tool_format=xml"],
     "rollout.agent.tool_format=xml is not one of: tags, json, fenced"),
    (["rollout.agent.tools=[code]", "rollout.agent.tool_workers=0"], "rollout.agent.tool_workers=0 must be > 0"),
    (["rollout.agent.tools=[zoom]", "rollout.agent.invalid_call_penalty=0.5"],
     "rollout.agent.invalid_call_penalty=0.5 must be <= 0"),
    (["rollout.agent.tools=[zoom]", "rollout.max_turns=0"], "rollout.max_turns=0 must be > 0"),
    (["rollout.agent.tools=[zoom]", "actor.policy_loss.loss_mode=luffy", "algorithm.prefix_strategy=random",
      "data.target_key=solution"], "algorithm.prefix_strategy=random (expert prefixes of LUFFY, SRFT, UFT) is for "
                                   "single-turn responses"),
    (["rollout.agent.invalid_call_penalty=-0.1"], "rollout.agent.invalid_call_penalty=-0.1 is read only by agent "
                                                  "rollouts"),
    (["algorithm.adv_estimator=gigpo"], "algorithm.adv_estimator=gigpo credits the turns of agent rollouts: set "
                                        "rollout.agent.tools"),
    (["rollout.agent.tools=[zoom]", "rollout.discount=0.5"], "rollout.discount=0.5 is read only by GiGPO's per-turn "
                                                             "credit (algorithm.adv_estimator=gigpo)"),
])
def test_agent_config_errors(args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config(["config=examples/config.yaml", *args])


def test_gigpo_keys_at_values_that_describe_no_per_turn_credit_are_accepted():
    """RLLaVA's agent scripts set rollout.discount=1.0 with GRPO: no discounting, what happens without GiGPO."""
    cfg = load_config(["config=examples/config.yaml", "rollout.agent.tools=[zoom]", "rollout.discount=1.0",
                       "algorithm.step_advantage_w=0.0"])
    assert cfg.rollout.discount == 1.0 and cfg.algorithm.adv_estimator == "grpo"


def test_a_code_sandbox_that_cannot_isolate_stops_the_run_before_the_model_loads(tmp_path, tiny_model_dir,
                                                                                  counting_dir, distinct_reward,
                                                                                  monkeypatch, capsys):
    from rllava.agent import sandbox

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap
    monkeypatch.setattr(sandbox, "_jail", None)
    monkeypatch.setattr(B, "build_policy", lambda *a, **kw: pytest.fail("the model was loaded"))
    args = _args(tiny_model_dir, counting_dir, str(tmp_path / "run"), distinct_reward, "rollout.agent.tools=[code]")
    with pytest.raises(SystemExit):
        agentic.main(args)
    error = capsys.readouterr().err.strip()
    assert error.startswith("rllava: error: rollout.agent.tools=[code]: the code sandbox cannot isolate its calls")
    assert "apt-get install bubblewrap" in error and "\n" not in error
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


def test_agent_keys_reach_the_driver(tiny_model_dir):
    from rllava.agent.tools import AgentState, Observation
    from rllava.model.processor import load_processor

    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
                       "rollout.agent.tools=[zoom]", "rollout.agent.answer_tag=final", "rollout.max_turns=7",
                       "rollout.agent.observation_role=tool", "rollout.agent.tool_format=json",
                       "rollout.agent.invalid_call_penalty=-0.25", "rollout.agent.tool_workers=3",
                       "rollout.agent.round_image_mb=7"])
    rollout = B.build_rollout(cfg, load_processor(tiny_model_dir), torch.device("cpu"))
    assert rollout.tool_workers == 3  # what it does: tests/agent/test_agent_rollout.py (tool_workers)
    assert rollout.round_image_mb == 7  # what it does: test_a_rounds_observations_are_bounded_as_they_arrive
    assert rollout.max_turns == 7 and "<|im_start|>tool\nseen" in rollout.observation_text(Observation("seen"))
    state = AgentState(None)
    call = '<tool_call>{"name": "zoom", "arguments": [0, 0, 9, 9]}</tool_call>'
    assert rollout.env.step(state, "<final>3</final>" + call).done  # the answer tag ends the episode
    assert not rollout.env.step(state, "<answer>3</answer>" + call).done  # another tag does not: the call runs
    assert rollout.env.step(state, '<tool_call>{"name": "crop"}</tool_call>').reward == -0.25


def test_multi_turn_sft_replays_expert_turns(tmp_path, tiny_model_dir, counting_dir, monkeypatch):
    """`python -m rllava.train.pipeline.sft` with agent tools: the record's list of turns is replayed through the
    tools; the expert's turns are trained, the crops shown between them are not."""
    from rllava.agent.rollout import AgentRollout
    from rllava.train.pipeline import sft

    data = tmp_path / "turns.jsonl"
    with open(f"{counting_dir}/train.jsonl") as f, open(data, "w") as out:
        for line in list(f)[:8]:
            r = json.loads(line)
            r["turns"] = ["<zoom>[0, 0, 40, 40]</zoom>", f"<answer>{r['answer']}</answer>"]
            r["images"] = [os.path.join(counting_dir, p) for p in r["images"]]
            out.write(json.dumps(r) + "\n")
    replayed, replay = [], AgentRollout.replay
    monkeypatch.setattr(AgentRollout, "replay", lambda self, samples: replayed.extend(replay(self, samples)) or
                        replayed[-len(samples):])
    out = str(tmp_path / "sft")
    sft.main(["config=examples/tasks/counting/tiny_cpu_sft.yaml", f"actor.model.model_path={tiny_model_dir}",
              f"data.train_files={data}", "data.val_files=null", "data.target_key=turns", "data.train_batch_size=4",
              "actor.ppo_mini_batch_size=4",
              "data.max_response_length=64", "rollout.agent.tools=[zoom]", "trainer.max_steps=2",
              *keys_for(out), "trainer.logger=[jsonl]"])
    assert len(replayed) == 8 and all(len(t.agent.images) == 2 and t.mm_inputs["image_grid_thw"].shape[0] == 2
                                      for t in replayed)
    assert [s.trained for s in replayed[0].segments] == [False, True, False, True]
    assert all(s.off_policy for t in replayed for s in t.segments if s.trained)
    assert os.path.isdir(os.path.join(out, "final"))


def test_two_agentic_steps_on_a_faked_vllm(tmp_path, tiny_model_dir, counting_dir, distinct_reward, monkeypatch):
    """rollout.name=vllm (the fake of tests/engine): every later turn is sent unexpanded, one <|image_pad|> per
    image, with every image shown so far (the sample's, then the crops)."""
    import sys

    sys.path.insert(0, os.path.join(REPO, "tests", "engine"))
    import test_rollout_engines as fakes

    # the fake writes tokens 10+i, 20+j: ids of special tokens (image placeholders among them) in the tiny
    # vocabulary, which a real engine never samples (they are banned); write ordinary ones
    fake_tokens = fakes._fake_tokens
    monkeypatch.setattr(fakes, "_fake_tokens", lambda i, j, eos: (lambda ids, lps, f: (
        [t + 100 if t != eos else t for t in ids], lps, f))(*fake_tokens(i, j, eos)))

    from rllava.model.processor import get_tokenizer, load_processor

    log = []
    fake = fakes.fake_vllm(log)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.platforms", fake.platforms)
    monkeypatch.setitem(T.PARSERS, "tags", lambda text, names: ("zoom", "[0, 0, 40, 40]"))
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=2", "rollout.name=vllm"))
    assert [r["step"] for r in _rows(out)] == [1, 2] and os.path.isdir(os.path.join(out, "final"))
    pad = get_tokenizer(load_processor(tiny_model_dir)).convert_tokens_to_ids("<|image_pad|>")
    rounds = [e[1] for e in log if e[0] == "generate"]
    assert len(rounds) == 2 * 3  # 2 steps x max_turns rounds (the fake stops at EOS for even requests)
    for turn, prompts in enumerate(rounds[:3]):
        for p in prompts:
            images = p["multi_modal_data"]["image"]
            assert len(images) == 1 + turn and p["prompt_token_ids"].count(pad) == len(images)
