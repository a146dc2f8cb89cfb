"""Compare runs: their curves overlaid, a table of final and best validation metrics, the config keys that differ.

    python -m rllava.commands.compare RUN_DIR RUN_DIR ... [--out DIR] [--group-by KEY ...] [--smoothing auto|0.9]

- One PNG per metric in OUT (default ./compare): reward/mean, reward/accuracy_mean, every val/* and val_greedy/*
  metric, the KL terms, actor/entropy, response_length/mean (a metric every run logged as 0 is left out); the
  training curves raw (thin) and smoothed (bold) as `rllava.commands.plot` draws them, the validation metrics as measured;
  left panel against the step, right panel against
  wall-clock (`time/elapsed_s` of metrics.jsonl, see rllava.train.tracker; a run logged before that field existed
  falls back to the running sum of `timing/step`, which leaves out validation and checkpoints, with a note).
  The legend names each run by its directory (the path below the runs' common parent when two share a name).
- A table, printed and written to OUT/compare.md: each run's final (last logged) and best (highest, with its step)
  value of each validation metric but the response lengths, then the keys of the runs' config.yaml that differ.
  Keys that say where and how a run was launched rather than what it trained (NOT_COMPARED) are left out, and a
  path written relatively in one run and absolutely in another (the same file) is the same value.
- `--group-by trainer.seed`: runs whose configs differ only in that key (and NOT_COMPARED) form one group, shown
  as the mean over its runs with a ± one standard deviation band per step, and as `mean ± std` over the runs'
  final and best values in the table (std: the sample standard deviation, n-1; 0 for a group of one). A group is
  named by the keys that differ between groups. `python -m rllava.commands.sweep` groups its seeds this way.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import dataclass

from omegaconf import OmegaConf

from rllava.commands import command_parser
from rllava.config.loader import _flatten
from rllava.config.schema import DERIVED_KEYS
from rllava.errors import RllavaError
from rllava.commands.plot import SMOOTHING, ema, read_metrics, smoothed, smoothing_arg

CURVES = ["reward/mean", "reward/accuracy_mean", "actor/kl_loss", "actor/reward_kl", "actor/ppo_kl",
          "actor/entropy", "response_length/mean"]  # then every validation metric
VALIDATION = ("val/", "val_greedy/")
# Where and how a run was launched, not what it trained: always differ between runs, or say nothing of the result.
NOT_COMPARED = ("trainer.outputs_dir", "trainer.experiment_name", "trainer.save_checkpoint_path",
                "trainer.load_checkpoint_path", "trainer.resume", "trainer.overwrite")


@dataclass
class Run:
    name: str
    path: str
    rows: list[dict]
    clock: list[float]  # wall-clock seconds of each row
    config: dict  # flat: dotted key -> value


def flat_config(text: str) -> dict:
    """A config.yaml's text as {dotted key: value} (mapping-valued keys, e.g. reward_function_kwargs, stay whole),
    without the copies of other keys a run's config.yaml writes as RLLaVA's does (rollout.prompt_length, ...)."""
    flat = {}
    _flatten(OmegaConf.to_container(OmegaConf.create(text)) or {}, "", flat)
    return {k: v for k, v in flat.items() if k not in DERIVED_KEYS}


def config_changes(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every compared key that differs between two flat configs."""
    return [f"{k}: {show(old.get(k))} -> {show(new.get(k))}" for k in sorted(old.keys() | new.keys())
            if k not in NOT_COMPARED and show(old.get(k)) != show(new.get(k))]


def show(value) -> str:
    """A config value as the table writes and compares it: a path (or `file.py:fn`) to an existing file as its
    absolute path, so `./r.py:fn` and `/repo/r.py:fn` are one value (relative paths resolve from this directory,
    where the runs are usually launched)."""
    if not isinstance(value, str):
        return json.dumps(value)
    path, sep, fn = value.rpartition(":") if ".py:" in value else (value, "", "")
    return os.path.abspath(path) + sep + fn if path and os.path.exists(path) else value


def run_names(paths: list[str]) -> list[str]:
    """Each run's directory name; the path below the common parent when two runs share a name."""
    paths = [os.path.abspath(p) for p in paths]
    if len(set(paths)) < len(paths):
        raise RllavaError(f"a run directory is given twice: {' '.join(p for p in paths if paths.count(p) > 1)}")
    names = [os.path.basename(p) for p in paths]
    if len(set(names)) < len(names):
        parent = os.path.commonpath(paths)
        names = [os.path.relpath(p, parent) for p in paths]
    return names


