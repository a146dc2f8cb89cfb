"""Makes PyPI's CUDA torchvision importable on the CPU torch, on machines that cannot reach PyTorch's CPU wheel index
(where a CPU torchvision installs and none of this is needed). Test-only: `make test-vllm` puts this folder on
PYTHONPATH (so vLLM's model-inspection subprocess gets it too), and tests/engine/test_vllm*.py run it in-process.

torchvision 0.28's `_C` ops (nms, roi_align, image decoding) cannot load against the CPU torch; torchvision then
imports without them (`extension._has_ops()` False) except that `_meta_registrations.py` registers fake kernels for
`torchvision::nms` and `torchvision::qnms` unguarded, which fails on an undefined operator ("operator
torchvision::nms does not exist"). Defining those two schemas first is all it takes: its Python transforms
(`transforms.v2.functional`), which transformers' Qwen-VL image and video processors and vLLM's Qwen-VL models use,
work; its C++ ops stay unavailable. Nothing happens where `_C` loads (a CPU torchvision) or torchvision is absent.
"""

import importlib.util
import os


def _define_missing_torchvision_ops() -> None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return
    import torch

    try:
        torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
    except OSError:  # a CUDA build: the schemas its meta registrations expect (once per process)
        for op in ("nms", "qnms"):
            try:
                torch._C._dispatch_find_schema_or_throw(f"torchvision::{op}", "")
            except RuntimeError:
                torch.library.define(f"torchvision::{op}",
                                     "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


_define_missing_torchvision_ops()
