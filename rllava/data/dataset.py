"""Prompt datasets: records -> `Sample` (chat messages + images + videos), and samples -> token ids.

A record's prompt text (`data.prompt_key`) goes through the `data.format_prompt` Jinja template (variables:
`content` = the prompt text, and every field of the record); `<image>` and `<video>` markers place the images
and videos inside the text, otherwise they come first (images, then videos). Images are opened and bounded by
`min_pixels`/`max_pixels`, and videos sampled and sized (`rllava.data.video`), only when a sample is read, so
an epoch of pixels never sits in memory.

`data.video_key` holds a list of videos (or one), each a video file or a list of frames, as in RLLaVA:
`{"videos": ["clip.mp4"]}` or `{"videos": [["f0.png", "f1.png", ...]]}`.
"""

from __future__ import annotations

import logging
import os
import re

import jinja2

from rllava.data.images import load_image, normalize_image_list, resize_to_pixel_bounds, stored_size
from rllava.data.protocol import Sample
from rllava.data.records import DataError, base_dir, check_keys, load_records
from rllava.data.video import VideoSpec, load_video
from rllava.model.processor import get_tokenizer

log = logging.getLogger(__name__)


def load_template(path: str | None) -> jinja2.Template | None:
    if not path:
        return None
    if not os.path.isfile(path):
        raise DataError(f"data.format_prompt: template file {path!r} does not exist")
    try:
        with open(path) as f:
            return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(f.read())
    except jinja2.TemplateSyntaxError as e:
        raise DataError(f"data.format_prompt: {path} line {e.lineno}: {e.message}") from e


def encode_prompt(processor, sample: Sample) -> tuple[list[int], dict]:
    """Chat template + processor: prompt token ids (image/video placeholders expanded) and the pixel tensors.

    Videos go to the processor's video processor as [T, H, W, C] frames already sampled and sized, with their
    metadata (Qwen2.5-VL's second_per_grid_ts and Qwen3-VL's timestamps come from it): transformers' own where
    torchvision is installed, rllava's PIL one (`rllava.model.video_processor`) where it is not."""
    tokenizer = get_tokenizer(processor)
    text = processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    if not sample.images and not sample.videos:
        return tokenizer(text, add_special_tokens=False)["input_ids"], {}
    videos = {}
    if sample.videos:
        videos = {"videos": [v.array() for v in sample.videos],
                  "videos_kwargs": {"video_metadata": [v.metadata() for v in sample.videos],
                                    "do_sample_frames": False, "do_resize": False}}
    enc = processor(text=[text], images=sample.images or None, return_tensors="pt", **videos)
    mm = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    return enc["input_ids"][0].tolist(), mm


