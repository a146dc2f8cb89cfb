"""Training curves as PNG files, from a run's metrics.jsonl:

    python -m rllava.plot OUTPUTS_DIR          -> OUTPUTS_DIR/plots/{reward,accuracy,kl,entropy,...}.png

One figure per quantity a researcher checks first (reward, accuracy, KL, entropy, response length, and every
validation metric), each metric a line over steps; quantities the run did not log are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rllava.errors import RllavaError

PANELS = {
    "reward": ["reward/mean"],
    "accuracy": ["reward/accuracy_mean"],
    "kl": ["actor/kl_loss", "actor/reward_kl", "actor/ppo_kl"],
    "entropy": ["actor/entropy"],
    "response_length": ["response_length/mean", "response_length/max"],
    "loss": ["actor/pg_loss", "critic/vf_loss"],
}


def read_metrics(outputs_dir: str) -> list[dict]:
    path = os.path.join(outputs_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise RllavaError(f"{path} does not exist: give the trainer.outputs_dir of a run")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if key in r]
    return [s for s, _ in points], [v for _, v in points]


def plot(outputs_dir: str) -> list[str]:
    """Write the PNGs; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = read_metrics(outputs_dir)
    keys = {k for r in rows for k in r}
    panels = dict(PANELS, validation=sorted(k for k in keys if k.startswith(("val/", "val_greedy/"))
                                            and not k.endswith("response_length")))
    out_dir = os.path.join(outputs_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, panel in panels.items():
        present = [k for k in panel if k in keys]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for k in present:
            ax.plot(*series(rows, k), marker="o" if name == "validation" else None, markersize=3, label=k)
        ax.set(xlabel="step", title=name.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllava.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("outputs_dir", help="a run's trainer.outputs_dir (holding metrics.jsonl)")
    args = parser.parse_args(argv)
    try:
        for path in plot(args.outputs_dir):
            print(path)
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
