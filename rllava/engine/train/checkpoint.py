"""A train engine's state on disk through `torch.distributed.checkpoint` (DCP), in one format for every engine.

Model and optimizer state are keyed by parameter *name* (the format of torch's `get_state_dict`), never by
position or rank, so DCP reshards on load: a checkpoint of 2 FSDP2 ranks resumes on 1 rank, on one device, or on 4.

    save_engine(engine, path)     # every rank calls it; rank 0 also writes the metadata
    load_engine(engine, path)     # same world size or not

Adam's state exists only for parameters that have had a gradient (a vision tower has none after a text-only
batch): loading fills a template with state for every parameter, then drops what the checkpoint lacks, so those
parameters start their moments fresh, as in the run that wrote it.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from contextlib import contextmanager

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from rllava.errors import RllavaError


def optimizer_state_by_name(optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str]) -> dict:
    """`optimizer.state_dict()` with parameter names instead of positions (`names`: optimizer param -> name)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state = {names[p]: dict(optimizer.state[p]) for p in params if p in optimizer.state}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[p] for p in g["params"]]}
              for g in optimizer.param_groups]
    return {"state": state, "param_groups": groups}


def optimizer_state_by_index(state: dict, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str]) -> dict:
    """The inverse of `optimizer_state_by_name`: what `optimizer.load_state_dict` takes."""
    index = {names[p]: i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    return {"state": {index[n]: s for n, s in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]}


@torch.no_grad()
def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter that has no optimizer state yet the state a first step creates, by one step with
    zero gradients at lr = 0 (parameters and existing state untouched)."""
    missing = {id(p) for g in optimizer.param_groups for p in g["params"] if p not in optimizer.state}
    if not missing:
        return
    kept = {p: optimizer.state.pop(p) for p in list(optimizer.state)}
    lrs = [g["lr"] for g in optimizer.param_groups]
    grads = {p: p.grad for g in optimizer.param_groups for p in g["params"]}
    for g in optimizer.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p) if id(p) in missing else None
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr
    for p, grad in grads.items():
        p.grad = grad
    optimizer.state.update(kept)


ENGINE_PARTS = ("model", "optimizer", "scheduler")


@contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group that it assumes a single process: so do we."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def engine_state(engine, parts=ENGINE_PARTS) -> dict:
    """What a checkpoint holds of the engine's state: `parts` of it (`("model",)`: weights only)."""
    return {k: v for k, v in engine.state_dict().items() if k in parts and v is not None}


def save_engine(engine, path: str, parts=ENGINE_PARTS) -> None:  # every rank calls it
    write_state(engine_state(engine, parts), path)


def write_state(state: dict, path: str, group=None) -> None:
    """`torch.distributed.checkpoint.save` of `state` over `group` (None: the default one), every rank calling."""
    with _single_process_quiet():
        dcp.save(state, checkpoint_id=path, process_group=group)


def check_model_state(state: dict, metadata, path: str) -> None:
    """Check that the checkpoint at `path` (its DCP metadata) holds every weight of `state` (full or sharded) in the
    same shape: else one clear error, not a KeyError or a size mismatch deep in DCP."""
    saved = metadata.state_dict_metadata
    missing = [k for k in state if f"model.{k}" not in saved]
    if missing:
        raise RllavaError(f"{path}: the checkpoint lacks {len(missing)} weights of this model, e.g. "
                          f"{missing[0]!r}: was it written for another model?")
    for k, v in state.items():
        shape, want = tuple(getattr(saved[f"model.{k}"], "size", ())), tuple(getattr(v, "shape", ()))
        if shape != want:
            raise RllavaError(f"{path}: weight {k!r} has shape {list(shape)} in the checkpoint but {list(want)} "
                              "in this model: was it written for another model?")


# A checkpoint is data, never code. DCP unpickles its `.metadata` file with plain `pickle.load` and non-tensor
# values (LR schedule, optimizer hyper-parameters) with `torch.load(weights_only=False)`: either would run
# whatever a crafted checkpoint holds. These two classes let only data through (the classes DCP's metadata is
# made of; tensors, containers and numbers for values) and refuse the rest with one line.
METADATA_CLASSES = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
                    ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if ((module, name) in METADATA_CLASSES or module == "torch.distributed.checkpoint.metadata"
                or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, with `.metadata` unpickled through `_MetadataUnpickler`."""

    def read_metadata(self, *args, **kwargs):
        rank = kwargs.get("rank")
        path = os.path.join(str(self.path), ".metadata" if rank is None else f"__{rank}.metadata")
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except pickle.UnpicklingError as e:
            raise RllavaError(f"{path}: refused to load: {e} (a checkpoint is data, not code)") from e
        except (EOFError, ValueError, TypeError, AttributeError) as e:
            raise RllavaError(f"{path}: unreadable ({type(e).__name__}: {e}): a corrupt checkpoint") from e
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.distributed.checkpoint.metadata import StorageMeta
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner; a non-tensor value must load with `weights_only=True` first (then DCP's own
    unpickling of the same bytes can do nothing more than that did)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except Exception as e:  # noqa: BLE001  UnpicklingError, or a truncated stream
            raise RllavaError(f"checkpoint value {read_item.dest_index.fqn!r}: refused to load ("
                              f"{str(e).splitlines()[0][:200]}): a checkpoint is data, not code") from e
        value.seek(0)
        super().load_bytes(read_item, value)


def _dcp_load(state: dict, path: str) -> None:
    with _single_process_quiet():
        dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner())


def read_metadata(path: str):
    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise RllavaError(f"{path}: not a train-engine checkpoint (no .metadata file there)")
    return SafeReader(path).read_metadata()


def load_engine(engine, path: str, parts=ENGINE_PARTS) -> list[str]:
    """Load `path` (written by `save_engine` at any world size) into `engine`, in place: those of `parts` the
    checkpoint holds (the others keep their current state). Returns the parts loaded."""
    metadata = read_metadata(path)
    held = [p for p in parts if any(k.split(".")[0] == p for k in metadata.state_dict_metadata)]
    if "optimizer" in held:
        if hasattr(engine, "init_optimizer_state"):  # DeepSpeed: its own bookkeeping around the optimizer's
            engine.init_optimizer_state()
        else:
            init_optimizer_state(engine.optimizer)
    state = engine.state_dict()
    check_model_state(state["model"], metadata, path)  # a DTensor's shape is the whole weight's
    if "optimizer" in held:
        saved = metadata.state_dict_metadata
        state["optimizer"]["state"] = {
            name: s for name, s in state["optimizer"]["state"].items()
            if all(f"optimizer.state.{name}.{k}" in saved for k in s)}  # state the run that saved it never had
        # hyper-parameters another optimizer class keeps (DeepSpeedCPUAdam's bias_correction, AdamW's foreach)
        # stay as this optimizer has them
        groups = state["optimizer"]["param_groups"]
        state["optimizer"]["param_groups"] = [
            {k: v for k, v in g.items() if k == "params" or f"optimizer.param_groups.{i}.{k}" in saved}
            for i, g in enumerate(groups)]
    _dcp_load({k: state[k] for k in held}, path)
    if "optimizer" in held:
        state["optimizer"]["param_groups"] = [{**g, **loaded} for g, loaded in
                                              zip(groups, state["optimizer"]["param_groups"])]
    engine.load_state_dict(state)
    return held


def load_weights(state: dict, path: str) -> None:
    """Fill a model state dict (full tensors, in place) with the weights of the engine checkpoint at `path`;
    the optimizer state there is not read (`rllava.commands.export`)."""
    check_model_state(state, read_metadata(path), path)
    _dcp_load({"model": state}, path)
