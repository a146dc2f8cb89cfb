"""Every torch private API the memory planner uses, each behind a function with a plain name; a torch upgrade that
changes one fails in tests/test_memory_shim.py, which calls each function directly and names the API."""

from __future__ import annotations

import contextlib

import torch
import torch._subclasses.fake_tensor as fake_tensor
import torch.utils._pytree as pytree
from torch._guards import active_fake_mode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule


@contextlib.contextmanager
def fake_tensors(constant_numel: int):
    """torch._subclasses.fake_tensor.FakeTensorMode (real inputs allowed) with CONSTANT_NUMEL_LIMIT = constant_numel."""
    saved, fake_tensor.CONSTANT_NUMEL_LIMIT = fake_tensor.CONSTANT_NUMEL_LIMIT, constant_numel
    try:
        with fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
            yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = saved


def real_tensors():
    """torch._subclasses.fake_tensor.unset_fake_temporarily(): plain tensors made inside a fake mode."""
    return fake_tensor.unset_fake_temporarily()


def real_value(x):
    """FakeTensor.constant: the tensor a fake constant holds; anything else (a plain fake tensor too) as it is."""
    return x.constant if isinstance(x, fake_tensor.FakeTensor) and x.constant is not None else x


def fake_constants(tree, made=lambda fake: None):
    """`tree`'s plain tensors (torch.utils._pytree) as fake constants holding them, `made(constant)` on each one new
    (fake_tensor_converter.from_real_tensor(make_constant=True)) in torch._guards.active_fake_mode(); else `tree`."""
    mode = active_fake_mode()

    def fake(t):
        if isinstance(t, fake_tensor.FakeTensor):
            return t
        constant = mode.fake_tensor_converter.from_real_tensor(mode, t, make_constant=True)
        if constant.constant is t:  # not the memo of a fake made from it before, without its value
            made(constant)
        return constant
    return tree if mode is None else pytree.tree_map_only(torch.Tensor, fake, tree)


def module_to(module, *args, **kwargs):
    """nn.Module.to by replacing each tensor (torch._C._nn._parse_to, Module._parameters / _buffers): fake-safe."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                new = None if t is None else t.to(device=device, dtype=dtype if t.is_floating_point() else None)
                if new is not t:
                    table[name] = torch.nn.Parameter(new, t.requires_grad) if table is m._parameters else new
    return module


def scale_(tensors: list[torch.Tensor], factor: torch.Tensor) -> None:
    """torch._foreach_mul_(tensors, factor): each tensor times `factor`, in place."""
    torch._foreach_mul_(tensors, factor)


@contextlib.contextmanager
def fake_process_group(world: int):
    """torch.distributed's "fake" backend (torch.testing._internal FakeStore), rank 0 of `world`; yields a CPU mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()


def fsdp_groups(model) -> list:
    """The FSDP2 units' parameter groups (FSDPModule._get_fsdp_state()._fsdp_param_group)."""
    return [g for g in (m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule))
            if g is not None]


@contextlib.contextmanager
def gathered(model):
    """Every FSDP2 unit unsharded (FSDPModule._get_fsdp_state()._fsdp_param_group); yields their unsharded bytes."""
    groups = fsdp_groups(model)
    for group in groups:
        group.unshard()
        group.wait_for_unshard()
    try:
        yield sum(p.unsharded_param.numel() * p.unsharded_param.element_size() for g in groups for p in g.fsdp_params)
    finally:
        for group in groups:
            group.reshard()


class _DevicePeak:
    """torch's memory trackers keeping only the peak of what is on the device: `host` kinds are tracked but live in
    host memory. They skip the per-module peaks, which cost a pass over every module at every op (minutes at 3B).
    `echo`: the bytes of a gradient that autograd sums from two uses (a tied embedding's two gradients). The
    tracker keeps a reference to every storage, which stops autograd's in-place sum (input_buffer.cpp's
    can_accumulate_inplace wants the storage's only reference), so a third copy, the out-of-place sum, appears that
    a plain run never holds (a 1 GiB tied weight: 2 GiB more RSS plain, 3 GiB tracked; H200, Qwen3-VL-4B: the
    update's peak held two 0.72 GiB copies where the tracker saw three). A peak holding it is taken without it."""
    host: tuple[str, ...] = ()
    echo: int = 0

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        # a frozen parameter (the reference, a frozen tower) takes no gradient hook: torch refuses one; a module
        # mixing both leaves its parameters to its submodules' hooks
        return super()._track_module_params_and_buffers(
            module, install_grad_hooks=install_grad_hooks and all(p.requires_grad for p in module.parameters()))

    def _on_device(self, snap: dict) -> int:
        return snap["Total"] - sum(snap.get(k, 0) for k in self.host)

    def __enter__(self):
        super().__enter__()  # its peak so far is the Total on entry: only what is on the device counts here
        self._peak_mem = {dev: self._on_device(snap) for dev, snap in self._peak_mem_snap.items()}
        return self

    def _update_peak_stats(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < self._on_device(snap):
                held = self.echo and snap.get("Temp", 0) >= 3 * self.echo and sum(  # (the count only when it can)
                    w.reftype == "Temp" and 0 <= w.mem_consumed - self.echo < 512 for w, _ in self._WINFO.values())
                echo = self.echo if held and held >= 3 else 0
                snap = {**snap, "Total": snap["Total"] - echo, **({"Temp": snap["Temp"] - echo} if echo else {})}
                if self._peak_mem.get(dev, 0) < self._on_device(snap):
                    self._peak_mem[dev], self._peak_mem_snap[dev] = self._on_device(snap), snap


class _PeakTracker(_DevicePeak, MemTracker):
    def _pre_fw_hook(self, module, inputs) -> None:
        try:
            super()._pre_fw_hook(module, inputs)
        except NotImplementedError:  # a second forward of the root (several micro-batches): torch's per-module
            self.reset_mod_stats()  # stats refuse it; the device-wide peak goes on
            super()._pre_fw_hook(module, inputs)


class _FSDPPeakTracker(_DevicePeak, FSDPMemTracker):
    def track_external(self, *modules) -> None:  # other FSDP2 modules' shards (torch tracks its root's only)
        for group in (g for m in modules for g in fsdp_groups(m)):
            self._instrument_fsdp_sharded_params_grads(group)


def device_peak(run, model, optimizer, *external, host: tuple[str, ...] = (), echo: int = 0) -> dict[str, int]:
    """Bytes by kind at the device's peak in run() (torch.distributed._tools' MemTracker / FSDPMemTracker); `echo`:
    see _DevicePeak."""
    fsdp = isinstance(model, FSDPModule)
    tracker = _FSDPPeakTracker(model, optimizer) if fsdp else _PeakTracker()
    tracker.host, tracker.echo = host, echo
    tracker.track_external(*external, *(() if fsdp else (model, optimizer)))
    with tracker:
        run()
    return {k: v for dev in tracker.get_tracker_snapshot("peak").values() for k, v in dev.items()}
