"""What a researcher watches: tensorboard events, the console line with its timing breakdown, sample generations,
wandb (offline, its validation-generations table, or skipped with a warning), PNG curves, and logs that stay one row per step across a resume."""

import json
import os
import subprocess
import sys
import time
import types

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rllava.commands import plot
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.train.evaluate import headline
from rllava.train.pipeline import rlvr
from rllava.train.pipeline.rlvr import batch_metrics
from rllava.train.tracker import Tracker
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _scalars(log_dir: str, key: str) -> list[tuple[int, float]]:
    events = EventAccumulator(log_dir)
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(key)]


def _rows(out: str, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, name))]


def test_tensorboard_console_samples_and_plots(tmp_path, tiny_model_dir, counting_dir, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    out = str(tmp_path / "distinct_chars")  # keys_for: its experiment_name
    # A float reward with a named part (no accuracy part): logged as a score, its part beside it. A random model
    # never answers right, so it rewards what its samples do vary in: distinct characters.
    reward = tmp_path / "distinct.py"
    reward.write_text("def compute_score(response, ground_truth):\n"
                      "    return {'overall': len(set(response)) / 20, 'short': float(len(response) < 30)}\n")
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
               f"data.train_files={counting_dir}/train.jsonl", f"data.val_files={counting_dir}/val.jsonl",
               "data.max_samples=8", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2",
               "trainer.max_steps=2", "trainer.val_freq=2", *keys_for(out),
               "trainer.logger=[console,jsonl,tensorboard]", f"reward.reward_function={reward}:compute_score",
               "trainer.samples_freq=1", "trainer.samples_to_log=3", "trainer.val_generations_to_log=2"])
    steps = [r for r in _rows(out) if "reward/mean" in r]

    # tensorboard: real event files, read back with tensorboard's own reader, in the run's folder as README says
    # (it said `<outputs_dir>/tensorboard`, i.e. beside the project folders: issue 62 item 11)
    assert "`tensorboard` (`tensorboard/` in the run's folder" in open(os.path.join(REPO, "README.md")).read()
    logged = _scalars(os.path.join(out, "tensorboard"), "reward/mean")
    assert [s for s, _ in logged] == [1, 2]
    assert [v for _, v in logged] == pytest.approx([r["reward/mean"] for r in steps], rel=1e-6)
    assert [s for s, _ in _scalars(os.path.join(out, "tensorboard"), "val/score")] == [0, 2]
    # a float reward is a score, not an accuracy (rllava.train.evaluate.headline), in training and validation
    vals = [r for r in _rows(out) if "val/reward_mean" in r]
    for r in steps:
        assert r["reward/score"] == pytest.approx(r["reward/mean"]) and "reward/accuracy_mean" not in r
        assert "reward/short_mean" in r
    assert all("val/accuracy" not in r and r["val/score"] == pytest.approx(r["val/reward_mean"]) for r in vals)

    # the console line: headline metrics, then the per-stage timing breakdown
    console = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[step 1] reward/mean=")]
    assert len(console) == 1 and all(f" {stage}=" in console[0] for stage in ("rollout", "reward", "advantage", "update"))
    assert " reward/score=" in console[0]

    # samples.jsonl: 3 generations per step, from 3 different prompts, with the image files, the ground truth,
    # the reward and its parts; val_generations.jsonl: the same fields for held-out generations
    records = {name: [json.loads(line) for line in open(os.path.join(counting_dir, f"{name}.jsonl"))]
               for name in ("train", "val")}
    samples, generations = _rows(out, "samples.jsonl"), _rows(out, "val_generations.jsonl")
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2] and [g["step"] for g in generations] == [0, 0, 2, 2]
    assert len({s["index"] for s in samples[:3]}) == 3
    for rows, split in ((samples, "train"), (generations, "val")):
        for s in rows:
            assert "How many" in s["prompt"] and s["images"] and all(os.path.isfile(p) for p in s["images"])
            assert s["ground_truth"] == records[split][s["index"]]["answer"]
            assert s["reward"] == pytest.approx(len(set(s["response"])) / 20)
            assert s["reward_parts"] == {"overall": pytest.approx(s["reward"]),
                                         "short": float(len(s["response"]) < 30)}

    # python -m rllava.commands.plot: one PNG per quantity the run logged, one per validation metric, titled with the run
    res = subprocess.run([sys.executable, "-m", "rllava.commands.plot", out], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    names = sorted(os.path.basename(p) for p in res.stdout.split())
    assert {"reward.png", "reward_parts.png", "entropy.png", "response_length.png", "val_score.png",
            "val_short.png", "val_reward_mean.png"} <= set(names)
    assert "accuracy.png" not in names and "kl.png" not in names  # no accuracy; KL off in this config
    for name in names:
        with open(os.path.join(out, "plots", name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot.run_name(out) == "distinct_chars"


def test_plot_without_metrics_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "rllava.commands.plot", str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO)
    assert res.returncode == 2 and res.stderr.strip() == (
        f"rllava: error: {tmp_path}/metrics.jsonl does not exist: give a run's folder, "
        "<trainer.outputs_dir>/<project_name>/<experiment_name>")


def test_rewind_drops_what_a_stopped_run_logged_after_its_checkpoint(tmp_path):
    out = str(tmp_path)
    tracker = Tracker(["jsonl", "tensorboard"], out, "p", "e", {})
    for step in (1, 2, 3):
        tracker.log({"reward/mean": float(step)}, step)
    tracker.log_samples([{"response": "x"}], 3)
    tracker.close()
    # tensorboard reads event files in name order: <seconds>.<host>.<pid>.<a per-process counter>; a resumed run
    # is a new process a second later at least, while here the counter may go 9 -> 10 ("10" < "9") in one second
    time.sleep(1.1)
    tracker = Tracker(["jsonl", "tensorboard"], out, "p", "e", {})  # resumed from the checkpoint of step 2
    tracker.rewind(2)
    tracker.log({"reward/mean": 30.0}, 3)
    tracker.close()
    assert [(r["step"], r["reward/mean"]) for r in _rows(out)] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert not _rows(out, "samples.jsonl")
    assert _scalars(os.path.join(out, "tensorboard"), "reward/mean") == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_wandb_offline_without_a_key_and_skipped_when_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    calls = []
    run = types.SimpleNamespace(log=lambda m, step: calls.append(("log", step, m)), finish=lambda: calls.append("finish"))
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw) or run,
                                                                    Table=lambda **kw: ("Table", kw)))
    tracker = Tracker(["wandb"], str(tmp_path / "a"), "proj", "exp", {"lr": 1})
    tracker.log({"reward/mean": 0.5}, 1)
    tracker.log_generations([{"response": "r", "reward_parts": {"short": 1.0}}, {"response": "s"}], 1)
    tracker.close()
    assert calls[0]["mode"] == "offline" and calls[0]["project"] == "proj" and calls[0]["config"] == {"lr": 1}
    # validation generations: a wandb Table (a field that is not a string or number as its JSON text)
    table = ("Table", {"columns": ["step", "response", "reward_parts"],
                       "data": [[1, "r", '{"short": 1.0}'], [1, "s", None]]})
    assert calls[1:] == [("log", 1, {"reward/mean": 0.5}), ("log", 1, {"val/generations": table}), "finish"]

    monkeypatch.setenv("WANDB_API_KEY", "k")
    Tracker(["wandb"], str(tmp_path / "b"), "proj", "exp", {})
    assert calls[-1]["mode"] == "online"



