"""Prompt datasets: records -> `Sample` (chat messages + images + videos), and samples -> token ids.

A record's prompt (`data.prompt_key`) goes through the `data.format_prompt` Jinja template (variables: `content`, the
prompt text, and every field of the record); `<image>` / `<video>` markers place the images and videos in the text,
else they come first (images, then videos). Images are bounded by `min_pixels`/`max_pixels` and videos sampled and
sized (`rllava.data.video`) only when a sample is read: an epoch of pixels never sits in memory. `data.video_key`
holds a list of videos (or one), each a video file or a list of frames, as in RLLaVA: `{"videos": ["clip.mp4"]}`
or `{"videos": [["f0.png", "f1.png", ...]]}`.

Bad records stop the run at start-up with one line naming the file, the record and the key: no prompt or answer,
an image/video key matching no field while prompts carry markers (`check_media_keys`), markers (`_content`) or
encoded placeholder tokens (`check_placeholders`) not matching its images. Prompts are never truncated (cutting image
tokens breaks the model's input): an overlong prompt is filtered (data.filter_overlong_prompts) or kept whole.
"""

import logging
import os
import re

import jinja2

from rllava.data.images import load_image, normalize_image_list, resize_to_pixel_bounds, stored_size
from rllava.data.protocol import Sample
from rllava.data.reasoning_gym import is_reasoning_gym, reasoning_gym_records
from rllava.data.records import DataError, base_dir, check_keys, check_values, load_records
from rllava.config.schema import RLLAVA_AGENT_DATASET, rllava_dataset
from rllava.data.video import VideoSpec, load_video
from rllava.model.processor import get_tokenizer

log = logging.getLogger(__name__)


def load_template(path: str | None, key: str = "data.format_prompt") -> jinja2.Template | None:
    """The Jinja template in file `path` (undefined variables are errors); problems name `key`."""
    if not path:
        return None
    if not os.path.isfile(path):
        raise DataError(f"{key}: template file {path!r} does not exist")
    try:
        with open(path) as f:
            return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(f.read())
    except jinja2.TemplateSyntaxError as e:
        raise DataError(f"{key}: {path} line {e.lineno}: {e.message}") from e


def encode_prompt(processor, sample: Sample) -> tuple[list[int], dict]:
    """Chat template + processor: prompt token ids (image/video placeholders expanded) and pixel tensors. Videos go to
    the video processor (transformers' given torchvision, else `rllava.model.video_processor`'s PIL one) as sampled and
    sized [T, H, W, C] frames with their metadata (Qwen2.5-VL's second_per_grid_ts, Qwen3-VL's timestamps). A processor
    failure or placeholders not matching the images (`check_placeholders`): a DataError naming the record."""
    tokenizer = get_tokenizer(processor)
    text = processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    if not sample.images and not sample.videos:
        return tokenizer(text, add_special_tokens=False)["input_ids"], {}
    videos = {"videos": [v.array() for v in sample.videos],
              "videos_kwargs": {"video_metadata": [v.metadata() for v in sample.videos],
                                "do_sample_frames": False, "do_resize": False}} if sample.videos else {}
    try:
        enc = processor(text=[text], images=sample.images or None, return_tensors="pt", **videos)
    except Exception as e:  # IndexError/ValueError from the processor: markers vs images, an image too small, ...
        reason = (str(e).strip().splitlines() or [""])[0]
        counts = [(len(sample.images), "image(s)"), (len(sample.videos), "video(s)")]
        media = " and ".join(f"{n} {what}" for n, what in counts if n)
        raise DataError(f"{sample.where}: the processor cannot encode the prompt with its {media} "
                        f"({type(e).__name__}: {reason})") from e
    mm = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    ids = enc["input_ids"][0].tolist()
    check_placeholders(processor, ids, mm, sample)
    return ids, mm


def check_placeholders(processor, ids: list[int], mm: dict, sample: Sample) -> None:
    """The encoded prompt has as many image (video) placeholder tokens as the vision tower's features for the
    sample's images (videos), else a DataError naming the record (a chat template dropping a `{"type": "image"}`
    part, or a prompt cut through its image tokens, would fail in the model as a shape mismatch). Processors
    whose feature count rllava does not know are not checked."""
    for kind, n in (("image", len(sample.images)), ("video", len(sample.videos))):
        expected = _expected_tokens(processor, mm, kind) if n else None
        token_id = getattr(processor, f"{kind}_token_id", None)
        if token_id is None and getattr(processor, f"{kind}_token", None):
            token_id = get_tokenizer(processor).convert_tokens_to_ids(getattr(processor, f"{kind}_token"))
        if expected is None or token_id is None:
            continue
        found = ids.count(token_id)
        if found != expected:
            raise DataError(f"{sample.where}: the encoded prompt has {found} {kind} placeholder tokens but its {n} "
                            f"{kind}(s) need {expected}: the chat template (data.override_chat_template or the "
                            f"tokenizer's) must render every {{'type': '{kind}'}} part of the message")


