"""Training curves as PNG files, from a run's metrics.jsonl:

    python -m rllava.plot OUTPUTS_DIR [--smoothing 0.6]   -> OUTPUTS_DIR/plots/{reward,accuracy,kl,...}.png

One figure per quantity a researcher checks first (reward or score, accuracy, the reward's own parts, KL, entropy,
response length, losses) and one per validation metric (sampled and greedy on one axis, as measured). Training
curves are drawn raw (thin) and smoothed (bold) by `ema`; titles carry the run's name (`run_name`). Quantities
the run did not log are skipped, and so are KL series that stay 0 (a run without a KL term: no KL panel).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass

from rllava.errors import RllavaError

PANELS = {
    "reward": ["reward/mean", "reward/score"],  # score: a reward that is not an accuracy (evaluate.headline)
    "accuracy": ["reward/accuracy_mean"],
    "kl": ["actor/kl_loss", "actor/reward_kl", "actor/ppo_kl"],
    "entropy": ["actor/entropy"],
    "response_length": ["response_length/mean", "response_length/max"],
    "loss": ["actor/pg_loss", "critic/vf_loss"],
}
SMOOTHING = 0.6  # TensorBoard's default weight


@dataclass
class Panel:
    name: str  # the PNG's name
    title: str
    keys: list[str]  # the series drawn, each a line over steps
    smooth: bool  # training curves: raw + EMA; validation: points as measured


def read_metrics(outputs_dir: str) -> list[dict]:
    path = os.path.join(outputs_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise RllavaError(f"{path} does not exist: give the trainer.outputs_dir of a run")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_name(outputs_dir: str) -> str:
    """The run's `trainer.experiment_name` (from its config.yaml), or its directory's name where the run kept
    the default name or has no config.yaml."""
    import yaml

    from rllava.config.schema import TrainerConfig

    path, name = os.path.join(outputs_dir, "config.yaml"), None
    if os.path.isfile(path):
        try:
            with open(path) as f:
                name = ((yaml.safe_load(f) or {}).get("trainer") or {}).get("experiment_name")
        except (yaml.YAMLError, AttributeError) as e:
            raise RllavaError(f"{path} is not a run's config.yaml: {str(e).splitlines()[0]}") from e
    default = name in (None, "", TrainerConfig.experiment_name)
    return os.path.basename(os.path.normpath(os.path.abspath(outputs_dir))) if default else str(name)


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if key in r]
    return [s for s, _ in points], [v for _, v in points]


def ema(values: list[float], smoothing: float) -> list[float]:
    """TensorBoard's debiased exponential moving average: m_t = w m_{t-1} + (1 - w) x_t (m_0 = 0), shown as
    m_t / (1 - w^t), so the first point is x_1 itself. w = `smoothing` in [0, 1); 0 returns the values as they
    are. A non-finite value is passed through and does not enter the average."""
    if not 0.0 <= smoothing < 1.0:
        raise RllavaError(f"smoothing={smoothing}: expected a weight in [0, 1) (0 = no smoothing)")
    out, m, t = [], 0.0, 0
    for x in values:
        if not math.isfinite(x):
            out.append(x)
            continue
        m, t = smoothing * m + (1 - smoothing) * x, t + 1
        out.append(m / (1 - smoothing ** t))
    return out


def panels(rows: list[dict], run: str) -> list[Panel]:
    """What `plot` draws for these metrics rows: the PANELS the run logged, the reward's parts (every
    `reward/<part>_mean` but accuracy), and one panel per validation metric (`val/<m>` beside `val_greedy/<m>`)."""
    keys = {k for r in rows for k in r}
    specs = {**PANELS, "reward_parts": sorted(k for k in keys if re.fullmatch(r"reward/.+_mean", k)
                                              and k != "reward/accuracy_mean")}
    out = []
    for name, want in specs.items():
        present = [k for k in want if k in keys and (name != "kl" or any(series(rows, k)[1]))]  # KL: not all 0
        if present:
            out.append(Panel(name, f"{name.replace('_', ' ')} · {run}", present, smooth=True))
    for metric in sorted({k.split("/", 1)[1] for k in keys if k.startswith(("val/", "val_greedy/"))}):
        present = [k for k in (f"val/{metric}", f"val_greedy/{metric}") if k in keys]
        out.append(Panel(re.sub(r"[^\w.-]", "_", f"val_{metric}"), f"held-out {metric} · {run}", present, False))
    return out


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(panel: Panel, rows: list[dict], smoothing: float = SMOOTHING):
    """One matplotlib Figure (Agg) for `panel`; training series raw and thin, their EMA bold in the same colour."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for k in panel.keys:
        steps, values = series(rows, k)
        if not panel.smooth:
            ax.plot(steps, values, marker="o", markersize=3, label=k)
        elif smoothing > 0:
            raw, = ax.plot(steps, values, linewidth=0.8, alpha=0.35)
            ax.plot(steps, ema(values, smoothing), color=raw.get_color(), linewidth=2, label=k)
        else:
            ax.plot(steps, values, label=k)
    ax.set(xlabel="step", title=panel.title)
    ax.xaxis.set_major_locator(pyplot().MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot(outputs_dir: str, smoothing: float = SMOOTHING) -> list[str]:
    """Write the PNGs to outputs_dir/plots; returns their paths."""
    ema([], smoothing)  # a bad weight fails before anything is written
    rows = read_metrics(outputs_dir)
    out_dir = os.path.join(outputs_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for panel in panels(rows, run_name(outputs_dir)):
        fig = draw(panel, rows, smoothing)
        written.append(os.path.join(out_dir, f"{panel.name}.png"))
        fig.savefig(written[-1], dpi=100)
        pyplot().close(fig)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllava.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("outputs_dir", help="a run's trainer.outputs_dir (holding metrics.jsonl)")
    parser.add_argument("--smoothing", "--ema", type=float, default=SMOOTHING,
                        help=f"EMA weight in [0, 1) drawn over the raw training curves (default {SMOOTHING}; 0 = off)")
    args = parser.parse_args(argv)
    try:
        for path in plot(args.outputs_dir, args.smoothing):
            print(path)
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
