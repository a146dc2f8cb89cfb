"""Images in every form a record may hold, decoded one record at a time and bounded in size.

Forms: a PIL image; a path (absolute, or relative to the data's base directory); raw bytes; a dict
`{"bytes": ..., "path": ...}` (the `datasets` Image feature with decode=False, either entry may be None); a
base64 string, bare or as a `data:image/...;base64,` URL. Every error names `where` (file, record, field).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import re

from PIL import Image

from rllava.data.records import DataError

_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")
# base64 of the first bytes of PNG, JPEG, GIF, WebP (RIFF) and BMP files.
_BASE64_HEADERS = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "Qk")


def normalize_image_list(value) -> list:
    """A record's image field as a list: one item, a list of items, or nothing (None, "" or [])."""
    if value is None or (isinstance(value, (str, bytes)) and not value):
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def load_image(obj, *, base_dir: str | None, where: str) -> Image.Image:
    """An RGB image from any of the forms in the module docstring.

    `where` (e.g. "train.jsonl record 17, images[0]") goes into every error: missing file, undecodable
    bytes or base64, truncated or corrupt image data, unsupported type."""
    if isinstance(obj, Image.Image):
        img = obj
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        img = _open_bytes(bytes(obj), where)
    elif isinstance(obj, dict):
        if obj.get("bytes"):
            img = _open_bytes(bytes(obj["bytes"]), where)
        elif obj.get("path"):
            img = _open_path(obj["path"], base_dir, where)
        else:
            raise DataError(f"{where}: image dict has neither 'bytes' nor 'path' (keys: {', '.join(obj)})")
    elif isinstance(obj, (str, os.PathLike)):
        text = os.fspath(obj)
        if text.startswith("data:"):
            header, _, payload = text.partition(",")
            if not header.startswith("data:image/") or not header.endswith(";base64"):
                raise DataError(f"{where}: data URL {header[:40]!r}... is not a base64 image (data:image/...;base64,)")
            img = _open_bytes(_decode_base64(payload, where), where)
        elif _is_base64_image(text, base_dir):
            img = _open_bytes(_decode_base64(text, where), where)
        else:
            img = _open_path(text, base_dir, where)
    else:
        raise DataError(f"{where}: unsupported image value of type {type(obj).__name__} (expected a path, bytes, "
                        "a {'bytes', 'path'} dict, a base64 string or a PIL image)")
    try:
        img.load()  # a lazily opened PIL image passed in decodes here, inside the try
        return img if img.mode == "RGB" else img.convert("RGB")
    except Exception as e:
        raise DataError(f"{where}: cannot decode the image ({type(e).__name__}: {e})") from e


def resize_to_pixel_bounds(img: Image.Image, min_pixels: int | None, max_pixels: int | None) -> Image.Image:
    """Scale by one factor s (aspect ratio kept) so that min_pixels <= w * h <= max_pixels, as EasyR1's
    `process_image`: s = sqrt(max_pixels / (w * h)) above the bound, s = sqrt(min_pixels / (w * h)) below it.

    Sizes are rounded down when shrinking and up when growing, so the bound holds (EasyR1 rounds both down
    and can land a few pixels under min_pixels); each side stays >= 1 px. BICUBIC resampling; an image
    already within bounds (or with no bounds, None/0) is returned unchanged."""
    w, h = img.size
    if max_pixels and w * h > max_pixels:
        s = math.sqrt(max_pixels / (w * h))
        size = (max(1, math.floor(w * s)), max(1, math.floor(h * s)))
    elif min_pixels and w * h < min_pixels:
        s = math.sqrt(min_pixels / (w * h))
        size = (math.ceil(w * s - 1e-9), math.ceil(h * s - 1e-9))  # -1e-9: a float 9.0000000001 is 9, not 10
    else:
        return img
    return img.resize(size, Image.Resampling.BICUBIC)


def _open_bytes(data: bytes, where: str) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(data))
        img.load()  # decode now, so truncated or corrupt data fails here with `where` in the message
    except Exception as e:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ValueError, ...
        raise DataError(f"{where}: cannot decode image bytes ({type(e).__name__}: {e})") from e
    return img


def _open_path(path: str, base_dir: str | None, where: str) -> Image.Image:
    full = path if os.path.isabs(path) or base_dir is None else os.path.join(base_dir, path)
    if not os.path.isfile(full):
        shown = full if len(full) <= 200 else full[:200] + "..."
        hint = f" (relative paths resolve against {base_dir})" if base_dir and not os.path.isabs(path) else ""
        raise DataError(f"{where}: image file {shown!r} not found{hint}")
    try:
        with Image.open(full) as img:
            img.load()
            return img.copy()  # detached from the file handle, which closes here
    except Exception as e:
        raise DataError(f"{where}: cannot read image {full!r} ({type(e).__name__}: {e})") from e


def _is_base64_image(text: str, base_dir: str | None) -> bool:
    """A string that is not an existing file and looks like base64: starts like an encoded image header, or
    is long and made only of base64 characters (then decoding errors name it as base64, not as a path)."""
    if len(text) < 16 or not _BASE64.fullmatch(text[:4096]):
        return False
    full = text if os.path.isabs(text) or base_dir is None else os.path.join(base_dir, text)
    if len(text) < 1024 and os.path.exists(full):
        return False
    return text.lstrip().startswith(_BASE64_HEADERS) or len(text) >= 256


def _decode_base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)  # MIME base64 may wrap lines
    except (binascii.Error, ValueError) as e:
        raise DataError(f"{where}: invalid base64 image data ({e})") from e
