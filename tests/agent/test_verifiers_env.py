"""verifiers environments as agents (rllava.agent.verifiers_env): a SingleTurnEnv, a ToolEnv (two turns, one tool)
and a MultiTurnEnv over local data run their own rollouts against the endpoint, the episodes are the sampled
tokens exactly, the rubric's reward and metrics reach the batch; one-line errors; a GRPO run."""

import json
import os
import sys

import pytest

from rllava.agent.program import ProgramRollout, ProgramScore
from rllava.agent.verifiers_env import environment_program, environment_records, load_verifiers_env
from rllava.config import ConfigError, load_config
from rllava.data.protocol import Sample
from rllava.engine.inference.base import SamplingParams
from rllava.model.processor import get_tokenizer, load_processor
from tests.agent.test_program import ScriptedEngine

ENVS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vf_envs.py")
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def proc(tiny_model_dir):
    return load_processor(tiny_model_dir)


def _episodes(proc, function, script, n=2):
    """Rows 0 and 1 of the env's dataset, n episodes each, the engine writing `script`: (trajectories, engine)."""
    env = load_verifiers_env(f"verifiers:{ENVS}:{function}", {})
    records = environment_records(env, "train", "prompt", "answer")[:2]
    samples = [Sample(i, [{"role": "user", "content": r["prompt"]}], [], ground_truth=r["answer"], source="env",
                      extra={"verifiers_row": r["verifiers_row"]}) for i, r in enumerate(records)]
    engine = ScriptedEngine(get_tokenizer(proc), script)
    rollout = ProgramRollout(engine, proc, environment_program(env), max_turns=4, max_context=4096,
                             episode_timeout=60, window=60.0, key="rollout.agent.environment")
    try:
        return rollout.generate(samples, SamplingParams(n=n, max_new_tokens=100)), engine
    finally:
        rollout.close()


def _check_exact(out, engine, tok):
    """Every trained segment is ids the engine sampled, with their log-probs; the rows have no re-tokenised turn."""
    for t in out:
        for s in t.segments:
            if s.trained:
                assert s.token_ids in engine.sampled
                assert s.logprobs == [-0.1 * (i + 1) for i in range(len(s.token_ids))]
        assert t.agent.memory["program"]["retokenized"] == 0 and not t.agent.memory["program"]["error"]
    return [tok.decode([i for s in t.segments if not s.trained for i in s.token_ids]) for t in out]


def test_a_single_turn_env_scores_with_its_rubric(proc):
    out, engine = _episodes(proc, "load_environment", ["<answer>3</answer>"])
    given = _check_exact(out, engine, get_tokenizer(proc))
    assert len(out) == 4 and all(len(t.segments) == 2 for t in out) and engine.calls == [4]
    assert "Answer inside <answer></answer>." in given[0] and "What is 1 + 2?" in given[0]  # the env's own prompt
    scores, details = ProgramScore(None).score(out)
    assert scores.tolist() == [1.0, 1.0, 0.0, 0.0]  # 1 + 2 = 3; 3 + 4 is not
    assert [d["exact"] for d in details] == [1.0, 1.0, 0.0, 0.0] and all(d["length"] == 1.0 for d in details)


def test_a_tool_env_runs_its_tool_between_two_turns(proc):
    out, engine = _episodes(proc, "load_tool_environment", [CALL, "<answer>3</answer>"])
    given = _check_exact(out, engine, get_tokenizer(proc))
    assert [[s.trained for s in t.segments] for t in out] == [[False, True, False, True]] * 4
    assert engine.calls == [4, 4]  # each turn of the four episodes batched into one engine call
    assert '"name": "add"' in given[0] and "<tool_response>\n3\n</tool_response>" in given[0]  # the tool's result
    scores, details = ProgramScore(None).score(out)
    assert scores.tolist() == [1.0, 1.0, 0.0, 0.0] and all(d["add_calls"] == 1.0 for d in details)


def test_a_multi_turn_env_answers_each_turn(proc):
    out, engine = _episodes(proc, "load_multiturn_environment", ["first", "<answer>3</answer>"], n=1)
    given = _check_exact(out, engine, get_tokenizer(proc))
    assert [[s.trained for s in t.segments] for t in out] == [[False, True, False, True]] * 2
    assert "Again." in given[0]
    assert ProgramScore(None).score(out)[0].tolist() == [1.0, 0.0]


