"""rllava.train.memory.torch_private, the planner's only door to torch's private APIs: each function called
directly on tiny tensors, so that a torch upgrade that changes one of those APIs fails here, naming it."""

import contextlib

import pytest
import torch

from rllava.train.memory import torch_private as shim
from rllava.train.memory.planner import COLUMNS


@contextlib.contextmanager
def api(name: str):
    """Any error inside is reported as `name` having changed under this torch."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - reported, with its type, as the API that broke
        pytest.fail(f"torch {torch.__version__}: {name} changed ({type(e).__name__}: {e}); "
                    "update rllava/train/memory/torch_private.py", pytrace=False)


def test_fake_tensors_constants_and_real_values():
    with api("torch._subclasses.fake_tensor (FakeTensorMode, CONSTANT_NUMEL_LIMIT, unset_fake_temporarily, "
             "FakeTensor.constant), torch._guards.active_fake_mode, torch.utils._pytree"):
        import torch._subclasses.fake_tensor as fake_tensor

        FakeTensor, limit, ids = fake_tensor.FakeTensor, fake_tensor.CONSTANT_NUMEL_LIMIT, torch.arange(100)
        assert shim.fake_constants({"ids": ids})["ids"] is ids, "fake_constants outside a fake mode: the tree as is"
        with shim.fake_tensors(constant_numel=1 << 24):
            made = torch.zeros(3)
            assert isinstance(made, FakeTensor), "FakeTensorMode: a tensor made inside is not a FakeTensor"
            assert shim.real_value(made) is made, "FakeTensor.constant: a plain fake tensor holds a value"
            with shim.real_tensors():
                plain = torch.arange(100)
            assert not isinstance(plain, FakeTensor), "unset_fake_temporarily: a tensor made inside it is fake"
            converted = []
            tree = shim.fake_constants({"ids": plain, "rest": [made, 1]}, made=converted.append)
            assert isinstance(tree["ids"], FakeTensor) and shim.real_value(tree["ids"]) is plain, \
                "fake_tensor_converter.from_real_tensor(make_constant=True): not a constant holding its tensor"
            assert converted == [tree["ids"]] and tree["rest"] == [made, 1], "torch.utils._pytree.tree_map_only"
            assert torch.equal(shim.real_value(tree["ids"] + 1), plain + 1), \
                "CONSTANT_NUMEL_LIMIT: arithmetic on a 100-element constant no longer gives a constant"
        assert fake_tensor.CONSTANT_NUMEL_LIMIT == limit, "fake_tensors: CONSTANT_NUMEL_LIMIT not restored"


def test_module_to_replaces_parameters_and_buffers():
    with api("torch._C._nn._parse_to, nn.Module._parameters / _buffers"):
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        model[0].weight.requires_grad_(False)
        assert shim.module_to(model, torch.float64) is model
        assert model[0].weight.dtype == model[1].running_mean.dtype == torch.float64, "_parse_to: dtype not read"
        assert model[1].num_batches_tracked.dtype == torch.long, "an integer buffer changed dtype"
        assert isinstance(model[0].bias, torch.nn.Parameter) and not model[0].weight.requires_grad
        shim.module_to(model, device="cpu", dtype=torch.float32)
        assert model[0].weight.dtype == torch.float32, "_parse_to: keyword dtype not read"


def test_scale_multiplies_in_place():
    with api("torch._foreach_mul_"):
        tensors = [torch.ones(2), torch.ones(3)]
        shim.scale_(tensors, torch.tensor(0.5))
        assert all(torch.equal(t, torch.full_like(t, 0.5)) for t in tensors), "torch._foreach_mul_"


def _step(host=()):
    """device_peak of one forward, backward and AdamW step of a fresh Linear, a frozen one beside it."""
    model, frozen = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters())
    return shim.device_peak(lambda: (model(torch.ones(8, 64)).sum().backward(), optimizer.step()), model, optimizer,
                            frozen, host=host)


def test_device_peak_files_every_kind_under_a_column():
    with api("torch.distributed._tools.mem_tracker.MemTracker (its private hooks and peak fields)"):
        snap, host = _step(), _step(host=("Parameter",))
    known = {k for kinds in COLUMNS.values() for k in kinds} | {"Total"}
    assert set(snap) <= known, f"MemTracker files kinds the planner has no column for: {set(snap) - known}"
    assert snap["Parameter"] == 2 * (64 * 64 + 64) * 4 and snap["Optstate"] > 0, "MemTracker's counts"
    assert host == snap, "MemTracker's peak without a kind that never changes is another moment"


def test_fake_process_group_gathered_and_the_fsdp_tracker():
    import torch.distributed as dist

    from rllava.engine.train.fsdp2 import shard_model

    with api("torch.testing._internal.distributed.fake_pg.FakeStore"), shim.fake_process_group(2) as mesh:
        assert dist.get_world_size() == 2 and dist.get_rank() == 0 and mesh.size() == 2
        model = shard_model(torch.nn.Sequential(torch.nn.Linear(8, 8)), torch.device("cpu"), mesh=mesh)
        with api("FSDPModule._get_fsdp_state()._fsdp_param_group (unshard, wait_for_unshard, reshard, "
                 "fsdp_params, unsharded_param)"):
            with shim.gathered(model) as weights:
                assert weights == (8 * 8 + 8) * 4, "the unsharded weights' bytes"
            with shim.gathered(torch.nn.Linear(2, 2)) as none:
                assert none == 0, "a model without FSDP2 units gathers nothing"
        with api("torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker (its private hooks)"):
            optimizer = torch.optim.AdamW(model.parameters())
            snap = shim.device_peak(lambda: model(torch.ones(4, 8)).sum().backward(), model, optimizer)
        assert snap.get("Sharded Param") == (8 * 8 + 8) * 4 // 2, "FSDPMemTracker: one rank's shards"
    assert not dist.is_initialized(), "fake_process_group: the group outlives it"


def test_device_peak_counts_a_tied_weights_two_gradients_summed_in_place():
    """A tied weight (an embedding that is also the LM head) gets two gradients, which autograd sums in place; under
    the tracker it sums them out of place, a third copy a plain run never holds (a 1 GiB tied weight: 2 GiB more
    RSS plain, 3 GiB tracked). With `echo` = that gradient's bytes the peak holds the two copies."""
    weight = torch.nn.Parameter(torch.randn(4096, 64))
    model, size = torch.nn.ParameterList([weight]), 4096 * 64 * 4
    optimizer = torch.optim.AdamW(model.parameters())

    def step():
        weight.grad = None
        h = torch.nn.functional.embedding(torch.arange(8), weight) * 2
        (h @ weight.T).logsumexp(-1).sum().backward()
    with api("torch.distributed._tools.mem_tracker.MemTracker (_WINFO's reftype and mem_consumed)"):
        plain, echo = (shim.device_peak(step, model, optimizer, echo=e) for e in (0, size))
        plain, echo = dict(plain), dict(echo)
    assert plain["Parameter"] == echo["Parameter"] == size
    assert plain["Temp"] == 3 * size + plain["Temp"] % size and echo["Temp"] == 2 * size + echo["Temp"] % size, \
        (plain, echo)  # the summed gradient, and small scratch (logits, h)
