"""The console script `rllava NAME ...` (rllava.commands.main): one line per command in its help, each command's own
--help, an unknown name as one line naming the closest, and a command run through it as its `python -m` form."""

import json
import os
import subprocess
import sys

import pytest

from rllava.commands import COMMANDS, main

RLLAVA = os.path.join(os.path.dirname(sys.executable), "rllava")  # pip install -e . (make install) puts it there
PIPELINE = "arguments: config=FILE"  # a pipeline's help (rllava.train.cli.pipeline_help): its keys are the config's
OWN = {"train": (PIPELINE, "torchrun"), "sft": (PIPELINE, "data.target_key"), "memory": ("usage: rllava memory ",
       "--gpu-memory"), "export": ("usage: rllava export ", "--no-merge-lora"), "compare": ("usage: rllava compare ",
       "--group-by"), "sweep": ("usage: rllava sweep ", "--parallel"), "plot": ("usage: rllava plot ", "--smoothing"),
       "demo": ("usage: rllava demo ", "--rl-steps"), "proof": ("usage: rllava proof ", "--tasks")}


def test_the_console_script_lists_each_command_in_one_line():
    res = subprocess.run([RLLAVA, "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("usage: rllava COMMAND"), res.stderr
    for name, (_, line) in COMMANDS.items():
        assert f"  {name.ljust(7)}  {line}\n" in res.stdout
    assert subprocess.run([RLLAVA], capture_output=True, text=True).stdout == res.stdout  # no arguments: the same


@pytest.mark.parametrize("name", OWN)
def test_each_command_prints_its_own_help(name, capsys, monkeypatch):
    """Its own parser's help (or a pipeline's: its docstring and how keys are given), not the console script's."""
    monkeypatch.setattr(sys, "argv", ["rllava"])  # restored after main sets it
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    out = capsys.readouterr().out
    head, option = OWN[name]
    assert e.value.code == 0 and head in out and option in out, out


def test_a_pipeline_s_help_is_the_same_under_python_m():
    """`python -m rllava.train.pipeline.rlvr --help`, unchanged but for --help itself, prints what `rllava train
    --help` does, before torch is imported."""
    ours = subprocess.run([RLLAVA, "train", "--help"], capture_output=True, text=True)
    theirs = subprocess.run([sys.executable, "-m", "rllava.train.pipeline.rlvr", "--help"], capture_output=True, text=True)
    assert ours.returncode == theirs.returncode == 0 and ours.stdout == theirs.stdout
    assert ours.stdout.startswith("RL with verifiable rewards") and "docs/config.md" in ours.stdout


@pytest.mark.parametrize("name, line", [
    ("trian", "rllava: unknown command 'trian' (did you mean 'train'?)"),
    ("--gpu-memory", "rllava: unknown command '--gpu-memory' (did you mean 'memory'?)"),
    ("xyzzy", "rllava: unknown command 'xyzzy' (rllava --help lists the commands)"),
])
def test_an_unknown_command_is_one_line_naming_the_closest(name, line):
    res = subprocess.run([RLLAVA, name, "x=1"], capture_output=True, text=True)
    assert (res.returncode, res.stdout, res.stderr) == (2, "", line + "\n")


def test_a_pipeline_runs_through_the_console_script_config_first():
    """`rllava train`: the config's one-line error before torch is imported, as `python -m` (test_pipelines)."""
    res = subprocess.run([sys.executable, "-X", "importtime", RLLAVA, "train", "actor.optim.learning_rate=1e-6"],
                         capture_output=True, text=True)
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert res.returncode == 2 and "omegaconf" in imported and not imported & {"torch", "transformers", "numpy"}
    assert [line for line in res.stderr.splitlines() if not line.startswith("import time:")] == [
        "rllava: error: unknown config key 'actor.optim.learning_rate' (on the command line); did you mean "
        "'actor.optim.lr'?"]


def test_a_command_runs_through_the_console_script(tmp_path):
    """`rllava plot RUN`: the PNGs of hand-written metrics, as `python -m rllava.commands.plot RUN` writes them."""
    rows = [{"step": s, "reward/mean": s / 10, "actor/entropy": 2.0 - s / 10} for s in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = subprocess.run([RLLAVA, "plot", str(tmp_path), "--out", str(tmp_path / "png")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(tmp_path / "png")) == ["entropy.png", "reward.png"]
