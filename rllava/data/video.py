"""Videos in the forms a record may hold, sampled and sized for a Qwen-VL vision tower; every error names `where`.

A record's video is a *list of frames* (each in any form `load_image` accepts: path, bytes, base64, PIL) or a *video
file* (a path, raw bytes or a `{"bytes", "path"}` dict) decoded with PyAV. Then, as qwen-vl-utils' `fetch_video`
(what RLLaVA and EasyR1 call):

- a file is sampled at `fps` frames per second: n = total_frames / source_fps * fps frames, at most `max_frames`
  and `total_frames`, rounded down to a multiple of `temporal_factor` (the processor's temporal_patch_size, 2), at
  least `temporal_factor`; frame indices linspace(0, total - 1, n), rounded;
- a frame list is taken as already sampled at `fps`: more than `max_frames` frames are thinned the same way
  (`max_frames` first rounded down to a multiple of `temporal_factor`);
- the frame count is padded up to a multiple of `temporal_factor` by repeating the last frame;
- every frame is resized (BICUBIC) to h x w, both multiples of `factor` (patch_size * merge_size), with
  min_pixels <= h * w <= max_pixels, by Qwen2-VL's `smart_resize` (transformers').
"""

import io
import math
import os
from dataclasses import dataclass

import numpy as np
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from rllava.data.images import load_image
from rllava.data.records import DataError


@dataclass
class Video:
    """Sampled frames (all the same size) and where they came from, for the processor's metadata."""

    frames: list[Image.Image]
    fps: float  # frames per second of `indices` (the source's rate; a frame list's is data.video_fps)
    indices: list[int]  # source frame index of each frame
    total_frames: int  # frames in the source

    def array(self) -> np.ndarray:
        """[T, H, W, C] uint8, the layout video processors take."""
        return np.stack([np.asarray(f) for f in self.frames])

    def metadata(self):
        """transformers' VideoMetadata: Qwen2.5-VL derives second_per_grid_ts from it, Qwen3-VL timestamps."""
        from transformers.video_utils import VideoMetadata

        w, h = self.frames[0].size
        return VideoMetadata(total_num_frames=self.total_frames, fps=self.fps, width=w, height=h,
                             duration=self.total_frames / self.fps, frames_indices=list(self.indices))


@dataclass(frozen=True)
class VideoSpec:
    """How to sample and size frames: data.video_* keys plus the processor's patch geometry."""

    fps: float
    max_frames: int
    min_pixels: int | None
    max_pixels: int | None
    factor: int = 28  # patch_size * merge_size
    temporal_factor: int = 2  # temporal_patch_size


def load_video(obj, spec: VideoSpec, *, base_dir: str | None, where: str) -> Video:
    """A `Video` from a frame list or a video file (see the module docstring)."""
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise DataError(f"{where}: the video has no frames (an empty list)")
        keep = _sample_indices(len(obj), min(len(obj), _frame_cap(spec)))
        frames = [load_image(obj[i], base_dir=base_dir, where=f"{where}[{i}]") for i in keep]
        return _finish(frames, spec.fps, keep, len(obj), spec, where)
    return _finish(*_decode_file(obj, spec, base_dir, where), spec, where)


def num_sampled_frames(total: int, source_fps: float, spec: VideoSpec) -> int:
    """Frames taken from a file of `total` frames at `source_fps` (before padding to temporal_factor)."""
    n = min(total / source_fps * spec.fps, _frame_cap(spec), total)
    return max(spec.temporal_factor, math.floor(n / spec.temporal_factor) * spec.temporal_factor)


def _frame_cap(spec: VideoSpec) -> int:
    """max_frames rounded down to a multiple of temporal_factor (at least one temporal patch)."""
    return max(spec.temporal_factor, spec.max_frames // spec.temporal_factor * spec.temporal_factor)


def _sample_indices(total: int, n: int) -> list[int]:
    """n indices spread evenly over 0..total-1 (first and last included), as linspace(...).round()."""
    if n <= 1:
        return [0]
    return [round(k * (total - 1) / (n - 1)) for k in range(n)]


def _finish(frames: list[Image.Image], fps: float, indices: list[int], total: int, spec: VideoSpec,
            where: str) -> Video:
    """Pad to a multiple of temporal_factor (repeat the last frame) and resize every frame to one size."""
    while len(frames) % spec.temporal_factor:
        frames, indices = frames + frames[-1:], indices + indices[-1:]
    w, h = frames[0].size
    try:  # Qwen2-VL's rule; no bound given: at least one factor x factor patch, no upper bound
        rh, rw = smart_resize(h, w, spec.factor, spec.min_pixels or spec.factor**2, spec.max_pixels or math.inf)
    except ValueError as e:
        raise DataError(f"{where}: cannot resize {w}x{h} frames ({e})") from e
    size = (rw, rh)
    frames = [f if f.size == size else f.resize(size, Image.Resampling.BICUBIC) for f in frames]
    return Video(frames=frames, fps=fps, indices=indices, total_frames=total)


def _decode_file(obj, spec: VideoSpec, base_dir: str | None, where: str):
    """(frames, source fps, their indices, total frames) of a video file sampled at spec.fps, decoded once. The frame
    count comes from the container when it records one, else from counting packets; a stream that ends early repeats its
    last decoded frame for the missing indices."""
    import av

    if isinstance(obj, dict):  # the source PyAV opens: a path or a file object, from a path, bytes or such a dict
        obj = obj.get("bytes") or obj.get("path")
        if not obj:
            raise DataError(f"{where}: video dict has neither 'bytes' nor 'path'")
    if isinstance(obj, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(obj))
    elif isinstance(obj, (str, os.PathLike)):
        path = os.fspath(obj)
        source = path if os.path.isabs(path) or base_dir is None else os.path.join(base_dir, path)
        if not os.path.isfile(source):
            hint = f" (relative paths resolve against {base_dir})" if base_dir and not os.path.isabs(path) else ""
            raise DataError(f"{where}: video file {source!r} not found{hint}")
    else:
        raise DataError(f"{where}: unsupported video value of type {type(obj).__name__} (expected a list of frames, "
                        "a video file path, bytes or a {'bytes', 'path'} dict)")
    try:
        with av.open(source) as container:
            if not container.streams.video:
                raise DataError(f"{where}: the file has no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            if not rate:
                raise DataError(f"{where}: the video stream has no frame rate")
            total = stream.frames or sum(1 for p in container.demux(stream) if p.size)
            if total == 0:
                raise DataError(f"{where}: the video has no frames")
            if not stream.frames:
                container.seek(0)
            fps = float(rate)
            keep = _sample_indices(total, num_sampled_frames(total, fps, spec))
            wanted, picked = set(keep), {}
            for i, frame in enumerate(container.decode(stream)):
                if i in wanted:
                    picked[i] = frame.to_image()
                if i >= keep[-1]:
                    break
    except DataError:
        raise
    except Exception as e:  # PyAV raises InvalidDataError, FileNotFoundError, ValueError, ...
        raise DataError(f"{where}: cannot decode the video ({type(e).__name__}: {e})") from e
    if not picked:
        raise DataError(f"{where}: the video has no decodable frames")
    last = max(picked)
    frames = [(picked[i] if i in picked else picked[last]).convert("RGB") for i in keep]
    return frames, fps, keep, total
