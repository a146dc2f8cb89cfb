"""The agent_code proof row's GRPO time, this checkout against another commit, from one SFT checkpoint (issue 45).

    python benchmarks/agent_code_grpo.py --out /tmp/proof_code/agent_code [--baseline 16bdbfe]

--out is a `python -m rllava.commands.proof --tasks agent_code` folder (its data/ and sft/final are reused; the GRPO
stage runs again into <out>/grpo, and for the baseline into a copy of data/ and sft/ beside it). --baseline: a
commit checked out in a git worktree under /tmp, run with the same interpreter (16bdbfe: the shared fork server,
before every code call had a jail of its own). The two runs go one after the other; nothing else may run meanwhile
(2 cores). Prints one row per checkout: GRPO seconds (model load, 60 steps, the evaluations), the steps' rollout
and update seconds, and the held-out figures (sampled accuracy, coded, ran) before -> after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = """
import json, os, sys
try:
    from rllava.commands import proof
except ImportError:  # before the commands moved (issue 47)
    from rllava import proof
out = sys.argv[1]
task = proof.TASKS["agent_code"]
common = [f"data.train_files={out}/data/train.jsonl", f"data.val_files={out}/data/val.jsonl", "trainer.seed=0"]
seconds = proof.train_rl(task, out, common)
rows = [json.loads(line) for line in open(os.path.join(out, "grpo", "metrics.jsonl"))]
s = proof.summarize(task, rows, 3)
steps = [r for r in rows if "timing/step" in r]
print("RESULT", json.dumps({"seconds": seconds, "rollout": sum(r["timing/rollout"] for r in steps),
                            "update": sum(r["timing/update"] for r in steps), "steps": len(steps),
                            **{k: s[k] for k in ("sampled_before", "sampled_after", "coded_before", "coded_after",
                                                 "ran_before", "ran_after") if k in s}}))
"""


def run(checkout: str, out: str) -> dict:
    env = {**os.environ, "PYTHONPATH": checkout}
    proc = subprocess.run([sys.executable, "-c", RUN, out], cwd=checkout, env=env, capture_output=True, text=True)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise SystemExit(f"{checkout}: the GRPO run failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="an agent_code proof folder (data/, sft/final)")
    p.add_argument("--baseline", default=None, help="a commit to run the same GRPO stage with, first")
    a = p.parse_args()
    out = os.path.abspath(a.out)
    runs = []
    if a.baseline:
        tree, base_out = f"/tmp/rllava-{a.baseline}", f"{out}-{a.baseline}"
        if not os.path.isdir(tree):
            subprocess.run(["git", "worktree", "add", "-q", tree, a.baseline], cwd=REPO, check=True)
        for sub in ("data", "sft"):
            shutil.rmtree(os.path.join(base_out, sub), ignore_errors=True)
            shutil.copytree(os.path.join(out, sub), os.path.join(base_out, sub))
        runs.append((a.baseline, run(tree, base_out)))
    runs.append(("this checkout", run(REPO, out)))
    print("| checkout | GRPO s | ratio | rollout s | update s | sampled % | coded | ran |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in runs:
        print(f"| {name} | {r['seconds']:.0f} | {r['seconds'] / runs[0][1]['seconds']:.2f} | {r['rollout']:.0f} | "
              f"{r['update']:.0f} | {r['sampled_before']:.1f} -> {r['sampled_after']:.1f} | "
              f"{r['coded_before']:.2f} -> {r['coded_after']:.2f} | {r['ran_before']:.2f} -> {r['ran_after']:.2f} |")


if __name__ == "__main__":
    main()
