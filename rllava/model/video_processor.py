"""Qwen-VL video tensors without torchvision (transformers' Qwen-VL video processors import it, and it has no CPU
build for our torch): `pixel_values_videos` and `video_grid_thw` as transformers' Qwen2-VL video processor computes
them, made with the PIL image processor.

For frames already sampled and resized to multiples of patch_size * merge_size (`rllava.data.video`), the video
processor still rescales and normalizes each frame, then cuts every group of `temporal_patch_size` (tp) frames into
patches of C x tp x p x p values, ordered (t, h-block, w-block, h-in-block, w-in-block) as the vision tower's patch
merger expects. The PIL image processor run with temporal_patch_size=1 does the rescale, the normalization and the
spatial order of one frame; the frames of each temporal group are then interleaved along the patch's time axis:

    frame patches [T, N, C, p, p] -> [T/tp, tp, N, C, p, p] -> [T/tp, N, C, tp, p, p] -> [T/tp * N, C*tp*p*p]

`image_only_processor_class` (rllava.model.processor) exposes this as its `video_processor`, so the model's own
processor class expands `<|video_pad|>` (Qwen3-VL: per-frame timestamps) and adds `second_per_grid_ts` (Qwen2.5-VL)
exactly as with transformers' video processor.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.feature_extraction_utils import BatchFeature

# Processor-call options that would change the pixels: rllava samples and resizes frames itself.
_UNSUPPORTED = {"do_resize": True, "do_sample_frames": True}


class PilVideoProcessor:
    """Callable as `processor.video_processor(videos, video_metadata=..., return_metadata=...)`; videos are
    lists of same-size frames (PIL or [H, W, C] arrays) or [T, H, W, C] arrays, already resized."""

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, image_processor):
        self.image_processor = image_processor
        self.patch_size = image_processor.patch_size
        self.merge_size = image_processor.merge_size
        self.temporal_patch_size = image_processor.temporal_patch_size

    def __call__(self, videos, *, video_metadata=None, return_metadata: bool = False, return_tensors=None,
                 **options) -> BatchFeature:
        from transformers.video_utils import VideoMetadata, make_batched_videos

        for name, bad in _UNSUPPORTED.items():
            if options.get(name) == bad:
                raise ValueError(f"PilVideoProcessor: {name}=True is not supported; frames must come sampled and "
                                 "resized to multiples of patch_size * merge_size (rllava.data.video.load_video)")
        videos = make_batched_videos(videos)
        patches, grids = zip(*(self.patchify(np.asarray(v)) for v in videos)) if videos else ((), ())
        data = {"pixel_values_videos": torch.from_numpy(np.concatenate(patches)),
                "video_grid_thw": torch.tensor(grids, dtype=torch.long)}
        if return_metadata:
            data["video_metadata"] = video_metadata or [VideoMetadata(total_num_frames=len(v),
                                                                      frames_indices=list(range(len(v))))
                                                        for v in videos]
        return BatchFeature(data, skip_tensor_conversion=["video_metadata"])

    def patchify(self, video: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """[T, H, W, C] uint8 frames -> (patches [T/tp * H/p * W/p, C * tp * p * p] float32, [T/tp, H/p, W/p]).
        T is padded to a multiple of tp by repeating the last frame, as the video processor does."""
        tp, p = self.temporal_patch_size, self.patch_size
        if pad := -len(video) % tp:
            video = np.concatenate([video, np.repeat(video[-1:], pad, axis=0)])
        enc = self.image_processor(list(video), do_resize=False, temporal_patch_size=1, return_tensors="np",
                                   input_data_format="channels_last")
        _, grid_h, grid_w = (int(x) for x in enc["image_grid_thw"][0])
        frames = enc["pixel_values"].reshape(len(video) // tp, tp, grid_h * grid_w, -1, p * p)  # [t, tp, N, C, pp]
        patches = frames.transpose(0, 2, 3, 1, 4).reshape(len(video) // tp * grid_h * grid_w, -1)
        return np.ascontiguousarray(patches, dtype=np.float32), [len(video) // tp, grid_h, grid_w]
