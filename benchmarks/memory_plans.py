"""The memory planner on every seed task script: the peak of one step of each, and how long the plan took.

    python benchmarks/memory_plans.py [--gpu-memory 24GiB] [--scripts examples/tasks/math/*.sh ...]

Each `examples/tasks/*/*.sh` (the tiny CPU ones aside) is run by bash with `python` and `torchrun` replaced by
functions that print their arguments, so what is planned is the command line the script would launch, variables
expanded and nothing executed; its keys go through `load_config` and `rllava.train.memory.planner.plan` on one
of torchrun's --nproc_per_node ranks (see rllava.train.memory's docstring), timed on this machine. A table row
per script: model, GPUs, the phase at the peak, the step's peak and whether it fits `--gpu-memory`, the seconds the
plan took (issue 34: each under a minute on this 2-core CPU) and what the plan counts another way
(`rllava.train.memory.planner.unplanned`).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = ('python() { printf "%s\\x1f" "$@"; printf "\\n"; }; torchrun() { printf "%s\\x1f" "$@"; printf "\\n"; }; '
        'export -f python torchrun; bash "$0"')


def pipeline_args(script: str) -> tuple[list[str], int]:
    """The key=value arguments of the `-m rllava.train.pipeline.X` command `script` launches, and its number of
    processes (torchrun's --nproc_per_node; 1 for python)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "MODEL_PATH", "OUTPUT_DIR", "OUT")}
    out = subprocess.run(["bash", "-c", STUB, script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for line in out.splitlines():
        argv = line.split("\x1f")[:-1]
        if "-m" in argv and argv[argv.index("-m") + 1].startswith("rllava.train.pipeline."):
            nproc = [a.split("=", 1)[1] for a in argv if a.startswith("--nproc_per_node=")]
            return argv[argv.index("-m") + 2:], int(nproc[0]) if nproc else 1
    raise SystemExit(f"{script}: launches no rllava.train.pipeline module")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu-memory", default="24GiB")
    parser.add_argument("--scripts", nargs="+", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, REPO)
    from rllava.commands import memory
    from rllava.train.memory import planner
    from rllava.config import load_config

    gpu = memory.parse_size(args.gpu_memory)
    scripts = args.scripts or sorted(p for p in glob.glob(os.path.join(REPO, "examples/tasks/*/*.sh"))
                                     if "tiny_cpu" not in p)
    print(f"| script | model | GPUs | peak phase | step peak | fits {args.gpu_memory} | plan s | counted another way |\n"
          "|---|---|---|---|---|---|---|---|")
    for script in scripts:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            overrides, world = pipeline_args(script)
            cfg = load_config(overrides)
        start = time.time()
        rows = planner.plan(cfg, gpu, world=world)
        top = max(rows, key=lambda r: r["peak"])
        print(f"| {os.path.relpath(script, REPO)} | {cfg.actor.model.model_path} | {world} | {top['phase']} | "
              f"{memory.show(top['peak'])} | {'yes' if top['fits'] else 'no'} | {time.time() - start:.0f} | "
              f"{'; '.join(planner.unplanned(cfg)) or '-'} |", flush=True)


if __name__ == "__main__":
    main()
