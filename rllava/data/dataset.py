"""Prompt datasets: records -> `Sample` (chat messages + images), and samples -> token ids.

A record's prompt text (`data.prompt_key`) goes through the `data.format_prompt` Jinja template (variables:
`content` = the prompt text, and every field of the record); `<image>` markers place the images inside the
text, otherwise they come first. Images are opened and bounded by `min_pixels`/`max_pixels` only when a sample
is read, so an epoch of images never sits in memory.
"""

from __future__ import annotations

import logging
import os

import jinja2

from rllava.data.images import load_image, normalize_image_list, resize_to_pixel_bounds
from rllava.data.protocol import Sample
from rllava.data.records import DataError, base_dir, check_keys, load_records
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
    """Chat template + processor: prompt token ids (image placeholders expanded) and the image tensors."""
    tokenizer = get_tokenizer(processor)
    text = processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    if not sample.images:
        return tokenizer(text, add_special_tokens=False)["input_ids"], {}
    enc = processor(text=[text], images=sample.images, return_tensors="pt")
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
        if data_cfg.video_key in self.records.column_names and any(self.records[data_cfg.video_key]):
            raise DataError(f"{spec}: records have videos in {data_cfg.video_key!r}; video inputs are not "
                            "available yet in rllava")
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
        fields = {k: v for k, v in record.items() if k != self.cfg.image_key}
        if self.template is not None:
            try:
                prompt = self.template.render(**{**fields, "content": prompt})
            except jinja2.TemplateError as e:
                raise DataError(f"data.format_prompt {self.cfg.format_prompt}: rendering {where} failed: {e}") from e
        images = []
        if self.has_images:
            for j, obj in enumerate(normalize_image_list(record[self.cfg.image_key])):
                img = load_image(obj, base_dir=self.image_dir, where=f"{where}, {self.cfg.image_key}[{j}]")
                images.append(resize_to_pixel_bounds(img, self.cfg.min_pixels, self.cfg.max_pixels))
        extra = {k: v for k, v in fields.items() if k not in (self.cfg.prompt_key, self.cfg.answer_key)}
        return Sample(index=row, messages=[{"role": "user", "content": _content(prompt, len(images), where)}],
                      images=images, ground_truth=record[self.cfg.answer_key], extra=extra,
                      target=record[self.target_key] if self.target_key else None)


def _content(text: str, num_images: int, where: str):
    """Chat content parts: images where the text has `<image>` markers, else all images first."""
    if num_images == 0:
        return text
    pieces = text.split("<image>")
    if len(pieces) == 1:
        return [{"type": "image"}] * num_images + [{"type": "text", "text": text}]
    if len(pieces) - 1 != num_images:
        raise DataError(f"{where}: the prompt has {len(pieces) - 1} <image> markers but the record has "
                        f"{num_images} images")
    parts = []
    for k, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if k < num_images:
            parts.append({"type": "image"})
    return parts