def load_run(path: str, name: str) -> tuple[Run, str | None]:
    """The run in `path` and a note when its wall-clock is the fallback; bad input -> one line naming the file."""
    try:
        rows = read_metrics(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # a line that is not JSON
        raise RllavaError(f"{os.path.join(path, 'metrics.jsonl')}: not a metrics file ({e})") from e
    config_file = os.path.join(path, "config.yaml")
    if not os.path.isfile(config_file):
        raise RllavaError(f"{config_file} does not exist: give a run's folder, "
                          "<trainer.outputs_dir>/<project_name>/<experiment_name>")
    try:
        with open(config_file) as f:
            config = flat_config(f.read())
    except Exception as e:  # noqa: BLE001  yaml / omegaconf parse errors
        raise RllavaError(f"{config_file}: not a config ({' '.join(str(e).split())[:200]})") from e
    note = None
    if all("time/elapsed_s" in r for r in rows):
        clock = [r["time/elapsed_s"] for r in rows]
    else:
        clock, total = [], 0.0
        for r in rows:
            total += r.get("timing/step", 0.0)
            clock.append(total)
        note = (f"{name}: metrics.jsonl has no time/elapsed_s (logged before it existed): its wall-clock is the "
                "sum of timing/step, without validation and checkpoint time")
    return Run(name, path, rows, clock, config), note


def points(run: Run, key: str) -> dict[int, tuple[float, float]]:
    """step -> (wall-clock seconds, value) of `key` (the last row of a step, if several)."""
    return {r["step"]: (t, r[key]) for r, t in zip(run.rows, run.clock) if key in r}


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def group_runs(runs: list[Run], group_by: list[str]) -> dict[str, list[Run]]:
    """Runs by their config without `group_by` (and NOT_COMPARED); each group named by the keys that differ
    between groups, e.g. `adv_estimator=grpo`. Without group_by every run is its own group."""
    if not group_by:
        return {r.name: [r] for r in runs}
    missing = [k for k in group_by if not any(k in r.config for r in runs)]
    if missing:
        raise RllavaError(f"--group-by {missing[0]}: no run's config.yaml has that key")
    ignored = set(NOT_COMPARED) | set(group_by)
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(json.dumps({k: v for k, v in r.config.items() if k not in ignored}, sort_keys=True,
                                     default=str), []).append(r)
    configs = [g[0].config for g in groups.values()]
    keys = sorted(k for k in set().union(*configs) - ignored if len({show(c.get(k)) for c in configs}) > 1)
    short = short_keys(keys)
    return {" ".join(f"{short[k]}={show(g[0].config.get(k))}" for k in keys) or "all": g for g in groups.values()}


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key by its shortest suffix that no other key ends with: actor.optim.lr -> lr."""
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(o != k and (o == tail or o.endswith("." + tail)) for o in keys):
                break
        out[k] = tail
    return out


def fmt(x: float) -> str:
    return f"{x:.4g}"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """An aligned markdown table."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def table(runs: list[Run], groups: dict[str, list[Run]], grouped: bool) -> str:
    """The validation table, then the config keys that differ between runs (see the module docstring)."""
    metrics = sorted({k for r in runs for row in r.rows for k in row
                      if k.startswith(VALIDATION) and not k.endswith("response_length")})
    rows = []
    for key in metrics:
        for name, members in groups.items():
            series = [p for p in (points(r, key) for r in members) if p]
            if not series:
                continue
            finals = [p[max(p)][1] for p in series]
            bests = [max(p.items(), key=lambda sp: sp[1][1]) for p in series]  # (step, (t, value)), first highest
            if grouped:
                rows.append([key, name, str(len(series)), *(" ± ".join(map(fmt, mean_std(v))) for v in
                                                            (finals, [b[1][1] for b in bests]))])
            else:
                rows.append([key, name, f"{fmt(finals[0])} (step {max(series[0])})",
                             f"{fmt(bests[0][1][1])} (step {bests[0][0]})"])
    head = ["metric", "group", "runs", "final (mean ± std)", "best (mean ± std)"] if grouped else \
        ["metric", "run", "final", "best"]
    out = ["validation: final = last value logged, best = highest",
           markdown(head, rows) if rows else "(no run logged a validation metric)", ""]
    keys = sorted(k for k in set().union(*(r.config for r in runs)) - set(NOT_COMPARED)
                  if len({show(r.config.get(k)) for r in runs}) > 1)
    group_of = {id(r): n for n, g in groups.items() for r in g}
    if keys:
        out += ["config keys that differ:", markdown(["run", *(["group"] if grouped else []), *keys],
                [[r.name, *([group_of[id(r)]] if grouped else []), *(show(r.config.get(k)) for k in keys)]
                 for r in runs])]
    else:
        out.append("config keys that differ: none")
    out.append(f"(not compared: {', '.join(NOT_COMPARED)})")
    return "\n".join(out)


def plot_metric(key: str, groups: dict[str, list[Run]], grouped: bool, out_dir: str,
                smoothing: float | None = SMOOTHING) -> str:
    """One PNG, two panels: `key` against the step and against wall-clock; a line per run (or per group's mean,
    with a ± std band); a training curve raw and thin under its EMA (`rllava.commands.plot.ema`)."""
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    span = max((t for g in groups.values() for r in g for t in r.clock), default=0.0)
    unit, scale = ("h", 3600) if span > 3 * 3600 else ("min", 60) if span > 600 else ("s", 1)
    for name, members in groups.items():
        series = [p for p in (points(r, key) for r in members) if p]
        if not series:
            continue
        steps = sorted(set().union(*series))
        at = [[p[s] for p in series if s in p] for s in steps]  # each step: (t, value) of the runs that logged it
        mean, std = zip(*(mean_std([v for _, v in a]) for a in at))
        clock = [statistics.fmean(t for t, _ in a) / scale for a in at]
        marker = "o" if len(steps) < 30 else None
        smooth = not key.startswith(VALIDATION) and (smoothing is None or smoothing > 0)
        for ax, x in ((by_step, steps), (by_time, clock)):
            label = f"{name} (n={len(series)})" if grouped else name
            if smooth:
                line = smoothed(ax, x, mean, smoothing, label)
            else:
                line, = ax.plot(x, mean, marker=marker, markersize=3, label=label)
            if grouped and len(series) > 1:
                ax.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                color=line.get_color(), alpha=0.2)
    by_step.set(xlabel="step", ylabel=key)
    by_time.set(xlabel=f"wall-clock ({unit})")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    fig.suptitle(key + (" (mean ± std over each group's runs)" if grouped else ""))
    fig.tight_layout()
    path = os.path.join(out_dir, key.replace("/", "_").replace("@", "_at_") + ".png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def compare(run_dirs: list[str], out_dir: str = "compare", group_by: list[str] | None = None,
            smoothing: float | None = SMOOTHING) -> dict:
    """Write the PNGs and OUT/compare.md; returns {"table": text, "notes": [...], "plots": [paths]}."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    ema([], smoothing)  # a bad weight fails before anything is read
    loaded = [load_run(p, n) for p, n in zip(run_dirs, run_names(run_dirs))]
    runs, notes = [r for r, _ in loaded], [n for _, n in loaded if n]
    grouped = bool(group_by)
    groups = group_runs(runs, group_by or [])
    text = table(runs, groups, grouped)
    logged = {k for r in runs for row in r.rows for k in row}
    metrics = [k for k in CURVES if k in logged] + sorted(k for k in logged if k.startswith(VALIDATION))
    os.makedirs(out_dir, exist_ok=True)
    plots = [plot_metric(k, groups, grouped, out_dir, smoothing) for k in metrics  # logged, and not all 0
             if any(isinstance(r.get(k), (int, float)) and math.isfinite(r[k]) and r[k] != 0
                    for run in runs for r in run.rows)]
    with open(os.path.join(out_dir, "compare.md"), "w") as f:
        f.write("\n".join([text, *notes]) + "\n")
    return {"table": text, "notes": notes, "plots": plots}


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("compare", __doc__)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="runs' folders (<outputs_dir>/<project_name>/<experiment_name>)")
    parser.add_argument("--out", default="compare", help="where the PNGs and compare.md go (default ./compare)")
    parser.add_argument("--group-by", action="append", default=[], metavar="KEY",
                        help="average runs that differ only in KEY (e.g. trainer.seed); repeatable")
    parser.add_argument("--smoothing", "--ema", type=smoothing_arg, default=SMOOTHING,
                        help="EMA weight over the training curves (default auto, as rllava.commands.plot; 0 = off)")
    args = parser.parse_args(argv)
    try:
        result = compare(args.run_dirs, args.out, args.group_by, args.smoothing)
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(result["table"])
    for note in result["notes"]:
        print(f"note: {note}")
    print(f"{len(result['plots'])} PNGs in {args.out}/: {' '.join(os.path.basename(p) for p in result['plots'])}")


if __name__ == "__main__":
    main()
