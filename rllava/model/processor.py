"""Loading a VLM processor with or without torchvision.

transformers 5.x builds Qwen-VL processors with a video processor that imports torchvision, which has no CPU build
for our torch. So a processor may be an *image-only* subclass of the model's own processor class (same image-token
logic; videos through rllava's PIL video processor). `load_processor` gives a saved image-only processor its class,
a standard one (a real checkpoint) `AutoProcessor`, or the image-only subclass when that fails only for want of
torchvision, and a text-only checkpoint its tokenizer. The image-only processor saves what the standard one writes
(its `processor_class` in processor_config.json, preprocessor_config.json and tokenizer_config.json, plus a
`video_processor` entry: the source checkpoint's, else built from the image processor's patch geometry and
normalization), so `AutoProcessor.from_pretrained` with torchvision loads the standard processor from it.
"""

from __future__ import annotations

import copy
import json
import os
from functools import cache

import transformers
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

from rllava.model.hub import local_copy

# each Qwen-VL model's standard processor class (the one its checkpoint names)
STANDARD_CLASSES = {"Qwen2VLProcessor": "qwen2_vl", "Qwen2_5_VLProcessor": "qwen2_5_vl", "Qwen3VLProcessor": "qwen3_vl"}
# the names `image_only_processor_class` gives them
IMAGE_ONLY_CLASSES = {name.replace("Processor", "ImageOnlyProcessor"): arch for name, arch in STANDARD_CLASSES.items()}
# transformers' video processor for each model (torchvision-backed; named in the export, never imported here).
VIDEO_PROCESSOR_CLASSES = {"qwen2_vl": "Qwen2VLVideoProcessor", "qwen2_5_vl": "Qwen2VLVideoProcessor",
                           "qwen3_vl": "Qwen3VLVideoProcessor"}
# Image processor settings a video processor shares (the vision tower's patch geometry and normalization).
_SHARED_WITH_VIDEO = ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "do_rescale",
                      "rescale_factor", "do_normalize", "do_convert_rgb", "resample")


@cache
def image_only_processor_class(arch: str):
    """The model's processor class minus transformers' video processor (attributes: image_processor, tokenizer);
    its `video_processor` is rllava's PIL one."""
    base = getattr(transformers, next(name for name, a in STANDARD_CLASSES.items() if a == arch))

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # The base __init__ passes (image, tokenizer, video) to ProcessorMixin, which zips them with *our*
        # attribute list (read from this signature), so the missing video processor is simply not an attribute.
        base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def video_processor(self):
        # Videos through the PIL image processor (rllava.model.video_processor); not a saved attribute.
        from rllava.model.video_processor import PilVideoProcessor

        return PilVideoProcessor(self.image_processor)

    def video_processor_dict(self) -> dict:
        """The standard processor's `video_processor` entry: the source checkpoint's (`source_video_processor`,
        set by `load_processor`) or one from the image processor's shared settings."""
        if getattr(self, "source_video_processor", None):
            return dict(self.source_video_processor)
        image = self.image_processor.to_dict()
        return {"video_processor_type": VIDEO_PROCESSOR_CLASSES[arch],
                **{k: image[k] for k in _SHARED_WITH_VIDEO if k in image}}

    def to_dict(self) -> dict:
        # processor_config.json as the standard processor writes it: its class name, and a video processor.
        out = base.to_dict(self)
        out.pop("source_video_processor", None)
        return {**out, "video_processor": self.video_processor_dict(), "processor_class": base.__name__}

    def save_pretrained(self, save_directory, **kwargs):
        files = base.save_pretrained(self, save_directory, **kwargs)
        _name_processor_class(os.path.join(save_directory, "tokenizer_config.json"), base.__name__)
        # transformers 4.x (and tools reading the older layout) take the image processor from here.
        image = {**self.image_processor.to_dict(), "processor_class": base.__name__}
        with open(os.path.join(save_directory, "preprocessor_config.json"), "w") as f:
            json.dump(image, f, indent=2, sort_keys=True)
        return files

    name = base.__name__.replace("Processor", "ImageOnlyProcessor")
    return type(name, (base,), {"__init__": __init__, "__module__": __name__,
                                "video_processor": property(video_processor),
                                "video_processor_dict": video_processor_dict, "to_dict": to_dict,
                                "save_pretrained": save_pretrained})


def _name_processor_class(path: str, name: str) -> None:
    """Set `processor_class` in a saved json file (tokenizer_config.json names the processor that saved it)."""
    config = _read_json(path)
    if config.get("processor_class") and config["processor_class"] != name:
        config["processor_class"] = name
        with open(path, "w") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def load_processor(path: str, trust_remote_code: bool = False):
    """Processor (or tokenizer for text-only models) for the checkpoint directory (or hub id) `path`; a hub id while
    the hub is out of reach from the local hub cache's copy (`rllava.model.hub`)."""
    path = local_copy(path)
    if not path:
        raise OSError("not in the local hub cache, and the hub cannot be reached to download it")
    processor_config = _read_json(os.path.join(path, "processor_config.json"))
    processor_class = processor_config.get("processor_class")
    if processor_class in IMAGE_ONLY_CLASSES:  # saved by an rllava before the export named the standard class
        return image_only_processor_class(IMAGE_ONLY_CLASSES[processor_class]).from_pretrained(path)
    # the processor class decides (Qwen3.5 checkpoints use Qwen3VLProcessor), else the model's type
    model_type = STANDARD_CLASSES.get(processor_class) or _read_json(os.path.join(path, "config.json")).get("model_type")
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (ImportError, AttributeError, ValueError) as e:
        if model_type not in {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"} or "torchvision" not in _chain_text(e).lower():
            raise
        image_processor = AutoImageProcessor.from_pretrained(path, backend="pil")
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        processor = image_only_processor_class(model_type)(image_processor=image_processor, tokenizer=tokenizer,
                                                           chat_template=tokenizer.chat_template)
        # kept for the export: the checkpoint's own video settings (nested, or in video_preprocessor_config.json)
        processor.source_video_processor = (processor_config.get("video_processor")
                                            or _read_json(os.path.join(path, "video_preprocessor_config.json")))
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


def with_pixel_bounds(processor, min_pixels: int | None, max_pixels: int | None):
    """A copy of `processor` whose Qwen-VL image processor bounds an image's pixels as training did
    (data.min_pixels / max_pixels: its `size` shortest_edge / longest_edge count pixels), so that the export
    sees images at the sizes the policy was trained on. Any other processor is returned as it is."""
    ip = getattr(processor, "image_processor", None)
    if ip is None or not any(c.__name__.startswith("Qwen2VLImageProcessor") for c in type(ip).__mro__):
        return processor
    out = copy.deepcopy(processor)
    size = dict(out.image_processor.size)
    size.update({k: v for k, v in (("shortest_edge", min_pixels), ("longest_edge", max_pixels)) if v})
    out.image_processor.size = {k: v for k, v in size.items() if v is not None}
    for name, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if value and getattr(out.image_processor, name, None) is not None:
            setattr(out.image_processor, name, value)
    return out