def _metrics_of(details: list[dict]) -> dict:
    """batch_metrics of a 4-row batch (two groups of two) scored with `details`."""
    ts = [Trajectory(Sample(i, [], [], "1"), i // 2, [Segment([1, 2], False), Segment([3, 4, 5], True)], {})
          for i in range(len(details))]
    batch = collate(ts, 0)
    batch.scores, batch.reward_details = torch.tensor([d["overall"] for d in details]), details
    return batch_metrics(batch)


def test_a_float_reward_is_a_score_and_a_pass_fail_one_an_accuracy():
    binary = [{"overall": x} for x in (1.0, 0.0, 0.0, 1.0)]
    assert headline(binary) == ("accuracy", [1.0, 0.0, 0.0, 1.0])
    m = _metrics_of(binary)
    assert m["reward/accuracy_mean"] == 0.5 and "reward/score" not in m

    floats = [{"overall": x} for x in (0.25, 0.0, 1.0, 0.5)]
    assert headline(floats) == ("score", [0.25, 0.0, 1.0, 0.5])
    m = _metrics_of(floats)
    assert m["reward/score"] == pytest.approx(0.4375) and "reward/accuracy_mean" not in m

    # the reward's own accuracy part wins (a sample scored 0 after an error, without the part, counts 0)
    parts = [{"overall": 0.9, "accuracy": 1.0, "format": 1.0}, {"overall": 0.1, "accuracy": 0.0, "format": 1.0},
             {"overall": 0.9, "accuracy": 1.0, "format": 1.0}, {"overall": 0.0}]
    assert headline(parts) == ("accuracy", [1.0, 0.0, 1.0, 0.0])
    m = _metrics_of(parts)
    assert m["reward/accuracy_mean"] == 0.5 and "reward/score" not in m and m["reward/format_mean"] == 0.75

    # pass/fail is judged before what the trainer adds: DAPO's overlong penalty, an agent's tool rewards
    added = [{"overall": 1.0 - 0.3, "overlong_penalty": -0.3}, {"overall": 0.0 + 0.2, "tool_reward": 0.2},
             {"overall": 1.0}, {"overall": 0.0}]
    assert headline(added) == ("accuracy", [1.0, 0.0, 1.0, 0.0])