class PromptDataset:
    """`data.train_files`/`val_files` as a sequence of `Sample`s, with overlong prompts filtered out.

    `target_key` (SFT) names the field holding the reference response."""

    def __init__(self, spec: str, data_cfg, processor, *, image_dir: str | None = None,
                 target_key: str | None = None, limit_images: int = 0):
        self.spec, self.cfg, self.processor, self.target_key = spec, data_cfg, processor, target_key
        self.records = load_records(spec, max_samples=data_cfg.max_samples)
        required = [data_cfg.prompt_key, data_cfg.answer_key] + ([target_key] if target_key else [])
        check_keys(self.records, spec, required)
        self.has_images = data_cfg.image_key in self.records.column_names
        self.limit_images = limit_images  # rollout.limit_images: prompts with more images are filtered (0 = any)
        self.has_videos = data_cfg.video_key in self.records.column_names and any(self.records[data_cfg.video_key])
        self.video_spec = _video_spec(data_cfg, processor, spec) if self.has_videos else None
        self.image_dir = base_dir(spec, image_dir)
        self.template = load_template(data_cfg.format_prompt)
        self.indices = [i for i in range(len(self.records)) if self.fits(i)]
        self.num_filtered = len(self.records) - len(self.indices)
        if self.num_filtered:
            log.warning("%s: filtered %d of %d prompts longer than data.max_prompt_length=%d tokens (or with "
                        "more than rollout.limit_images images)", spec, self.num_filtered, len(self.records),
                        data_cfg.max_prompt_length)
        if not self.indices:
            raise DataError(f"{spec}: every prompt was filtered: longer than data.max_prompt_length="
                            f"{data_cfg.max_prompt_length} tokens or with more than rollout.limit_images images")

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Sample:
        return self.sample(self.indices[i])

    def fits(self, row: int) -> bool:
        """Within rollout.limit_images and (if data.filter_overlong_prompts) data.max_prompt_length."""
        if self.limit_images and self.has_images:
            if len(normalize_image_list(self.records[row][self.cfg.image_key])) > self.limit_images:
                return False
        if not self.cfg.filter_overlong_prompts:
            return True
        return len(encode_prompt(self.processor, self.sample(row))[0]) <= self.cfg.max_prompt_length

    def sample(self, row: int) -> Sample:
        record = self.records[row]
        where = f"{self.spec} record {row}"
        prompt = record[self.cfg.prompt_key]
        if not isinstance(prompt, str):
            raise DataError(f"{where}: {self.cfg.prompt_key!r} must be a string, got {type(prompt).__name__}")
        fields = {k: v for k, v in record.items() if k not in (self.cfg.image_key, self.cfg.video_key)}
        if self.template is not None:
            try:
                prompt = self.template.render(**{**fields, "content": prompt})
            except jinja2.TemplateError as e:
                raise DataError(f"data.format_prompt {self.cfg.format_prompt}: rendering {where} failed: {e}") from e
        images, image_sizes = [], []
        if self.has_images:
            for j, obj in enumerate(normalize_image_list(record[self.cfg.image_key])):
                img = load_image(obj, base_dir=self.image_dir, where=f"{where}, {self.cfg.image_key}[{j}]",
                                 max_pixels=self.cfg.max_pixels)
                image_sizes.append(stored_size(img))  # as stored, before any draft-scale decode
                images.append(resize_to_pixel_bounds(img, self.cfg.min_pixels, self.cfg.max_pixels))
        videos = []
        if self.has_videos:
            for j, obj in enumerate(normalize_image_list(record[self.cfg.video_key])):
                videos.append(load_video(obj, self.video_spec, base_dir=self.image_dir,
                                         where=f"{where}, {self.cfg.video_key}[{j}]"))
        extra = {k: v for k, v in fields.items() if k not in (self.cfg.prompt_key, self.cfg.answer_key)}
        content = _content(prompt, {"image": len(images), "video": len(videos)}, where)
        return Sample(index=row, messages=[{"role": "user", "content": content}], images=images, videos=videos,
                      ground_truth=record[self.cfg.answer_key], extra=extra,
                      target=record[self.target_key] if self.target_key else None, image_sizes=image_sizes)


def _video_spec(cfg, processor, spec: str) -> VideoSpec:
    """data.video_* keys and the vision tower's patch geometry (from the processor's image processor)."""
    image_processor = getattr(processor, "image_processor", None)
    if not hasattr(image_processor, "temporal_patch_size"):
        raise DataError(f"{spec}: records have videos in {cfg.video_key!r} but the model's processor "
                        f"({type(processor).__name__}) takes no video input (Qwen-VL models do)")
    min_pixels, max_pixels = cfg.video_pixels()
    return VideoSpec(fps=cfg.video_fps, max_frames=cfg.video_max_frames, min_pixels=min_pixels,
                     max_pixels=max_pixels, factor=image_processor.patch_size * image_processor.merge_size,
                     temporal_factor=image_processor.temporal_patch_size)


def _content(text: str, counts: dict[str, int], where: str):
    """Chat content parts: each kind ("image", "video") placed where the text has its `<image>`/`<video>`
    markers, else all of that kind first. Markers of a kind the record has none of stay text."""
    if not any(counts.values()):
        return text
    kinds = [kind for kind, n in counts.items() if n]
    for kind in kinds:
        markers = text.count(f"<{kind}>")
        if markers and markers != counts[kind]:
            raise DataError(f"{where}: the prompt has {markers} <{kind}> markers but the record has "
                            f"{counts[kind]} {kind}s")
    parts = [{"type": kind} for kind in kinds if f"<{kind}>" not in text for _ in range(counts[kind])]
    for piece in re.split("(" + "|".join(f"<{kind}>" for kind in kinds) + ")", text):
        if piece in {f"<{kind}>" for kind in kinds}:
            parts.append({"type": piece[1:-1]})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts

