"""The planner's fake mode: rllava's training forward on fake tensors, what they cannot compute run on real values."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys

import torch

from rllava.train.memory.torch_private import fake_constants, fake_tensors, module_to, real_tensors, real_value


def real_values(x):
    """`x` with each fake constant replaced by its real value (inside tuples, lists, dicts and the tensor fields
    of a dataclass such as a Batch)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: real_values(getattr(x, f.name)) for f in dataclasses.fields(x)
                                         if f.init and torch.is_tensor(getattr(x, f.name))})
    if isinstance(x, (tuple, list)):
        return type(x)(real_values(v) for v in x)
    return {k: real_values(v) for k, v in x.items()} if isinstance(x, dict) else real_value(x)


def on_real_values(fn, counted: tuple[str, ...] = ()):
    """`fn` run on the real values of its (constant) arguments, outside the fake mode: index arithmetic a fake
    tensor cannot answer (.tolist(), nonzero) in transformers' vision helpers and get_rope_index, and rllava's
    shared-prefix layout. Its output tensors come back as fake constants, each holding a fake tensor of its size
    for as long as it lives (the tracker counts that: on a GPU they are on the device); `counted`: output
    entries that need no values (the shared-prefix mask), made again as plain fake tensors."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with real_tensors():
            out = fn(*real_values(args), **real_values(kwargs))
        redo = {k: out.pop(k) for k in counted}
        out = fake_constants(out, made=lambda t: setattr(t, "rllava_storage", torch.empty(t.shape, dtype=t.dtype)))
        return {**out, **{k: torch.zeros(t.shape, dtype=t.dtype) for k, t in redo.items()}} if counted else out
    run.rllava_original = fn
    return run


def _vision_helpers():
    """(module, name) of every transformers `get_vision_*` helper bound in a loaded module."""
    import transformers.vision_utils as vision_utils

    return [(mod, name) for mod in list(sys.modules.values())
            if getattr(mod, "__name__", "").startswith("transformers.models.") or mod is vision_utils
            for name in list(vars(mod)) if name.startswith("get_vision_")]


def _same_shapes(a, b) -> bool:
    """shared_prefix._same_media for planned rows (a group's rows share its image by construction; FSDP2's mixed
    precision casts each row's pixels apart, and fake pixels have no values to compare)."""
    return a.mm_inputs.keys() == b.mm_inputs.keys() and all(
        a.mm_inputs[k].shape == b.mm_inputs[k].shape for k in a.mm_inputs)


@contextlib.contextmanager
def fake_mode():
    """FakeTensorMode in which rllava's training forward runs on a Qwen-VL: integer tensors up to 2^24 elements
    stay constants; transformers' `get_vision_*` helpers (a modeling module imported inside binds the wrapped
    one) and rllava's shared-prefix layout run on real values (`on_real_values`); nn.Module.to replaces tensors
    (peft moves each new adapter to its layer's device and dtype); all restored on exit."""
    import rllava.model.forward as forward
    import rllava.model.shared_prefix as shared_prefix

    patches = [(mod, name, on_real_values(getattr(mod, name))) for mod, name in _vision_helpers()
               if getattr(mod, name).__module__ == "transformers.vision_utils"]
    patches += [(forward, "prefix_layout", on_real_values(forward.prefix_layout)),
                (forward, "layout_inputs", on_real_values(forward.layout_inputs, counted=("attention_mask",))),
                (torch.nn.Module, "to", module_to), (shared_prefix, "_same_media", _same_shapes)]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    for mod, name, new in patches:
        setattr(mod, name, new)
    try:
        with fake_tensors(constant_numel=1 << 24):
            yield
    finally:
        for mod, name, old in saved:
            setattr(mod, name, old)
        for mod, name in _vision_helpers():
            setattr(mod, name, getattr(getattr(mod, name), "rllava_original", getattr(mod, name)))

