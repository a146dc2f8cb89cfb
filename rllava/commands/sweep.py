"""A grid of runs, one normal run per point, then `rllava.commands.compare` over them.

    python -m rllava.commands.sweep config=examples/config.yaml algorithm.adv_estimator=grpo,rloo trainer.seed=1,2,3 \\
        trainer.max_steps=100 [--parallel] [--out DIR] [--pipeline rlvr]

- An override whose value has a comma outside brackets and quotes is an axis, one value per comma; any other is
  fixed. A value that itself holds commas is bracketed or quoted as on the training command line:
  `data.train_files=[a.jsonl,b.jsonl],[c.jsonl]` is an axis of two lists, `k="a,b"` one string. Every point is
  checked before the first run starts: by the config loader, then its registered names (estimator, losses, loss
  terms; algorithm.plugins imported first) by the run's own start-up lookup (rllava.train.builders.named_algorithm).
- Each point runs through the normal CLI (`python -m rllava.train.pipeline.<pipeline> config=... k=v ...`), one
  after another, into OUT/<name>, where OUT is the run folder of the config (RLLaVA's layout:
  <trainer.outputs_dir>/<project_name>/<experiment_name>; `--out DIR` sets trainer.outputs_dir, a fixed
  trainer.experiment_name=NAME the last part) and <name> is the point's values, e.g. `adv_estimator=grpo+seed=1`;
  its stdout and stderr are appended to OUT/<name>/train.log. The sweep sets each run's experiment_name
  (<NAME>/<name>), resume and overwrite itself.
- Launched again, the sweep skips a point whose dir holds `final/` (and stops with one line if that run's config
  differs from the point's), resumes one that holds checkpoints (trainer.resume=auto) and restarts one that holds
  a run's outputs but no checkpoint (trainer.overwrite=true).
- `--parallel`: one run per GPU at a time (CUDA_VISIBLE_DEVICES=<that GPU> for each); without a GPU, one line
  and nothing runs (drop --parallel to run the grid one after another).
- A failed run is reported (its name, exit status, last log line and log file) and the sweep goes on; the exit
  status is 1 when any run failed, 2 for a bad grid, 130 when interrupted (launch again to go on).
- At the end, `rllava.commands.compare` over the finished runs into OUT/compare/ (PNGs and compare.md, the table also
  printed), with seed axes (SEED_KEYS) averaged: mean ± std over the seeds of each setting.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from queue import Queue

from rllava.commands import command_parser
from rllava.commands.compare import compare, config_changes, flat_config, short_keys
from rllava.config import config_to_yaml, load_config
from rllava.errors import RllavaError

SET_BY_SWEEP = ("trainer.resume", "trainer.overwrite", "trainer.save_checkpoint_path", "trainer.load_checkpoint_path")
ONE_VALUE = {"config": "one config file per sweep; sweep over its keys instead",
             "trainer.experiment_name": "names the sweep's folder (each point runs in <it>/<name>): give one value"}
SEED_KEYS = ("trainer.seed", "data.seed", "rollout.seed")  # axes averaged over by the final compare
PIPELINES = ("rlvr", "sft", "sft_rl", "agentic")


def split_values(text: str) -> list[str]:
    """`a,[b,c],"d,e"` -> ['a', '[b,c]', '"d,e"']: the commas outside brackets, braces and quotes."""
    values, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    return values + [text[start:]]


@dataclass
class Point:
    name: str
    overrides: list[str]  # config=..., the fixed k=v, then this point's k=v
    outputs_dir: str
    action: str = "run"  # run | resume | restart | skip

    @property
    def log(self) -> str:
        return os.path.join(self.outputs_dir, "train.log")


def expand(args: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(fixed arguments, {axis key: values}) from `config=FILE k=v k=v1,v2 ...`."""
    fixed, axes, seen = [], {}, set()
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise RllavaError(f"sweep argument '{arg}' is not key=value or key=v1,v2 (or config=FILE)")
        if key in seen:
            raise RllavaError(f"{key} is given twice: give it once, its values separated by commas")
        seen.add(key)
        if key in SET_BY_SWEEP:
            raise RllavaError(f"{key} is set by the sweep for each run (runs go to <outputs_dir>/<project_name>/"
                              "<experiment_name>/<name>): drop it")
        values = split_values(value)
        if len(values) == 1:
            fixed.append(arg)
        elif not all(values):
            raise RllavaError(f"{arg}: an empty value between commas (quote a value that holds a comma)")
        elif key in ONE_VALUE:
            raise RllavaError(f"{arg}: {ONE_VALUE[key]}")
        else:
            axes[key] = values
    return fixed, axes


