"""Training curves as PNG files, from a run's metrics.jsonl:

    python -m rllava.commands.plot OUTPUTS_DIR [--smoothing auto|0.9] [--out DIR]  -> DIR (default OUTPUTS_DIR/plots)/*.png

One figure per quantity a researcher checks first (reward or score, accuracy, the reward's own parts, KL, entropy,
response length, losses) and one per validation metric (sampled and greedy on one axis, as measured), each with
its y-axis named. Training curves are drawn raw (thin) and smoothed (bold) by `ema`, by default with a weight
that averages over ~5% of the run's steps (`auto_smoothing`: a trend through a few hundred noisy steps, the raw
curve for a few dozen); titles carry the run's name (`run_name`). Quantities the run did not log are skipped,
and so are series that stay 0 (a run without a KL term: no KL panel).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass

from rllava.commands import command_parser
from rllava.errors import RllavaError

PANELS = {
    "reward": ["reward/mean", "reward/score"],  # score: a reward that is not an accuracy (evaluate.headline)
    "accuracy": ["reward/accuracy_mean"],
    "kl": ["actor/kl_loss", "actor/reward_kl", "actor/ppo_kl"],
    "entropy": ["actor/entropy"],
    "response_length": ["response_length/mean", "response_length/max"],
    "loss": ["actor/pg_loss", "critic/vf_loss"],
}
SMOOTHING = None  # auto_smoothing: the weight follows the run's length
YLABELS = {"reward": "reward", "accuracy": "accuracy", "kl": "KL", "entropy": "entropy (nats / token)",
           "response_length": "tokens", "loss": "loss", "reward_parts": "reward part"}


@dataclass
class Panel:
    name: str  # the PNG's name
    title: str
    keys: list[str]  # the series drawn, each a line over steps
    smooth: bool  # training curves: raw + EMA; validation: points as measured
    ylabel: str = ""


def read_metrics(outputs_dir: str) -> list[dict]:
    path = os.path.join(outputs_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise RllavaError(f"{path} does not exist: give a run's folder, "
                          "<trainer.outputs_dir>/<project_name>/<experiment_name>")
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


def auto_smoothing(n: int) -> float:
    """The EMA weight whose window spans ~5% of `n` steps: w = 1 - 2 / (k + 1) with k = n // 20 (an EMA of weight w
    averages like a k-step moving mean); 0 (the raw curve) below 40 steps, 0.87 at 300, 0.96 at 1000."""
    k = max(1, n // 20)
    return 1.0 - 2.0 / (k + 1)


def ema(values: list[float], smoothing: float | None) -> list[float]:
    """TensorBoard's debiased exponential moving average: m_t = w m_{t-1} + (1 - w) x_t (m_0 = 0), shown as
    m_t / (1 - w^t), so the first point is x_1 itself. w = `smoothing` in [0, 1); 0 returns the values as they
    are; None: `auto_smoothing(len(values))`. A non-finite value is passed through and does not enter the
    average."""
    smoothing = auto_smoothing(len(values)) if smoothing is None else smoothing
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
        present = [k for k in want if k in keys and any(series(rows, k)[1])]  # a series all 0 says nothing
        if present:
            out.append(Panel(name, f"{name.replace('_', ' ')} · {run}", present, True, YLABELS[name]))
    for metric in sorted({k.split("/", 1)[1] for k in keys if k.startswith(("val/", "val_greedy/"))}):
        present = [k for k in (f"val/{metric}", f"val_greedy/{metric}") if k in keys]
        out.append(Panel(re.sub(r"[^\w.-]", "_", f"val_{metric}"), f"held-out {metric} · {run}", present, False,
                         metric))
    return out


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(panel: Panel, rows: list[dict], smoothing: float | None = SMOOTHING):
    """One matplotlib Figure (Agg) for `panel`; training series raw and thin, their EMA bold in the same colour."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for k in panel.keys:
        steps, values = series(rows, k)
        if not panel.smooth:
            ax.plot(steps, values, marker="o", markersize=3, label=k)
        else:
            smoothed(ax, steps, values, smoothing, k)
    ax.set(xlabel="step", ylabel=panel.ylabel, title=panel.title)
    ax.xaxis.set_major_locator(pyplot().MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def smoothed(ax, x, values, smoothing: float | None, label: str):
    """A training curve: raw (thin, faint) under its EMA (bold, the same colour), or raw alone at smoothing 0;
    returns the labelled line (rllava.commands.compare draws its curves the same way)."""
    if smoothing == 0:
        line, = ax.plot(x, values, label=label)
        return line
    raw, = ax.plot(x, values, linewidth=0.8, alpha=0.35)
    line, = ax.plot(x, ema(list(values), smoothing), color=raw.get_color(), linewidth=2, label=label)
    return line


def plot(outputs_dir: str, smoothing: float | None = SMOOTHING, out_dir: str | None = None) -> list[str]:
    """Write the PNGs to `out_dir` (default outputs_dir/plots); returns their paths."""
    ema([], smoothing)  # a bad weight fails before anything is written
    rows = read_metrics(outputs_dir)
    out_dir = out_dir or os.path.join(outputs_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for panel in panels(rows, run_name(outputs_dir)):
        fig = draw(panel, rows, smoothing)
        written.append(os.path.join(out_dir, f"{panel.name}.png"))
        fig.savefig(written[-1], dpi=100)
        pyplot().close(fig)
    return written


def smoothing_arg(text: str) -> float | None:
    """--smoothing: `auto` (None) or a weight, checked by `ema`."""
    return None if text == "auto" else float(text)


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("plot", __doc__)
    parser.add_argument("outputs_dir", help="a run's folder, <outputs_dir>/<project_name>/<experiment_name> "
                        "(holding metrics.jsonl)")
    parser.add_argument("--smoothing", "--ema", type=smoothing_arg, default=SMOOTHING,
                        help="EMA weight in [0, 1) drawn over the raw training curves (default auto: ~5%% of the "
                             "run's steps; 0 = off)")
    parser.add_argument("--out", default=None, help="where the PNGs go (default OUTPUTS_DIR/plots)")
    args = parser.parse_args(argv)
    try:
        for path in plot(args.outputs_dir, args.smoothing, args.out):
            print(path)
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
