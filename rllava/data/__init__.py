"""Datasets, images, the resumable sampler, synthetic data, and the typed values between stages.

`make_counting` is imported from `rllava.data.synthetic`, not re-exported here, so that
`python -m rllava.data.synthetic` runs the module once (no runpy double-import warning)."""

from rllava.data.images import load_image, normalize_image_list, resize_to_pixel_bounds
from rllava.data.records import DataError, base_dir, check_keys, load_records, split_spec
from rllava.data.sampler import EpochSampler

__all__ = ["DataError", "EpochSampler", "base_dir", "check_keys", "load_image", "load_records",
           "normalize_image_list", "resize_to_pixel_bounds", "split_spec"]
