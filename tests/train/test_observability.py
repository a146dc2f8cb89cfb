"""What a researcher watches: tensorboard events, the console line with its timing breakdown, sample generations,
wandb (offline, or skipped with a warning), PNG curves, and logs that stay one row per step across a resume."""

import json
import os
import subprocess
import sys
import types

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rllava.train.pipeline import rlvr
from rllava.train.tracker import Tracker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _scalars(log_dir: str, key: str) -> list[tuple[int, float]]:
    events = EventAccumulator(log_dir)
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(key)]


def _rows(out: str, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, name))]


def test_tensorboard_console_samples_and_plots(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys,
                                               monkeypatch):
    monkeypatch.chdir(REPO)
    out = str(tmp_path / "run")
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
               f"data.train_files={counting_dir}/train.jsonl", f"data.val_files={counting_dir}/val.jsonl",
               "data.max_samples=8", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2",
               "trainer.max_steps=2", "trainer.val_freq=2", f"trainer.outputs_dir={out}",
               "trainer.logger=[console,jsonl,tensorboard]", f"reward.reward_function={distinct_reward}",
               "trainer.samples_freq=1", "trainer.samples_to_log=3"])
    steps = [r for r in _rows(out) if "reward/mean" in r]

    # tensorboard: real event files, read back with tensorboard's own reader
    logged = _scalars(os.path.join(out, "tensorboard"), "reward/mean")
    assert [s for s, _ in logged] == [1, 2]
    assert [v for _, v in logged] == pytest.approx([r["reward/mean"] for r in steps], rel=1e-6)
    assert [s for s, _ in _scalars(os.path.join(out, "tensorboard"), "val/accuracy")] == [0, 2]

    # the console line: headline metrics, then the per-stage timing breakdown
    console = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[step 1] reward/mean=")]
    assert len(console) == 1 and all(f" {stage}=" in console[0] for stage in ("rollout", "reward", "advantage", "update"))

    # samples.jsonl: 3 generations per step, from 3 different prompts, with the image files and their reward
    samples = _rows(out, "samples.jsonl")
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2]
    assert len({s["index"] for s in samples[:3]}) == 3
    for s in samples:
        assert "How many" in s["prompt"] and s["images"] and all(os.path.isfile(p) for p in s["images"])
        assert s["reward"] == pytest.approx(len(set(s["response"])) / 20)

    # python -m rllava.plot: one PNG per quantity the run logged
    res = subprocess.run([sys.executable, "-m", "rllava.plot", out], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    names = sorted(os.path.basename(p) for p in res.stdout.split())
    assert {"reward.png", "accuracy.png", "entropy.png", "response_length.png", "validation.png"} <= set(names)
    for name in names:
        with open(os.path.join(out, "plots", name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_metrics_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "rllava.plot", str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO)
    assert res.returncode == 2 and res.stderr.strip() == (
        f"rllava: error: {tmp_path}/metrics.jsonl does not exist: give the trainer.outputs_dir of a run")


def test_rewind_drops_what_a_stopped_run_logged_after_its_checkpoint(tmp_path):
    out = str(tmp_path)
    tracker = Tracker(["jsonl", "tensorboard"], out, "p", "e", {})
    for step in (1, 2, 3):
        tracker.log({"reward/mean": float(step)}, step)
    tracker.log_samples([{"response": "x"}], 3)
    tracker.close()
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
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw) or run))
    tracker = Tracker(["wandb"], str(tmp_path / "a"), "proj", "exp", {"lr": 1})
    tracker.log({"reward/mean": 0.5}, 1)
    tracker.close()
    assert calls[0]["mode"] == "offline" and calls[0]["project"] == "proj" and calls[0]["config"] == {"lr": 1}
    assert calls[1:] == [("log", 1, {"reward/mean": 0.5}), "finish"]

    monkeypatch.setenv("WANDB_API_KEY", "k")
    Tracker(["wandb"], str(tmp_path / "b"), "proj", "exp", {})
    assert calls[-1]["mode"] == "online"

    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed: import fails
    with pytest.warns(UserWarning, match="wandb is not installed"):
        tracker = Tracker(["console", "wandb"], str(tmp_path / "c"), "proj", "exp", {})
    tracker.log({"reward/mean": 0.5}, 1)  # the other sinks go on
    assert _rows(str(tmp_path / "c"))[0]["reward/mean"] == 0.5
