"""DeepSpeed without a launcher (docs/engines.md, "Launching"): a plain `python -m` process runs as a world of one,
and the first run on a machine says that it compiles DeepSpeed's C++ ops before it does (issue 62 item 5)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from rllava.train.outputs import keys_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="DeepSpeed not installed (pip install 'rllava[deepspeed]')")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # ~11 s of CPU: importing DeepSpeed in a fresh process
def test_no_accelerator_guess_on_a_cpu():
    """Any rllava command that saves a model imports DeepSpeed (accelerate's `extract_model_from_parallel`, in
    transformers' save_pretrained), whose accelerator detection warns "Setting accelerator to CPU" when no CUDA is
    found (deepspeed/accelerator/real_accelerator.py `get_accelerator`) unless DS_ACCELERATOR names one: rllava.model
    names the CPU first (issue 62 item 11). On a GPU machine the detection runs as DeepSpeed's."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: DeepSpeed detects it itself")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    res = subprocess.run([sys.executable, "-c", "import rllava.model.tiny, deepspeed; "
                          "from deepspeed.accelerator import get_accelerator; print(get_accelerator()._name)"],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert res.returncode == 0 and res.stdout.split()[-1] == "cpu", res.stderr[-2000:]
    assert "Setting accelerator" not in res.stdout + res.stderr


@pytest.mark.slow  # ~50 s (minutes more on a machine that never built DeepSpeed's ops)
def test_plain_python_runs_deepspeed_as_a_world_of_one(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                        monkeypatch):
    """The documented `python -m rllava.train.pipeline.rlvr ... actor.strategy=deepspeed`, no torchrun: it died in
    DeepSpeed's argument check (deepspeed/runtime/engine.py `_do_args_sanity_check`: `assert "LOCAL_RANK" in
    os.environ`) with a 40-line traceback, since rllava's group of one left the environment unset. Now one step
    trains and writes its metrics; the compile notice appears exactly when an op was still to be built."""
    import deepspeed

    from rllava.engine.train.deepspeed import ops_to_build

    building = ops_to_build(deepspeed, cpu_adam=True)  # actor.deepspeed.enable_cpu_offload: on by default
    _check_ops_to_build(deepspeed, ops_to_build, tmp_path / "extensions", monkeypatch)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    res = subprocess.run([sys.executable, "-m", "rllava.train.pipeline.rlvr",
                          "config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
                          f"data.train_files={counting_dir}/train.jsonl", "data.val_files=null",
                          "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2",
                          "trainer.max_steps=1", "trainer.val_before_train=false", "trainer.val_freq=-1",
                          "trainer.logger=[jsonl]", *keys_for(out), f"reward.reward_function={distinct_reward}",
                          "actor.strategy=deepspeed"],
                         capture_output=True, text=True, cwd=REPO, env={**env, "OMP_NUM_THREADS": "1"}, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1] and "actor/grad_norm" in rows[-1]
    assert ("rllava: DeepSpeed compiles" in res.stderr) == bool(building)


def _check_ops_to_build(deepspeed, ops_to_build, folder, monkeypatch):
    """On a CPU DeepSpeed's comm backend loads the shm op (deepspeed/comm/torch.py `build_shm_op`) and ZeRO-Offload
    the cpu_adam op (deepspeed/ops/adam/cpu_adam.py); each is JIT-built by `torch.utils.cpp_extension.load` into
    `_get_build_directory(name)` unless its `<name>.so` is there already (or the install prebuilt it)."""
    from torch.utils.cpp_extension import _get_build_directory

    with monkeypatch.context() as m:
        m.setenv("TORCH_EXTENSIONS_DIR", str(folder))
        assert ops_to_build(deepspeed, cpu_adam=True) == ["deepspeed_shm_comm", "cpu_adam"]
        assert ops_to_build(deepspeed, cpu_adam=False) == ["deepspeed_shm_comm"]
        built = _get_build_directory("deepspeed_shm_comm", False)
        os.makedirs(built, exist_ok=True)
        open(os.path.join(built, "deepspeed_shm_comm.so"), "w").close()
        assert ops_to_build(deepspeed, cpu_adam=True) == ["cpu_adam"]
