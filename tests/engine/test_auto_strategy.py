"""actor.strategy=auto with RLLaVA's meaning (issue 46): RLLaVA's CPU offload switches (actor.fsdp.enable_cpu_offload,
offload_params) run FSDP2 with its CPUOffloadPolicy on one GPU too, as RLLaVA's examples/config.yaml asks; on a CPU
(no device memory to save) the single-device engine, with no process group. The GPU is given, not needed."""

import pytest
import torch

from rllava.config import load_config
from rllava.config.schema import resolve_strategy
from rllava.engine.train.fsdp2 import FSDP2Engine
from rllava.engine.train.single import SingleDeviceEngine
from rllava.train import builders as B

EXAMPLE = "config=examples/config.yaml"  # RLLaVA's: enable_cpu_offload, offload_params, offload_optimizer all true
CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize("overrides, device, world, expected", [
    ([], "cuda", 1, "fsdp2"), ([], CUDA, 1, "fsdp2"), ([], "cpu", 1, "single"), ([], CPU, 2, "fsdp2"),
    (["actor.fsdp.enable_cpu_offload=false"], "cuda", 1, "fsdp2"),  # offload_params alone: RLLaVA's FSDP2 switch
    (["actor.fsdp.offload_params=false"], "cuda", 1, "fsdp2"),
    (["actor.fsdp.enable_cpu_offload=false", "actor.fsdp.offload_params=false"], "cuda", 1, "single"),
    (["actor.strategy=single"], "cuda", 1, "single"), (["actor.strategy=deepspeed"], "cpu", 1, "deepspeed"),
])
def test_auto_follows_rllavas_offload_switches_on_a_gpu(overrides, device, world, expected):
    a = load_config([EXAMPLE, *overrides]).actor
    assert resolve_strategy(a.strategy, world, a.fsdp, device) == expected
    assert resolve_strategy("auto", 1) == "single"  # no fsdp section: one plain process


def _engine(cfg, device):
    return B._engine(torch.nn.Linear(4, 2), cfg.actor.optim, device, 1.0, None, updates=1, key="actor.optim",
                     strategy=cfg.actor.strategy, fsdp=cfg.actor.fsdp, deepspeed=cfg.actor.deepspeed)


def test_examples_config_builds_fsdp2_with_host_offload_on_a_gpu_and_the_single_engine_on_a_cpu(monkeypatch):
    """On CUDA: FSDP2Engine with CPUOffloadPolicy (cpu_optimizer), its frozen models too; setup_run makes the
    one-rank process group. On the CPU: the single-device engine, and no process group."""
    cfg = load_config([EXAMPLE])
    prepared = []
    monkeypatch.setattr(FSDP2Engine, "prepare", lambda self, model, *_: prepared.append(model) or model)
    engine = _engine(cfg, CUDA)
    assert isinstance(engine, FSDP2Engine) and prepared and engine.cpu_optimizer and engine.offload_optimizer
    assert FSDP2Engine(CUDA, 1.0, offload_params=True).cpu_optimizer  # offload_params alone: the same policy
    assert isinstance(_engine(cfg, CPU), SingleDeviceEngine)
    groups = []
    monkeypatch.setattr(B.D, "group_of_one", groups.append)
    for device in (CPU, CUDA):
        monkeypatch.setattr(B.D, "init", lambda _: device)
        B.setup_run(cfg)
    assert groups == [CUDA]


def test_a_model_whose_shards_rest_on_the_host_runs_its_forwards_on_the_mesh_device():
    """FSDP2's CPU offload keeps a frozen model's shards (the reference of RLLaVA's config) on the host, as
    DTensors of a CUDA mesh: its no-grad passes must send the micro-batches to the mesh's device, not to the
    host where the parameters rest (on the H100 the reference's first forward failed: "index is on cpu")."""
    from types import SimpleNamespace

    from rllava.model.forward import compute_device as _device

    offloaded = torch.nn.Linear(2, 2)
    offloaded.weight.device_mesh = SimpleNamespace(device_type="cuda")  # what a CPU-offloaded DTensor reports
    assert _device(offloaded) == torch.device("cuda")
    assert _device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    on_cpu = torch.nn.Linear(2, 2)
    on_cpu.weight.device_mesh = SimpleNamespace(device_type="cpu")  # FSDP2 over gloo: computes where it rests
    assert _device(on_cpu) == torch.device("cpu")
