"""reasoning-gym's procedural tasks as data (rllava.data.reasoning_gym) and its scorers as the reward
(rllava.reward.reasoning_gym): records from the seed, score_answer on the <answer>, one-line errors, a GRPO run."""

import json
import os
import re

import pytest
import reasoning_gym

from rllava.data.protocol import Sample, Trajectory
from rllava.data.records import DataError

from rllava.data.reasoning_gym import reasoning_gym_records, task_dataset
from rllava.reward.reasoning_gym import ReasoningGymScore

SPEC = "reasoning_gym:basic_arithmetic?size=6&seed=3&max_terms=3"


def test_records_are_the_tasks_entries_drawn_from_the_seed():
    records = reasoning_gym_records(SPEC, "problem", "solution", "data.train_files")
    own = reasoning_gym.create_dataset("basic_arithmetic", size=6, seed=3, max_terms=3)
    assert [r["problem"] for r in records] == [e["question"] for e in own]
    assert [r["solution"] for r in records] == [e["answer"] for e in own]
    assert [(r["reasoning_gym"], r["reasoning_gym_index"]) for r in records] == [(SPEC, i) for i in range(6)]
    other = reasoning_gym_records(SPEC.replace("seed=3", "seed=4"), "problem", "solution", "data.train_files")
    assert [r["problem"] for r in other] != [r["problem"] for r in records]


def _trajectory(spec, index, response):
    sample = Sample(index, [{"role": "user", "content": "q"}], [], ground_truth="",
                    extra={"reasoning_gym": spec, "reasoning_gym_index": index}, source=spec)
    return Trajectory(sample=sample, group_id=0, segments=[], mm_inputs={}, response=response)


def test_the_reward_is_the_tasks_score_answer_on_the_last_answer_tag():
    spec = "reasoning_gym:word_ladder?size=3&seed=1"  # a task whose scorer gives partial credit
    dataset = task_dataset(spec)
    right, entry = dataset[0]["answer"], dataset[0]
    wrong = ",".join(reversed(right.split(",")))
    responses = [f"<answer>no</answer> then <answer>{right}</answer>", f"<answer>{wrong}</answer>", right]
    scores, details = ReasoningGymScore().score([_trajectory(spec, 0, r) for r in responses])
    assert scores.tolist()[0] == 1.0
    assert scores.tolist()[1] == pytest.approx(dataset.score_answer(wrong, entry))
    assert scores.tolist()[2] == dataset.score_answer(None, entry) == 0.0  # no tag: no answer
    assert [d["answered"] for d in details] == [1.0, 1.0, 0.0]


def test_a_record_from_elsewhere_is_a_failure_of_its_sample():
    reward = ReasoningGymScore(fallback_score=-1.0)
    bare = _trajectory("t.jsonl", 0, "<answer>1</answer>")
    bare.sample.extra.clear()
    scores, _ = reward.score([bare])
    assert scores.tolist() == [-1.0] and reward.errors == 1
    assert "is not a reasoning_gym: record and no reward.reward_function scores it" in reward.last_error


@pytest.mark.parametrize("query, message", [
    ("basic_arithmetc?seed=1", r"reasoning-gym has no task 'basic_arithmetc' \(the closest: 'basic_arithmetic'"),
    ("basic_arithmetic?seed=1&terms=2", r"basic_arithmetic takes no parameter 'terms' \(its config: .*max_terms"),
    ("basic_arithmetic?size=4", r"give seed=S"),
    ("basic_arithmetic?seed=1&size=0", r"size=0 must be an integer >= 1"),
    ("basic_arithmetic?seed=x", r"seed='x' must be an integer"),
    ("basic_arithmetic?seed=1&size", r"the query must be name=value pairs"),
    ("basic_arithmetic?seed=1&min_terms=9&max_terms=2", r"basic_arithmetic rejects its parameters \(AssertionError"),
])
def test_bad_specs_are_one_line_naming_the_key(query, message):
    spec = "reasoning_gym:" + query
    with pytest.raises(DataError, match=r"^data.val_files=" + re.escape(spec) + ": " + message) as e:
        task_dataset(spec, "data.val_files")
    assert "\n" not in str(e.value)


def test_a_missing_package_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(DataError, match=r"needs the reasoning-gym package: pip install 'rllava\[reasoning-gym\]'"):
        task_dataset.__wrapped__("reasoning_gym:basic_arithmetic?seed=5", "data.train_files")


def test_a_bad_spec_fails_before_the_model_loads():
    from rllava.config import load_config
    from rllava.train import builders as B

    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", "actor.model.model_path=/nowhere",
                       "data.train_files=reasoning_gym:chain_sumx?seed=1"])
    with pytest.raises(DataError, match="data.train_files=reasoning_gym:chain_sumx.*the closest: 'chain_sum'"):
        B.check_data_paths(cfg)


def test_the_tasks_scorer_scores_what_an_agent_program_leaves_to_the_reward():
    from rllava.agent.program import ProgramScore
    from rllava.config import load_config
    from rllava.train import builders as B

    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", "reward.reward_function=null",
                       "data.train_files=reasoning_gym:chain_sum?seed=1",
                       "rollout.agent.program=tests/agent/programs.py:many"])
    reward = B.build_reward(cfg)
    ((_, _, source),) = reward.sources
    assert isinstance(source, ProgramScore) and [n for n, _, _ in source.inner.sources] == ["reasoning_gym"]
    reward.close()


def test_two_grpo_steps_on_a_task_scored_by_its_own_scorer(tmp_path, tiny_model_dir, monkeypatch):
    from reasoning_gym.arithmetic.basic_arithmetic import BasicArithmeticDataset

    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    seen = []  # a random model never answers right: the task's scorer, wrapped, says what it saw

    def score_answer(self, answer, entry):
        seen.append((answer, entry["question"]))
        return 0.5

    monkeypatch.setattr(BasicArithmeticDataset, "score_answer", score_answer)
    out = str(tmp_path / "run")
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
               "data.train_files=reasoning_gym:basic_arithmetic?size=8&seed=1&max_terms=2&max_digits=1",
               "data.val_files=reasoning_gym:basic_arithmetic?size=4&seed=2&max_terms=2&max_digits=1",
               "data.format_prompt=examples/format_prompt/math_answer.jinja", "reward.reward_function=null",
               "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4", "data.max_response_length=8",
               *keys_for(out), "trainer.logger=[jsonl]", "trainer.val_before_train=true", "trainer.val_freq=-1",
               "trainer.max_steps=2"])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    train = [r for r in rows if "reward/mean" in r]
    assert len(train) == 2 and all(r["reward/mean"] == 0.5 and "reward/answered_mean" in r for r in train)
    assert rows[0]["val/reward_mean"] == 0.5 and "val/answered" in rows[0]
    questions = {e["question"] for seed, size in ((1, 8), (2, 4)) for e in reasoning_gym.create_dataset(
        "basic_arithmetic", size=size, seed=seed, max_terms=2, max_digits=1)}
    assert len(seen) == 4 * 2 + 4 + 2 * 2 * 4 and all(q in questions for _, q in seen)  # val, greedy val, 2 steps