def point_name(values: dict[str, str]) -> str:
    """`adv_estimator=grpo+seed=1`: each varied key by its short name, a path by its last part; characters a
    directory name should not hold become '-'."""
    short = short_keys(list(values))
    parts = [f"{short[k]}={os.path.basename(v.rstrip('/')) if '/' in v else v}" for k, v in values.items()]
    return re.sub(r"[^A-Za-z0-9._=+@-]+", "-", "+".join(parts)) or "run"


def plan(fixed: list[str], axes: dict[str, list[str]], pipeline: str = "rlvr") -> tuple[str, list[Point]]:
    """Every point of the grid, its config checked (the loader's checks, then the registered names as the run's
    start-up looks them up: `named_algorithm`), its dir and what to do there; (sweep dir, points)."""
    from rllava.train import checkpoint as C  # torch: only once the grid parses
    from rllava.train.builders import named_algorithm, run_outputs_dir
    from rllava.train import outputs as O

    def checked(args: list[str], name: str):
        try:
            cfg = load_config(args)
            named_algorithm(cfg, sft=pipeline == "sft")
            return cfg
        except RllavaError as e:
            raise RllavaError(f"point {name}: {e}") from e

    combos = [dict(zip(axes, vs)) for vs in itertools.product(*axes.values())]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said again in each run's log
        out, points, names = None, [], {}
        for values in combos:
            name = point_name(values)
            if name in names:
                raise RllavaError(f"two points of the grid get the name {name} ({names[name]} and {values}): "
                                  "make their values differ in letters, digits or . _ - @ +")
            names[name] = values
            args = [*fixed, *fixed_of(values)]
            cfg = checked(args, name)
            out = out or run_outputs_dir(cfg)  # the sweep dir: the first point's run folder
            run_dir = os.path.join(run_outputs_dir(cfg), name)
            args = [a for a in args if not a.startswith("trainer.experiment_name=")]  # the sweep's: now the point's
            args.append(f"trainer.experiment_name={cfg.trainer.experiment_name}/{name}")
            point = Point(name, args, run_dir)
            if os.path.isdir(os.path.join(run_dir, "final")):
                saved = os.path.join(run_dir, "config.yaml")
                if not os.path.isfile(saved):
                    raise RllavaError(f"{run_dir} holds final/ but no config.yaml, not a run of this sweep: delete "
                                      "it, or choose another --out")
                with open(saved) as f:
                    changes = config_changes(flat_config(f.read()), flat_config(config_to_yaml(cfg, ran=True)))
                if changes:
                    more = f"; {len(changes) - 5} more" if len(changes) > 5 else ""
                    raise RllavaError(f"{run_dir} holds a finished run whose config differs from this point's "
                                      f"({'; '.join(changes[:5])}{more}): delete that dir to run the point again, "
                                      "or choose another --out")
                point.action = "skip"
            elif C.list_checkpoints(C.checkpoint_root(cfg, run_dir)):
                point.action, point.overrides = "resume", [*args, "trainer.resume=auto"]
            elif os.path.isdir(run_dir) and O.held_outputs(cfg, run_dir):
                point.action, point.overrides = "restart", [*args, "trainer.overwrite=true"]
            points.append(point)
    return out, points


def fixed_of(values: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in values.items()]


def command(pipeline: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", f"rllava.train.pipeline.{pipeline}", *overrides]


def visible_gpus() -> list[str]:
    """The GPUs a child may be given: CUDA_VISIBLE_DEVICES's entries if set, else every device torch sees."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def launch(point: Point, pipeline: str, gpu: str | None = None) -> tuple[int, float]:
    """Run one point through the pipeline's CLI, its output appended to its train.log; (exit status, seconds)."""
    os.makedirs(point.outputs_dir, exist_ok=True)
    cmd, env = command(pipeline, point.overrides), dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    start = time.time()
    with open(point.log, "a") as log:
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {point.action}"
                  f"{f' on GPU {gpu}' if gpu is not None else ''}: {shlex.join(cmd)}\n")
        log.flush()
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    return code, time.time() - start


