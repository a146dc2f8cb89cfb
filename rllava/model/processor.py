"""Loading a VLM processor with or without torchvision.

transformers 5.x builds Qwen-VL processors with a video processor that imports torchvision, and there is no CPU
build of torchvision for our torch. So a processor may be saved as an *image-only* subclass of the model's own
processor class (same image-token logic, no video processor); `load_processor` picks:

1. a saved image-only processor -> that class (works everywhere);
2. a standard processor (a real checkpoint) -> `AutoProcessor`; if that fails only because torchvision is
   missing, the image-only subclass is built from the checkpoint's own image processor and tokenizer;
3. a text-only checkpoint -> its tokenizer.
"""

from __future__ import annotations

import json
import os
from functools import cache

from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer


def _base_processor_class(arch: str):
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor

    return {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}[arch]


@cache
def image_only_processor_class(arch: str):
    """The model's processor class minus transformers' video processor (attributes: image_processor, tokenizer);
    its `video_processor` is rllava's PIL one, so videos work too."""
    base = _base_processor_class(arch)

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # The base __init__ passes (image, tokenizer, video) to ProcessorMixin, which zips them with *our*
        # attribute list (read from this signature), so the missing video processor is simply not an attribute.
        base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def video_processor(self):
        # Videos through the PIL image processor (rllava.model.video_processor); not a saved attribute.
        from rllava.model.video_processor import PilVideoProcessor

        return PilVideoProcessor(self.image_processor)

    name = base.__name__.replace("Processor", "ImageOnlyProcessor")
    return type(name, (base,), {"__init__": __init__, "__module__": __name__,
                                "video_processor": property(video_processor)})


IMAGE_ONLY_CLASSES = {image_only_name: arch for arch, image_only_name in [
    ("qwen2_vl", "Qwen2VLImageOnlyProcessor"), ("qwen2_5_vl", "Qwen2_5_VLImageOnlyProcessor"),
    ("qwen3_vl", "Qwen3VLImageOnlyProcessor")]}


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def load_processor(path: str, trust_remote_code: bool = False):
    """Processor (or tokenizer for text-only models) for the checkpoint directory `path`."""
    processor_class = _read_json(os.path.join(path, "processor_config.json")).get("processor_class")
    if processor_class in IMAGE_ONLY_CLASSES:
        return image_only_processor_class(IMAGE_ONLY_CLASSES[processor_class]).from_pretrained(path)
    model_type = _read_json(os.path.join(path, "config.json")).get("model_type")
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (ImportError, AttributeError, ValueError) as e:
        if model_type not in {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"} or "torchvision" not in _chain_text(e).lower():
            raise
        image_processor = AutoImageProcessor.from_pretrained(path, backend="pil")
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        return image_only_processor_class(model_type)(image_processor=image_processor, tokenizer=tokenizer,
                                                      chat_template=tokenizer.chat_template)
    return processor


def _chain_text(e: BaseException) -> str:
    """All messages in an exception chain (torchvision import errors are often wrapped)."""
    parts = []
    while e is not None:
        parts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return " | ".join(parts)


def get_tokenizer(processor):
    """The tokenizer inside a processor, or the object itself for text-only models."""
    return getattr(processor, "tokenizer", processor)
