"""A/B experiments: `python -m rllava.commands.compare` (curves, final/best table, config diff, mean ± std over seeds),
`python -m rllava.commands.sweep` (a grid of normal runs, skipped / resumed / restarted on re-launch, one per GPU with
--parallel), and the wall-clock field `time/elapsed_s` they plot against."""

import importlib.util
import json
import os
import statistics
import sys
import types

import pytest

from rllava.commands import compare as X
from rllava.commands import sweep as S
from rllava.errors import RllavaError
from rllava.train import tracker as T

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG = b"\x89PNG\r\n\x1a\n"


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def _cells(printed: str, key: str, name: str) -> list[str]:
    """The cells of the table row of `key` and run / group `name`."""
    line = next(line for line in printed.splitlines() if line.startswith(f"| {key} ") and f"| {name} " in line)
    return [cell.strip() for cell in line.strip("|").split("|")]


def _exit(main, argv) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


# --- time/elapsed_s ------------------------------------------------------------------------------------------

def test_elapsed_time_goes_on_from_the_checkpoint_step_after_a_resume(tmp_path, monkeypatch):
    clock = iter([100.0, 101.0, 102.5, 104.0,  # started, 3 steps logged
                  400.0, 500.0, 503.0])  # another process: started, rewound (resumed at step 2), step 3 logged
    monkeypatch.setattr(T, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    tracker = T.Tracker(["jsonl"], str(tmp_path), "p", "e", {})
    for step in (1, 2, 3):
        tracker.log({"reward/mean": 0.0}, step)
    tracker.close()
    tracker = T.Tracker(["jsonl"], str(tmp_path), "p", "e", {})  # resumed from the checkpoint of step 2
    tracker.rewind(2)
    tracker.log({"reward/mean": 0.0}, 3)
    tracker.close()
    # step 3 of the stopped run (4.0 s) is dropped; the resumed step 3 continues from step 2's 2.5 s
    assert [(r["step"], r["time/elapsed_s"]) for r in _rows(tmp_path)] == [(1, 1.0), (2, 2.5), (3, 5.5)]


# --- compare -------------------------------------------------------------------------------------------------

def _write_run(path, config: str, rows: list[dict]) -> str:
    os.makedirs(path)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        f.write(config)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


CONFIG = """algorithm:
  adv_estimator: {est}
  kl_ctrl: {{kl_coef: 0.001}}
actor:
  optim: {{lr: {lr}}}
reward:
  reward_function_kwargs: {{}}
trainer:
  seed: 1
  outputs_dir: {out}
  experiment_name: {name}
  resume: auto
"""


def test_compare_prints_final_and_best_and_the_keys_that_differ(tmp_path, capsys):
    a = _write_run(tmp_path / "a", CONFIG.format(est="grpo", lr=1e-6, out=tmp_path / "a", name="x"), [
        {"step": 0, "val/accuracy": 0.2, "val/response_length": 9.0, "time/elapsed_s": 1.0},
        {"step": 1, "reward/mean": 0.1, "actor/entropy": 2.0, "time/elapsed_s": 3.0},
        {"step": 2, "reward/mean": 0.3, "actor/entropy": 1.5, "time/elapsed_s": 5.0},
        {"step": 2, "val/accuracy": 0.5, "val/response_length": 7.0, "time/elapsed_s": 6.0}])
    b = _write_run(tmp_path / "b", CONFIG.format(est="rloo", lr=2e-6, out=tmp_path / "b", name="y"), [
        {"step": 0, "val/accuracy": 0.25, "val/pass@2": 0.5},
        {"step": 1, "reward/mean": 0.2, "timing/step": 4.0},
        {"step": 1, "val/accuracy": 0.75, "val/pass@2": 1.0},
        {"step": 2, "reward/mean": 0.4, "timing/step": 2.0},
        {"step": 2, "val/accuracy": 0.5, "val/pass@2": 0.75}])
    out = str(tmp_path / "cmp")
    X.main([a, b, "--out", out])
    printed = capsys.readouterr().out
    table = """validation: final = last value logged, best = highest
| metric       | run | final         | best          |
|--------------|-----|---------------|---------------|
| val/accuracy | a   | 0.5 (step 2)  | 0.5 (step 2)  |
| val/accuracy | b   | 0.5 (step 2)  | 0.75 (step 1) |
| val/pass@2   | b   | 0.75 (step 2) | 1 (step 1)    |

config keys that differ:
| run | actor.optim.lr | algorithm.adv_estimator |
|-----|----------------|-------------------------|
| a   | 1e-06          | grpo                    |
| b   | 2e-06          | rloo                    |
(not compared: trainer.outputs_dir, trainer.experiment_name, trainer.save_checkpoint_path, \
trainer.load_checkpoint_path, trainer.resume, trainer.overwrite)"""
    assert printed == (f"{table}\nnote: b: metrics.jsonl has no time/elapsed_s (logged before it existed): its "
                       "wall-clock is the sum of timing/step, without validation and checkpoint time\n"
                       f"5 PNGs in {out}/: reward_mean.png actor_entropy.png val_accuracy.png val_pass_at_2.png "
                       "val_response_length.png\n")
    assert open(os.path.join(out, "compare.md")).read().startswith(table + "\n")
    for name in os.listdir(out):
        if name.endswith(".png"):
            assert open(os.path.join(out, name), "rb").read(8) == PNG
    run = X.load_run(b, "b")[0]  # the fallback clock: the running sum of timing/step
    assert X.points(run, "reward/mean") == {1: (4.0, 0.2), 2: (6.0, 0.4)}
    assert X.points(run, "val/accuracy")[1] == (4.0, 0.75)


def test_compare_smooths_training_curves_skips_all_zero_metrics_and_knows_a_path_written_two_ways(tmp_path,
                                                                                                  monkeypatch):
    """A training curve is drawn raw (thin) under its EMA, a validation metric as measured; a metric every run
    logged as 0 (KL off) gets no PNG; `./r.py:f` in one run and `/abs/r.py:f` in the other is one value."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text("def f(response, ground_truth):\n    return 0.0\n")
    rows = [{"step": s, "reward/mean": (s % 3) / 2, "actor/kl_loss": 0.0, "time/elapsed_s": float(s)}
            for s in range(1, 61)] + [{"step": 60, "val/accuracy": 0.5, "time/elapsed_s": 61.0}]
    runs = [_write_run(tmp_path / name, CONFIG.format(est="grpo", lr=1e-6, out=tmp_path / name, name=name).replace(
                "reward:\n", f"reward:\n  reward_function: {fn}\n"), rows)
            for name, fn in (("a", "./r.py:f"), ("b", f"{tmp_path}/r.py:f"))]
    result = X.compare(runs, str(tmp_path / "cmp"), smoothing=0.5)
    assert "config keys that differ: none" in result["table"]
    assert sorted(os.path.basename(p) for p in result["plots"]) == ["reward_mean.png", "val_accuracy.png"]
    fig = X.plot_metric("reward/mean", X.group_runs([X.load_run(runs[0], "a")[0]], []), False, str(tmp_path), 0.5)
    assert os.path.isfile(fig)
    from rllava.commands import plot

    assert plot.auto_smoothing(30) == 0.0 and plot.auto_smoothing(300) == pytest.approx(1 - 2 / 16)
    assert plot.ema([1.0, 3.0] * 50, None) == plot.ema([1.0, 3.0] * 50, plot.auto_smoothing(100))


def test_compare_bad_run_dirs_are_one_line(tmp_path, capsys):
    good = _write_run(tmp_path / "good", "trainer: {seed: 1}\n", [{"step": 1, "reward/mean": 0.0}])
    assert _exit(X.main, [good, str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == (f"rllava: error: {tmp_path}/missing/metrics.jsonl does not exist: give a run's "
                                       "folder, <trainer.outputs_dir>/<project_name>/<experiment_name>\n")
    _write_run(tmp_path / "noconfig", "", [])
    os.remove(tmp_path / "noconfig" / "config.yaml")
    assert _exit(X.main, [good, str(tmp_path / "noconfig")]) == 2
    assert capsys.readouterr().err == (f"rllava: error: {tmp_path}/noconfig/config.yaml does not exist: give a run's "
                                       "folder, <trainer.outputs_dir>/<project_name>/<experiment_name>\n")
    torn = _write_run(tmp_path / "torn", "trainer: {seed: 1}\n", [{"step": 1}])
    with open(os.path.join(torn, "metrics.jsonl"), "a") as f:
        f.write('{"step": 2, "rew')
    assert _exit(X.main, [good, torn]) == 2
    assert capsys.readouterr().err.startswith(f"rllava: error: {torn}/metrics.jsonl: not a metrics file (")
    assert _exit(X.main, [good, good]) == 2
    assert "given twice" in capsys.readouterr().err
    with pytest.raises(RllavaError, match="--group-by trainer.sed: no run's config.yaml has that key"):
        X.compare([good], str(tmp_path / "c"), ["trainer.sed"])


def test_run_names_and_short_keys(tmp_path):
    assert X.run_names(["/x/a/run", "/x/b/run", "/x/c"]) == ["a/run", "b/run", "c"]
    assert X.short_keys(["actor.optim.lr", "critic.optim.lr", "trainer.seed"]) == {
        "actor.optim.lr": "actor.optim.lr", "critic.optim.lr": "critic.optim.lr", "trainer.seed": "seed"}


# --- sweep: the grid ------------------------------------------------------------------------------------------

def test_sweep_grid_parsing():
    assert S.split_values("grpo,rloo") == ["grpo", "rloo"]
    assert S.split_values("[a,b],[c]") == ["[a,b]", "[c]"]  # an axis of two lists
    assert S.split_values("[console,jsonl]") == ["[console,jsonl]"]  # one list: fixed
    assert S.split_values("'a,b',c") == ["'a,b'", "c"]
    fixed, axes = S.expand(["config=x.yaml", "trainer.logger=[jsonl]", "algorithm.adv_estimator=grpo,rloo",
                            "trainer.seed=1,2"])
    assert fixed == ["config=x.yaml", "trainer.logger=[jsonl]"]
    assert axes == {"algorithm.adv_estimator": ["grpo", "rloo"], "trainer.seed": ["1", "2"]}
    assert S.point_name({"algorithm.adv_estimator": "grpo", "trainer.seed": "1"}) == "adv_estimator=grpo+seed=1"
    assert S.point_name({"actor.model.model_path": "/m/Qwen2-VL-2B/", "data.train_files": "[a,b]"}) == \
        "model_path=Qwen2-VL-2B+train_files=-a-b-"
    assert S.command("sft_rl", ["k=v"]) == [sys.executable, "-m", "rllava.train.pipeline.sft_rl", "k=v"]
    assert all(importlib.util.find_spec(f"rllava.train.pipeline.{p}") for p in S.PIPELINES)
    for args, message in ((["trainer.resume=auto"], "trainer.resume is set by the sweep"),
                          (["trainer.experiment_name=a,b"], "trainer.experiment_name=a,b: names the sweep's folder"),
                          (["trainer.seed=1,2", "trainer.seed=3"], "trainer.seed is given twice"),
                          (["trainer.seed=1,"], "an empty value between commas"),
                          (["config=a.yaml,b.yaml"], "one config file per sweep"),
                          (["seed"], "'seed' is not key=value")):
        with pytest.raises(RllavaError, match=message):
            S.expand(args)


# --- sweep: launching, skipping, resuming, failures, --parallel (a fake pipeline: seconds) -----------------

FAKE = """
import json, os, sys, time
args = dict(a.split("=", 1) for a in sys.argv[1:])
# the run's folder, RLLaVA's layout: <outputs_dir>/<project_name>/<experiment_name>
out, seed = os.path.join(args["trainer.outputs_dir"], "rllava", args["trainer.experiment_name"]), args["trainer.seed"]
start = time.time()
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
with open(os.path.join(os.path.dirname(out), "calls.jsonl"), "a") as f:
    f.write(json.dumps({"seed": seed, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "args": sys.argv[1:],
                        "start": start, "end": time.time()}) + "\\n")
if seed == "2":
    print("rllava: error: boom", file=sys.stderr)
    sys.exit(2)
from rllava.config import config_to_yaml, load_config
open(os.path.join(out, "config.yaml"), "w").write(config_to_yaml(load_config(sys.argv[1:])))
open(os.path.join(out, "metrics.jsonl"), "w").write(json.dumps({"step": 1, "val/accuracy": float(seed)}) + "\\n")
os.makedirs(os.path.join(out, "final"))
"""


@pytest.fixture
def fake_pipeline(monkeypatch):
    monkeypatch.chdir(REPO)
    pipelines = []
    monkeypatch.setattr(S, "command", lambda pipeline, overrides: pipelines.append(pipeline) or
                        [sys.executable, "-c", FAKE, *overrides])

    def calls(out):
        return sorted((json.loads(line) for line in open(os.path.join(out, "calls.jsonl"))), key=lambda c: c["seed"])
    calls.pipelines = pipelines
    return calls


def test_sweep_reports_failures_resumes_and_restarts(tmp_path, fake_pipeline, capsys):
    root = str(tmp_path / "outputs")
    out = f"{root}/rllava/counting_tiny_cpu"  # the sweep dir: the config's run folder
    os.makedirs(f"{out}/seed=3/checkpoints/global_step_1")  # stopped after a checkpoint: resumed
    open(f"{out}/seed=3/checkpoints/global_step_1/trainer_state.json", "w").write("{}")
    os.makedirs(f"{out}/seed=4")  # died before its first checkpoint: restarted
    open(f"{out}/seed=4/metrics.jsonl", "w").write("")
    args = ["config=examples/tasks/counting/tiny_cpu.yaml", "trainer.seed=1,2,3,4", "trainer.max_steps=2",
            "--out", root]
    assert _exit(S.main, args) == 1
    printed = capsys.readouterr()
    calls = fake_pipeline(out)
    assert [c["seed"] for c in calls] == ["1", "2", "3", "4"] and all(c["gpu"] is None for c in calls)
    assert set(fake_pipeline.pipelines) == {"rlvr"}
    assert calls[0]["args"] == ["config=examples/tasks/counting/tiny_cpu.yaml", "trainer.max_steps=2",
                                f"trainer.outputs_dir={root}", "trainer.seed=1",
                                "trainer.experiment_name=counting_tiny_cpu/seed=1"]
    assert calls[2]["args"][-1] == "trainer.resume=auto" and calls[3]["args"][-1] == "trainer.overwrite=true"
    assert f"  seed=2: FAILED (exit status 2): rllava: error: boom\n    log: {out}/seed=2/train.log" in printed.out
    assert printed.err == f"sweep: 1 of 4 runs failed:\n  seed=2: {out}/seed=2/train.log\n"
    assert "rllava: error: boom" in open(f"{out}/seed=2/train.log").read()
    # compare over the 3 finished runs, the seeds averaged: val/accuracy 1, 3, 4
    mean, std = statistics.fmean([1, 3, 4]), statistics.stdev([1, 3, 4])
    assert _cells(printed.out, "val/accuracy", "all") == ["val/accuracy", "all", "3", *[f"{mean:.4g} ± {std:.4g}"] * 2]
    assert os.path.isfile(f"{out}/compare/val_accuracy.png")

    os.remove(f"{out}/calls.jsonl")  # launched again: only the failed run runs
    assert _exit(S.main, args) == 1
    assert [c["seed"] for c in fake_pipeline(out)] == ["2"]
    assert capsys.readouterr().out.count(": finished, skipped") == 3

    args[2] = "trainer.max_steps=3"  # a finished run is not silently kept under a changed grid
    assert _exit(S.main, args) == 2
    assert capsys.readouterr().err == (f"rllava: error: {out}/seed=1 holds a finished run whose config differs from "
                                       "this point's (trainer.max_steps: 2 -> 3): delete that dir to run the point "
                                       "again, or choose another --out\n")


def test_sweep_parallel_gives_each_run_its_own_gpu(tmp_path, fake_pipeline, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setenv("FAKE_SLEEP", "1")
    out = str(tmp_path / "outputs")
    assert _exit(S.main, ["config=examples/tasks/counting/tiny_cpu.yaml", "trainer.seed=1,3", "--parallel",
                          "--out", out, "--pipeline", "sft_rl"]) == 0
    assert fake_pipeline.pipelines == ["sft_rl", "sft_rl"]
    a, b = fake_pipeline(os.path.join(out, "rllava", "counting_tiny_cpu"))
    assert {a["gpu"], b["gpu"]} == {"3", "5"}
    assert a["start"] < b["end"] and b["start"] < a["end"]  # at the same time


def test_sweep_parallel_without_a_gpu_is_one_line(tmp_path, fake_pipeline, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "sweep"
    assert _exit(S.main, ["config=examples/tasks/counting/tiny_cpu.yaml", "trainer.seed=1,2", "--parallel",
                          "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("rllava: error: --parallel runs one run per GPU and this machine shows none "
                                       "(CUDA_VISIBLE_DEVICES, torch.cuda): drop --parallel to run the grid one "
                                       "after another\n")
    assert not out.exists()


def test_sweep_bad_point_fails_before_any_run(tmp_path, fake_pipeline, capsys):
    out = tmp_path / "sweep"
    assert _exit(S.main, ["config=examples/tasks/counting/tiny_cpu.yaml", "trainer.seed=1,2",
                          "actor.optim.lr=1e-3,fast", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rllava: error: point seed=1+lr=fast: ") and "actor.optim.lr" in err
    assert not out.exists()


def test_sweep_unregistered_name_on_a_later_point_fails_before_any_run(tmp_path, fake_pipeline, capsys):
    """Registry names are checked with each point's config before the first run (docs/experiments.md, "Every
    point's config is built and checked before the first run starts"), by the lookup the run's own start-up does
    (the did-you-mean of rllava.algorithms.registry.lookup); algorithm.plugins are imported first, so the names
    they register resolve."""
    plugin = tmp_path / "mine.py"
    plugin.write_text("from rllava.algorithms.registry import register_adv_estimator, register_loss_term\n"
                      "@register_adv_estimator('my_rloo')\n"
                      "def my_rloo(scores, group_ids, mask):\n    return scores[:, None] * mask\n"
                      "@register_loss_term('my_term')\n"
                      "def my_term(inputs):\n    return inputs.logprobs * 0, {}\n")
    out, base = tmp_path / "sweep", ["config=examples/tasks/counting/tiny_cpu.yaml", f"algorithm.plugins=[{plugin}]"]
    for axis, line, close in (
            ("algorithm.adv_estimator=grpo,rlooo", "point adv_estimator=rlooo: algorithm.adv_estimator='rlooo'",
             "rloo"),
            ("actor.policy_loss.loss_mode=vanilla,gsop", "point loss_mode=gsop: actor.policy_loss.loss_mode='gsop'",
             "gspo"),
            ("actor.loss_terms={my_term: 0.1},{my_trem: 0.1}", "point loss_terms=-my_trem-0.1-: actor.loss_terms="
             "'my_trem' is not registered (registered: my_term)", "my_term")):
        assert _exit(S.main, [*base, axis, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rllava: error: {line}") and "is not registered" in err and err.count("\n") == 1
        assert err.endswith(f"; did you mean {close!r}?\n"), err
        assert not out.exists()  # nothing ran, not even the first point
    assert _exit(S.main, [*base, "algorithm.adv_estimator=grpo,my_rloo", "actor.loss_terms={my_term: 0.1}",
                          "trainer.seed=1", "--out", str(out)]) == 0
    assert len(fake_pipeline(str(out / "rllava" / "counting_tiny_cpu"))) == 2


# --- sweep: real 2-step runs of a 2 x 2 grid ------------------------------------------------------------------

@pytest.mark.slow
def test_sweep_two_by_two_grid_then_relaunch_skips_it(tmp_path, tiny_model_dir, counting_dir, monkeypatch, capsys):
    """The sweep of README.md ("sweep") and docs/experiments.md L6-7, scaled down: grpo/rloo x seeds 1/2 with
    `trainer.experiment_name=estimators`, into outputs/rllava/estimators/<name>/ as the docs say, two at a time
    (the --parallel path, two fake GPUs on a CPU), each a real `python -m rllava.train.pipeline.rlvr` subprocess;
    the table's numbers are the mean ± std of the runs' own final validation metrics; launched again, nothing
    runs."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(S, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(response, ground_truth):\n"
                      "    return {'overall': len(set(response)) / 20, 'accuracy': float(len(response) % 2)}\n")
    out = str(tmp_path / "sweep")
    args = ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
            f"data.train_files={counting_dir}/train.jsonl", f"data.val_files={counting_dir}/val.jsonl",
            "data.max_samples=4", "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2",
            "data.val_batch_size=8", "data.max_response_length=4", "trainer.max_steps=2", "trainer.val_freq=2",
            "trainer.val_greedy=false", "trainer.logger=[jsonl]", f"reward.reward_function={reward}:compute_score",
            "algorithm.adv_estimator=grpo,rloo", "trainer.seed=1,2", "trainer.experiment_name=estimators",
            "--out", str(tmp_path / "outputs")]
    out = str(tmp_path / "outputs" / "rllava" / "estimators")  # <outputs_dir>/<project_name>/<the sweep's name>
    assert _exit(S.main, [*args, "--parallel"]) == 0
    printed = capsys.readouterr().out
    names = ["adv_estimator=grpo+seed=1", "adv_estimator=grpo+seed=2", "adv_estimator=rloo+seed=1",
             "adv_estimator=rloo+seed=2"]
    assert sorted(n for n in os.listdir(out) if n != "compare") == names
    for name in names:
        run = os.path.join(out, name)
        assert os.path.isdir(os.path.join(run, "final")), open(os.path.join(run, "train.log")).read()[-3000:]
        launched = open(os.path.join(run, "train.log")).readline()  # the `#` line: the command, one name given
        assert launched.count("trainer.experiment_name=") == 1
        assert f"trainer.experiment_name=estimators/{name}" in launched
        assert [r["step"] for r in _rows(run) if "reward/mean" in r] == [1, 2]
        elapsed = [r["time/elapsed_s"] for r in _rows(run)]  # on every row, never going back
        assert len(elapsed) == len(_rows(run)) and elapsed == sorted(elapsed) and elapsed[-1] > 0
    for est in ("grpo", "rloo"):
        runs = [os.path.join(out, f"adv_estimator={est}+seed={s}") for s in (1, 2)]
        for key in ("val/accuracy", "val/reward_mean"):
            finals = [[r[key] for r in _rows(run) if key in r][-1] for run in runs]
            bests = [max(r[key] for r in _rows(run) if key in r) for run in runs]
            mean_std = lambda v: f"{statistics.fmean(v):.4g} ± {statistics.stdev(v):.4g}"  # noqa: E731
            assert _cells(printed, key, f"adv_estimator={est}") == [key, f"adv_estimator={est}", "2",
                                                                     mean_std(finals), mean_std(bests)]
    assert open(os.path.join(out, "compare", "compare.md")).read().startswith(
        "validation: final = last value logged, best = highest\n| metric ")
    for png in ("reward_mean.png", "val_accuracy.png", "actor_entropy.png", "response_length_mean.png"):
        assert open(os.path.join(out, "compare", png), "rb").read(8) == PNG

    def snapshot():
        return {name: [os.path.getmtime(os.path.join(out, name, f)) for f in ("metrics.jsonl", "train.log")]
                for name in names}
    before = snapshot()
    assert _exit(S.main, args) == 0  # launched again, one after another: all four finished
    printed = capsys.readouterr().out
    assert printed.startswith(f"sweep: 4 runs in {out} (4 finished before, skipped)\n")
    assert printed.count(": finished, skipped") == 4 and snapshot() == before