def last_line(path: str) -> str:
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f.read()[-20000:].splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def sweep(args: list[str], out: str | None = None, parallel: bool = False, pipeline: str = "rlvr") -> int:
    """Run the grid (see the module docstring); returns the exit status."""
    fixed, axes = expand(args)
    if out is not None:
        if any(a.startswith("trainer.outputs_dir=") for a in fixed):
            raise RllavaError("--out sets trainer.outputs_dir: give one of them")
        fixed.append(f"trainer.outputs_dir={out}")
    out, points = plan(fixed, axes, pipeline)
    gpus = visible_gpus() if parallel else []
    if parallel and not gpus:
        raise RllavaError("--parallel runs one run per GPU and this machine shows none (CUDA_VISIBLE_DEVICES, "
                          "torch.cuda): drop --parallel to run the grid one after another")
    todo = [p for p in points if p.action != "skip"]
    print(f"sweep: {len(points)} runs in {out} ({len(points) - len(todo)} finished before, skipped)"
          + (f", {min(len(gpus), len(todo))} at a time on GPUs {','.join(gpus)}" if parallel else ""), flush=True)
    for p in points:
        if p.action == "skip":
            print(f"  {p.name}: finished, skipped", flush=True)
    failed = []
    free: Queue = Queue()
    for g in gpus:
        free.put(g)

    def run(p: Point) -> None:
        gpu = free.get() if parallel else None
        print(f"  {p.name}: {p.action}{' (resume=auto)' if p.action == 'resume' else ''}"
              f"{' (no checkpoint: overwrite=true)' if p.action == 'restart' else ''}"
              f"{f' on GPU {gpu}' if gpu is not None else ''}, log {p.log}", flush=True)
        try:
            code, seconds = launch(p, pipeline, gpu)
        finally:
            if parallel:
                free.put(gpu)
        if code == 130:
            raise KeyboardInterrupt
        if code:
            failed.append(p)
            print(f"  {p.name}: FAILED (exit status {code}): {last_line(p.log)}\n    log: {p.log}", flush=True)
        else:
            print(f"  {p.name}: done in {seconds:.0f}s", flush=True)

    pool = ThreadPoolExecutor(max_workers=len(gpus) if parallel else 1)
    try:
        for future in [pool.submit(run, p) for p in todo]:
            future.result()
    finally:  # an interrupt: the runs not started yet are not started
        pool.shutdown(cancel_futures=True)
    finished = [p.outputs_dir for p in points if os.path.isdir(os.path.join(p.outputs_dir, "final"))]
    if finished:
        group_by = [k for k in axes if k in SEED_KEYS]
        result = compare(finished, os.path.join(out, "compare"), group_by)
        print(result["table"])
        for note in result["notes"]:
            print(f"note: {note}")
        print(f"{len(result['plots'])} PNGs in {os.path.join(out, 'compare')}/"
              + (f" (mean ± std over {', '.join(group_by)})" if group_by else ""))
    if failed:
        print(f"sweep: {len(failed)} of {len(points)} runs failed:", file=sys.stderr)
        for p in failed:
            print(f"  {p.name}: {p.log}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("sweep", __doc__)
    parser.add_argument("overrides", nargs="*", metavar="KEY=V1,V2", help="config=FILE, fixed and swept keys")
    parser.add_argument("--out", help="trainer.outputs_dir of every run: the runs go to "
                        "OUT/<project_name>/<experiment_name>/<name>")
    parser.add_argument("--parallel", action="store_true", help="one run per GPU at a time")
    parser.add_argument("--pipeline", default="rlvr", choices=PIPELINES, help="rllava.train.pipeline.<name>")
    args = parser.parse_intermixed_args(argv)
    try:
        code = sweep(args.overrides, args.out, args.parallel, args.pipeline)
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("sweep interrupted: launch the same command again to go on (finished runs are skipped, the "
              "interrupted ones resume from their last checkpoint)", file=sys.stderr)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