def _expected_tokens(processor, mm: dict, kind: str) -> int | None:
    """Placeholder tokens the model expects for the encoded images/videos: Qwen-VL, one per merged patch of
    `{kind}_grid_thw` (t * h * w / merge_size^2); LLaVA-style processors (the modular VLM), one per patch of
    each image plus `num_additional_image_tokens`, minus the CLS feature the "default" strategy drops."""
    grid = mm.get(f"{kind}_grid_thw")
    merge = getattr(getattr(processor, "image_processor", None), "merge_size", None)
    if grid is not None and isinstance(merge, int):
        return int(grid.prod(-1).sum()) // merge**2
    pixels, patch = mm.get("pixel_values"), getattr(processor, "patch_size", None)
    if kind == "image" and pixels is not None and pixels.dim() == 4 and isinstance(patch, int):
        per_image = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch)
        per_image += getattr(processor, "num_additional_image_tokens", 0) or 0
        per_image -= getattr(processor, "vision_feature_select_strategy", None) == "default"
        return per_image * pixels.shape[0]
    return None


FINAL_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


def final_answer_rows(records, spec: str, answer_key: str):
    """RLLaVA's AgentSearchDataset (data.dataset_class=...:AgentSearchDataset): keep the records whose `solution`
    field (else data.answer_key) is text holding a final "<answer>" (its RFT mix also has rows whose solution is
    only a gold <search> step); RLLaVA's examples/tasks/agent_search/agent_search_dataset.py, `_load_data`."""
    key = "solution" if "solution" in records.column_names else answer_key
    kept = records.filter(lambda r: isinstance(r.get(key), str) and "<answer>" in r[key])
    if not len(kept):
        raise DataError(f"{spec}: data.dataset_class={RLLAVA_AGENT_DATASET} keeps records whose {key!r} holds a "
                        f"final <answer>...</answer>, and none of the {len(records)} does")
    return kept


def final_answer(value):
    """AgentSearchDataset's ground truth: the text inside <answer>...</answer>, else the whole text (stripped)."""
    match = FINAL_ANSWER.search(value) if isinstance(value, str) else None
    return match.group(1).strip() if match else str(value).strip()


CHECKED_AT_START = 8  # records built and encoded at start-up when data.filter_overlong_prompts does not encode all
MARKER_SCAN = 64  # records whose prompts are scanned for <image>/<video> markers when the key matches no field


