"""python -m rllava.commands.plot on hand-written metrics: the EMA, the panels it draws and skips, the run's name."""

import json
import math
import os
import subprocess
import sys

import pytest

from rllava.commands import plot
from rllava.errors import RllavaError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ema_is_tensorboards_debiased_average():
    # w = 0.5: m = 0.5, 1.25, 2.125; shown m / (1 - 0.5^t) = 1, 1.25/0.75, 2.125/0.875
    assert plot.ema([1.0, 2.0, 3.0], 0.5) == pytest.approx([1.0, 5 / 3, 17 / 7])
    assert plot.ema([4.0, 4.0, 4.0], 0.9) == pytest.approx([4.0, 4.0, 4.0])  # no pull towards 0 at the start
    assert plot.ema([1.0, 2.0, 3.0], 0.0) == [1.0, 2.0, 3.0]  # 0 = off
    out = plot.ema([1.0, math.nan, 3.0], 0.5)  # a NaN is shown, not averaged in
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == pytest.approx(1.75 / 0.75)  # 0.5 * 0.5 + 0.5 * 3
    with pytest.raises(RllavaError, match=r"smoothing=1.0: expected a weight in \[0, 1\)"):
        plot.ema([1.0], 1.0)


def _run(tmp_path, name=None):
    """A run's outputs: 4 steps of training metrics with KL off (ppo_kl all 0) and validation at 0 and 4."""
    out = tmp_path / "grpo_lr3e-6"
    out.mkdir()
    rows = [{"step": 0, "val/accuracy": 0.1, "val_greedy/accuracy": 0.2, "val/format": 0.5, "val/pass@2": 0.3}]
    for s in range(1, 5):
        rows.append({"step": s, "reward/mean": s / 10, "reward/std": 0.1, "reward/accuracy_mean": s / 8,
                     "reward/format_mean": 1.0, "reward/iou_mean": s / 5, "actor/ppo_kl": 0.0, "actor/kl_loss": 0.0,
                     "actor/entropy": 2.0 - s / 10, "actor/pg_loss": 0.1})
    rows.append({"step": 4, "val/accuracy": 0.4, "val_greedy/accuracy": 0.5, "val/format": 0.9, "val/pass@2": 0.6})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if name is not None:
        (out / "config.yaml").write_text(f"trainer:\n  experiment_name: {name}\n  seed: 1\n")
    return str(out)


def test_panels_one_per_validation_metric_reward_parts_and_no_zero_kl(tmp_path):
    out = _run(tmp_path, "counting_grpo")
    specs = {p.name: p for p in plot.panels(plot.read_metrics(out), plot.run_name(out))}
    assert sorted(specs) == ["accuracy", "entropy", "loss", "reward", "reward_parts", "val_accuracy", "val_format",
                             "val_pass_2"]  # "kl" is gone: every KL series is 0
    assert specs["reward_parts"].keys == ["reward/format_mean", "reward/iou_mean"]  # not mean, std, accuracy
    assert specs["val_accuracy"].keys == ["val/accuracy", "val_greedy/accuracy"] and not specs["val_accuracy"].smooth
    assert specs["val_pass_2"].keys == ["val/pass@2"] and specs["reward"].smooth
    assert all(p.title.endswith("· counting_grpo") for p in specs.values())


def test_draw_raw_and_ema_with_the_run_name(tmp_path):
    out = _run(tmp_path, "counting_grpo")
    rows = plot.read_metrics(out)
    reward = next(p for p in plot.panels(rows, plot.run_name(out)) if p.name == "reward")
    fig = plot.draw(reward, rows, smoothing=0.5)
    (ax,) = fig.axes
    assert ax.get_title() == "reward · counting_grpo"
    raw, smooth = ax.get_lines()
    assert list(raw.get_ydata()) == [0.1, 0.2, 0.3, 0.4] and raw.get_linewidth() < smooth.get_linewidth()
    assert list(smooth.get_ydata()) == pytest.approx(plot.ema([0.1, 0.2, 0.3, 0.4], 0.5))
    assert raw.get_color() == smooth.get_color() and smooth.get_label() == "reward/mean"
    assert len(plot.draw(reward, rows, smoothing=0).axes[0].get_lines()) == 1  # smoothing off: the raw line


def test_panels_name_their_y_axis_and_the_cli_writes_where_told(tmp_path):
    out = _run(tmp_path, "counting_grpo")
    rows = plot.read_metrics(out)
    labels = {p.name: plot.draw(p, rows).axes[0].get_ylabel() for p in plot.panels(rows, "r")}
    assert labels["reward"] == "reward" and labels["entropy"] == "entropy (nats / token)" and \
        labels["val_accuracy"] == "accuracy"
    res = subprocess.run([sys.executable, "-m", "rllava.commands.plot", out, "--out", str(tmp_path / "figs"), "--smoothing",
                          "auto"], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0 and all(p.startswith(str(tmp_path / "figs")) for p in res.stdout.split()), res.stderr


def test_run_name_falls_back_to_the_directory(tmp_path):
    assert plot.run_name(_run(tmp_path)) == "grpo_lr3e-6"  # no config.yaml
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.yaml").write_text("trainer:\n  experiment_name: agent\n")  # the schema's default
    assert plot.run_name(str(tmp_path / "b")) == "b"


def test_cli_writes_one_png_per_panel_and_rejects_a_bad_weight(tmp_path):
    out = _run(tmp_path, "counting_grpo")
    res = subprocess.run([sys.executable, "-m", "rllava.commands.plot", out, "--ema", "0.8"], capture_output=True, text=True,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(os.path.basename(p) for p in res.stdout.split()) == [
        "accuracy.png", "entropy.png", "loss.png", "reward.png", "reward_parts.png", "val_accuracy.png",
        "val_format.png", "val_pass_2.png"]
    res = subprocess.run([sys.executable, "-m", "rllava.commands.plot", out, "--smoothing", "1.5"], capture_output=True,
                         text=True, cwd=REPO)
    assert res.returncode == 2 and res.stderr.strip() == (
        "rllava: error: smoothing=1.5: expected a weight in [0, 1) (0 = no smoothing)")


def test_a_broken_config_yaml_is_one_line(tmp_path):
    (tmp_path / "config.yaml").write_text("trainer: [unclosed\n")
    with pytest.raises(RllavaError, match=r"config.yaml is not a run's config.yaml: "):
        plot.run_name(str(tmp_path))
