"""A train engine's state on disk through `torch.distributed.checkpoint` (DCP), in one format for every engine.

Model and optimizer state are keyed by parameter *name* (the format of torch's `get_state_dict`), never by
position or rank, so DCP reshards on load: a checkpoint written by 2 FSDP2 ranks resumes on 1 rank, on the
single-device engine, or on 4 ranks.

    save_engine(engine, path)     # every rank calls it; rank 0 also writes the metadata
    load_engine(engine, path)     # same world size or not

Adam's state exists only for parameters that have had a gradient (a vision tower never sees one in a
text-only batch). Loading therefore fills a template with state for every parameter, then drops what the
checkpoint does not hold, so those parameters start their moments fresh, as they would have in the run
that wrote it.
"""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

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


def save_engine(engine, path: str) -> None:
    dcp.save(engine.state_dict(), checkpoint_id=path)


def load_engine(engine, path: str) -> None:
    """Load `path` (written by `save_engine` at any world size) into `engine`, in place."""
    try:
        saved = set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
    except (FileNotFoundError, OSError) as e:
        raise RllavaError(f"{path}: not a train-engine checkpoint ({e})") from e
    init_optimizer_state(engine.optimizer)
    state = engine.state_dict()
    missing_model = [k for k in state["model"] if f"model.{k}" not in saved]
    if missing_model:
        raise RllavaError(f"{path}: the checkpoint lacks {len(missing_model)} weights of this model, e.g. "
                          f"{missing_model[0]!r}: was it written for another model?")
    state["optimizer"]["state"] = {
        name: s for name, s in state["optimizer"]["state"].items()
        if all(f"optimizer.state.{name}.{k}" in saved for k in s)}  # state the run that saved it never had
    dcp.load(state, checkpoint_id=path)
    engine.load_state_dict(state)