class PromptDataset:
    """`data.train_files`/`val_files` as a sequence of `Sample`s, with overlong prompts filtered out. `target_key`
    (SFT) names the field holding the reference response. `records`: records given in memory (a list of dicts, a
    `datasets.Dataset`, ...: `rllava.data.records.memory_records`) instead of read from `spec`, which then only
    names them in messages ("train_dataloader record 3: ..."); checked the same way."""

    def __init__(self, spec: str, data_cfg, processor, *, image_dir: str | None = None,
                 target_key: str | None = None, limit_images: int = 0, records=None, key: str | None = None):
        self.spec, self.cfg, self.processor, self.target_key = spec, data_cfg, processor, target_key
        if records is None and is_reasoning_gym(spec):  # procedural tasks, generated here (rllava.data.reasoning_gym)
            records = reasoning_gym_records(spec, data_cfg.prompt_key, data_cfg.answer_key, key or "data")
        self.records = load_records(spec, max_samples=data_cfg.max_samples, given=records, key=key)
        self.final_answers = rllava_dataset(data_cfg.dataset_class) == RLLAVA_AGENT_DATASET
        if self.final_answers:
            self.records = final_answer_rows(self.records, spec, data_cfg.answer_key)
        required = {"data.prompt_key": data_cfg.prompt_key, "data.answer_key": data_cfg.answer_key}
        if target_key:
            required["data.target_key"] = target_key
        check_keys(self.records, spec, list(required.values()))
        check_values(self.records, spec, required)
        self.check_media_keys()
        self.has_images = data_cfg.image_key in self.records.column_names
        self.limit_images = limit_images  # rollout.limit_images: prompts with more images are filtered (0 = any)
        self.has_videos = data_cfg.video_key in self.records.column_names and any(self.records[data_cfg.video_key])
        self.video_spec = None  # data.video_* keys and the vision tower's patch geometry
        if self.has_videos:
            image_processor = getattr(processor, "image_processor", None)
            if not hasattr(image_processor, "temporal_patch_size"):
                raise DataError(f"{spec}: records have videos in {data_cfg.video_key!r} but the model's processor "
                                f"({type(processor).__name__}) takes no video input (Qwen-VL models do)")
            min_pixels, max_pixels = data_cfg.video_pixels()
            self.video_spec = VideoSpec(data_cfg.video_fps, data_cfg.video_max_frames, min_pixels, max_pixels,
                                        image_processor.patch_size * image_processor.merge_size,
                                        image_processor.temporal_patch_size)
        self.image_dir = base_dir(spec, image_dir) if records is None else base_dir("", image_dir)
        self.template = load_template(data_cfg.format_prompt)
        if not data_cfg.filter_overlong_prompts:  # else every record is built and encoded by the filter below
            for row in range(min(CHECKED_AT_START, len(self.records))):
                encode_prompt(processor, self.sample(row))
        kept = {row: self.filtered(row) for row in range(len(self.records))}
        self.indices = [row for row, why in kept.items() if why is None]
        self.num_filtered = len(self.records) - len(self.indices)
        lengths = sorted(why for why in kept.values() if isinstance(why, int))
        many_images = sum(why == "images" for why in kept.values())
        if self.indices and self.num_filtered:
            log.warning("%s: filtered %d of %d prompts: %d longer than data.max_prompt_length=%d tokens%s, %d with "
                        "more than rollout.limit_images images", spec, self.num_filtered, len(self.records),
                        len(lengths), data_cfg.max_prompt_length,
                        f" (the longest has {lengths[-1]})" if lengths else "", many_images)
        if not self.indices:
            parts = [f"{len(lengths)} are longer than data.max_prompt_length={data_cfg.max_prompt_length} tokens "
                     f"(image tokens included; shortest {lengths[0]}, longest {lengths[-1]}): raise "
                     f"data.max_prompt_length (to {lengths[-1]} to keep them all)"] if lengths else []
            if many_images:
                parts.append(f"{many_images} have more than rollout.limit_images={limit_images} images")
            raise DataError(f"{spec}: all {len(self.records)} prompts were filtered: " + "; ".join(parts))

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Sample:
        return self.sample(self.indices[i])

    def filtered(self, row: int) -> int | str | None:
        """Why record `row` is filtered: "images" (over rollout.limit_images), its prompt length in tokens (over
        data.max_prompt_length, when data.filter_overlong_prompts), or None: kept."""
        if self.limit_images and self.has_images:
            if len(normalize_image_list(self.records[row][self.cfg.image_key])) > self.limit_images:
                return "images"
        if not self.cfg.filter_overlong_prompts:
            return None
        length = len(encode_prompt(self.processor, self.sample(row))[0])
        return length if length > self.cfg.max_prompt_length else None

    def check_media_keys(self) -> None:
        """data.image_key / data.video_key name a field of the records, unless the key is left at its default
        and no prompt among the first records has a marker of that kind (a text-only data set). Otherwise the
        images would be silently dropped and "<image>" trained on as text."""
        fields = self.records.column_names
        for kind in ("image", "video"):
            key = getattr(self.cfg, f"{kind}_key")
            if key in fields:
                continue
            default = getattr(type(self.cfg), f"{kind}_key", key)
            head = self.records.select(range(min(MARKER_SCAN, len(self.records))))[self.cfg.prompt_key]
            marked = next((i for i, p in enumerate(head) if isinstance(p, str) and f"<{kind}>" in p), None)
            if key != default or marked is not None:
                why = (f"record {marked}'s prompt has a <{kind}> marker" if marked is not None
                       else f"data.{kind}_key was set")
                raise DataError(f"{self.spec}: data.{kind}_key={key!r} matches no field of the records (fields: "
                                f"{', '.join(fields)}) but {why}: set data.{kind}_key to the field holding the "
                                f"{kind}s")

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
        if images and getattr(self.processor, "image_processor", None) is None:  # it would drop them without a word
            raise DataError(f"{where}: has images in data.image_key={self.cfg.image_key!r} but the model's processor "
                            f"({type(self.processor).__name__}) takes no image input: point actor.model.model_path "
                            "(and tokenizer_path) at a vision-language model")
        videos = [load_video(obj, self.video_spec, base_dir=self.image_dir, where=f"{where}, {self.cfg.video_key}[{j}]")
                  for j, obj in enumerate(normalize_image_list(record[self.cfg.video_key]))] if self.has_videos else []
        extra = {k: v for k, v in fields.items() if k not in (self.cfg.prompt_key, self.cfg.answer_key)}
        answer = record[self.cfg.answer_key]
        content = _content(prompt, {"image": len(images), "video": len(videos)}, where, self.cfg)
        return Sample(index=row, messages=[{"role": "user", "content": content}], images=images, videos=videos,
                      ground_truth=final_answer(answer) if self.final_answers else answer, extra=extra,
                      target=record[self.target_key] if self.target_key else None, image_sizes=image_sizes,
                      source=self.spec)


def _content(text: str, counts: dict[str, int], where: str, cfg):
    """Chat content parts: each kind ("image", "video") placed where the text has its `<image>`/`<video>`
    markers, else all of that kind first. Markers must match the record's items one to one: a marker with no
    image (or video) to place, or a different number of each, is an error naming the record."""
    for kind, n in counts.items():
        markers = text.count(f"<{kind}>")
        if markers and markers != n:
            raise DataError(f"{where}: the prompt has {markers} <{kind}> markers but the record has {n} {kind}s "
                            f"(in data.{kind}_key={getattr(cfg, f'{kind}_key')!r})")
    if not any(counts.values()):
        return text
    kinds = [kind for kind, n in counts.items() if n]
    parts = [{"type": kind} for kind in kinds if f"<{kind}>" not in text for _ in range(counts[kind])]
    for piece in re.split("(" + "|".join(f"<{kind}>" for kind in kinds) + ")", text):
        if piece in {f"<{kind}>" for kind in kinds}:
            parts.append({"type": piece[1:-1]})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts
