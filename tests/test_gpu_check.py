"""benchmarks/gpu_check.py (issue 34's one-shot GPU check) runs, as `--tiny --device cpu`, the same code as on a GPU:
both train engines, a planned and a measured column per phase, a throughput row per run (fast, ~15 s)."""

import os
import sys

import pytest
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
    phases = [p for p in gpu_check.PHASES if p != "ref log-prob"]  # the counting config has no KL loss
    assert [(r[1], r[2]) for r in rows] == [(e, p) for e in gpu_check.ENGINES for p in phases]
    for r in rows:
        assert r[3] == "n/a" and float(r[4]) > 0 and r[5] == "n/a |"  # CPU: nothing measured, the plan is there
    second = ("| model | engine | steps | tokens/s | step s | rollout share | update MFU | logprob gap | "
              "trainable params |")
    runs = lines[lines.index(second) + 2:]
    runs = [line.split(" | ") for line in runs if line.startswith("| tiny")]
    assert [r[1] for r in runs] == list(gpu_check.ENGINES)
    for r in runs:
        assert r[2] == "1" and float(r[3]) > 0 and r[6] == "n/a" and float(r[7]) >= 0  # logprob gap logged


@pytest.mark.slow
def test_issue_46_scenarios_run_their_configs_on_tiny_models(tmp_path, monkeypatch):
    """rllava24 (RLLaVA's examples/config.yaml as the file is: the reference's pass is a phase) and research (one
    optimizer step, no KL) plan and train one step each through the same code as on the GPU; research with
    `--keys rollout.hf_decode=static`, the decode A/B of the module docstring (the key reaches the HF engine)."""
    from rllava.engine.inference import hf

    copies, static_copy = [], hf.static_copy
    monkeypatch.setattr(hf, "static_copy", lambda *a, **k: copies.append(1) or static_copy(*a, **k))
    for scenario, phases, keys in (("rllava24", gpu_check.PHASES, []),
                                   ("research", ("rollout", "update", "optimizer"), ["rollout.hf_decode=static"])):
        text = gpu_check.main(["--tiny", "--device", "cpu", "--scenario", scenario, "--no-trl", "--out",
                               str(tmp_path / f"{scenario}.md"), "--root", str(tmp_path / "root"), "--keys", *keys])
        assert len(copies) == (scenario == "research") and ("keys: rollout.hf_decode=static" in text) == bool(keys)
        planned = {line.split(" | ")[2] for line in text.splitlines() if line.startswith("| tiny") and
                   line.count("|") == 7}
        assert set(phases) <= planned, (scenario, planned)
        run = [line for line in text.splitlines() if line.startswith("| tiny") and line.count("|") == 10]
        assert len(run) == 1 and run[0].split(" | ")[2] == "1"