def test_a_multimodal_env_shows_its_images_to_the_policy(proc):
    out, engine = _episodes(proc, "load_image_environment", ["<answer>red</answer>"], n=1)
    given = _check_exact(out, engine, get_tokenizer(proc))
    assert all(t.mm_inputs["image_grid_thw"].shape[0] == 1 and len(t.agent.images) == 1 for t in out)
    assert "<|image_pad|>" in given[0] and "Which colour?" in given[0]
    assert ProgramScore(None).score(out)[0].tolist() == [1.0, 0.0]


BASE = ["config=examples/tasks/counting/tiny_cpu.yaml", "data.train_files=", "data.val_files="]


@pytest.mark.parametrize("keys, message", [
    ([f"rollout.agent.environment=verifiers:{ENVS}", "rollout.agent.program=a.py:run"],
     "rollout.agent.program and rollout.agent.environment both give the agent: set one"),
    (["rollout.agent.environment=my_env"], r"rollout.agent.environment='my_env': expected verifiers:<module"),
    (["rollout.agent.environment_kwargs.x=1"], "rollout.agent.environment_kwargs is for rollout.agent.environment"),
    ([f"rollout.agent.environment=verifiers:{ENVS}", "rollout.agent.tools=[zoom]"],
     "rollout.agent.environment runs an agent of its own: its tools are its own"),
    ([f"rollout.agent.environment=verifiers:{ENVS}", "data.train_files=t.jsonl"],
     "rollout.agent.environment brings its records .*: unset data.train_files and data.val_files"),
])
def test_bad_keys_are_one_line(keys, message):
    with pytest.raises(ConfigError, match=message):
        load_config(BASE + keys)


@pytest.mark.parametrize("spec, kwargs, message", [
    (f"verifiers:{ENVS}:load_enviroment", {}, r"has no function 'load_enviroment' \(did you mean 'load_environment'"),
    (f"verifiers:{ENVS}:not_an_env", {}, "not_an_env returned a int, expected a verifiers.Environment"),
    (f"verifiers:{ENVS}", {"nope": 1}, r"load_environment\(\*\*rollout.agent.environment_kwargs\) raised TypeError"),
    ("verifiers:no_such_env_module", {}, "no module 'no_such_env_module'"),
    ("verifiers:missing.py", {}, "file 'missing.py' does not exist"),
])
def test_a_bad_environment_is_one_line_naming_the_key(spec, kwargs, message):
    with pytest.raises(ConfigError, match=r"^rollout.agent.environment.*" + message) as e:
        load_verifiers_env(spec, kwargs)
    assert "\n" not in str(e.value)


def test_a_run_that_validates_needs_the_envs_eval_dataset():
    from rllava.train import builders as B

    cfg = load_config(BASE + [f"rollout.agent.environment=verifiers:{ENVS}:load_tool_environment"])
    with pytest.raises(ConfigError, match="the environment has no eval_dataset to validate on: give it one, or set"):
        B.environment_datasets(cfg)
    cfg = load_config(BASE + [f"rollout.agent.environment=verifiers:{ENVS}:load_tool_environment",
                              "trainer.val_freq=-1", "trainer.val_before_train=false"])
    train, val = B.environment_datasets(cfg)
    assert len(train) == 4 and val is None and train[3]["verifiers_row"] == ["train", 3]


def test_a_missing_package_names_the_extra(monkeypatch):
    from rllava.agent import verifiers_env

    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ConfigError, match=r"needs the verifiers package: pip install 'rllava\[verifiers\]'"):
        verifiers_env._cached.__wrapped__(f"verifiers:{ENVS}", "{}")


def test_two_grpo_steps_with_a_verifiers_env(tmp_path, tiny_model_dir):
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    out = str(tmp_path / "run")
    rlvr.main(BASE + [f"actor.model.model_path={tiny_model_dir}", f"rollout.agent.environment=verifiers:{ENVS}",
                      "rollout.agent.environment_kwargs.weight=2.0", "reward.reward_function=null",
                      "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "rollout.max_turns=2",
                      "data.max_prompt_length=1024", "data.max_response_length=8", *keys_for(out),
                      "trainer.logger=[jsonl]", "trainer.val_before_train=true", "trainer.val_freq=-1",
                      "trainer.max_steps=2"])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    train = [r for r in rows if "reward/mean" in r]
    assert len(train) == 2 and all(r["reward/length_mean"] == 1.0 and r["agent/program_failures"] == 0.0
                                   for r in train)  # the rubric's metric, from the env's own rollouts
    assert rows[0]["val/length"] == 1.0  # the env's eval_dataset
    assert load_verifiers_env(f"verifiers:{ENVS}", {"weight": 2.0}).rubric.rubrics[0].weights == [2.0, 0.0]
