"""benchmarks/gpu_check.py (issue 34's one-shot GPU check) runs, as `--tiny --device cpu`, the same code as on a GPU:
both train engines, a planned and a measured column per phase, a throughput row per run (fast, ~15 s)."""

import os
import sys

import torch.distributed as dist

from rllava import distributed as D

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import gpu_check  # noqa: E402


def test_gpu_check_tiny_on_cpu_writes_its_table(tmp_path):
    out = tmp_path / "gpu_check.md"
    joined = dist.is_initialized()
    try:
        text = gpu_check.main(["--tiny", "--device", "cpu", "--out", str(out), "--root", str(tmp_path / "root")])
    finally:  # fsdp2 as one rank joined a process group of one: leave the process as it was
        if dist.is_initialized() and not joined:
            dist.destroy_process_group()
            D._joined = False
    assert out.read_text() == text
    lines = text.splitlines()
    header = "| model | engine | phase | measured peak GiB | planned peak GiB | ratio |"
    rows = [line.split(" | ") for line in lines[lines.index(header) + 2:] if line.startswith("| tiny")][:8]
    assert [(r[1], r[2]) for r in rows] == [(e, p) for e in gpu_check.ENGINES for p in gpu_check.PHASES]
    for r in rows:
        assert r[3] == "n/a" and float(r[4]) > 0 and r[5] == "n/a |"  # CPU: nothing measured, the plan is there
    second = "| model | engine | steps | tokens/s | update MFU | logprob gap | trainable params |"
    runs = lines[lines.index(second) + 2:]
    runs = [line.split(" | ") for line in runs if line.startswith("| tiny")]
    assert [r[1] for r in runs] == list(gpu_check.ENGINES)
    for r in runs:
        assert r[2] == "1" and float(r[3]) > 0 and r[4] == "n/a" and float(r[5]) >= 0  # logprob gap logged
