"""Images in every form a record may hold, decoded one record at a time and bounded in size.

Forms: a PIL image; a path (absolute, or relative to the data's base directory); raw bytes; a dict
`{"bytes": ..., "path": ...}` (the `datasets` Image feature with decode=False, either entry may be None); a
base64 string, bare or as a `data:image/...;base64,` URL. Every error names `where` (file, record, field).

Every image comes out RGB (`to_rgb`). Given `max_pixels`, a large JPEG is decoded at a reduced scale (`Image.draft`:
1/2 to 1/8, never below the bound), so a 12000 x 12000 photo never sits in memory at full size; other formats decode
whole, and anything PIL counts as a decompression bomb (over 2 x Image.MAX_IMAGE_PIXELS, ~179 M pixels) is a
one-line error instead of PIL's exception.
"""

import base64
import binascii
import io
import math
import os
import re
import warnings

import numpy as np
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


def load_image(obj, *, base_dir: str | None, where: str, max_pixels: int | None = None) -> Image.Image:
    """An RGB image from any of the forms in the module docstring. `where` (e.g. "train.jsonl record 17, images[0]")
    goes into every error: missing file, undecodable bytes or base64, truncated or corrupt data, unsupported type,
    too many pixels. `max_pixels` (data.max_pixels) lets a large JPEG decode at a reduced scale (still resized)."""
    if isinstance(obj, Image.Image):
        img = obj
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        img = _open_bytes(bytes(obj), where, max_pixels)
    elif isinstance(obj, dict):
        if obj.get("bytes"):
            img = _open_bytes(bytes(obj["bytes"]), where, max_pixels)
        elif obj.get("path"):
            img = _open_path(obj["path"], base_dir, where, max_pixels)
        else:
            raise DataError(f"{where}: image dict has neither 'bytes' nor 'path' (keys: {', '.join(obj)})")
    elif isinstance(obj, (str, os.PathLike)):
        text = os.fspath(obj)
        if text.startswith("data:"):
            header, _, payload = text.partition(",")
            if not header.startswith("data:image/") or not header.endswith(";base64"):
                raise DataError(f"{where}: data URL {header[:40]!r}... is not a base64 image (data:image/...;base64,)")
            img = _open_bytes(_decode_base64(payload, where), where, max_pixels)
        elif _is_base64_image(text, base_dir):
            img = _open_bytes(_decode_base64(text, where), where, max_pixels)
        else:
            img = _open_path(text, base_dir, where, max_pixels)
    else:
        raise DataError(f"{where}: unsupported image value of type {type(obj).__name__} (expected a path, bytes, "
                        "a {'bytes', 'path'} dict, a base64 string or a PIL image)")
    try:
        img.load()  # a lazily opened PIL image passed in decodes here, inside the try
        size = stored_size(img)
        img = to_rgb(img)
        img.info["stored_size"] = size
        return img
    except Exception as e:
        raise DataError(f"{where}: cannot decode the image ({type(e).__name__}: {e})") from e


def stored_size(img: Image.Image) -> tuple[int, int]:
    """(width, height) of the image as stored, also when it was decoded at a reduced (draft) scale."""
    return img.info.get("stored_size", img.size)


def to_rgb(img: Image.Image) -> Image.Image:
    """`img` as RGB. Transparency (an alpha band, or a palette/RGB/L image's `transparency` entry) is composited on
    white, as transformers' `convert_to_rgb`: a plain `convert("RGB")` drops the alpha, showing the colour transparent
    pixels hold (often black). Integer ("I;16*", "I") and float ("F") images are scaled to 8 bits from their values'
    range, 0..255 kept, else 0..65535 (PIL's own conversion clips them to white); PIL converts the rest."""
    if img.mode == "RGB" and "transparency" not in img.info:
        return img
    if img.mode.startswith(("I", "F")):
        arr = np.asarray(img, dtype=np.float64)
        if img.mode == "F" and arr.size and np.nanmax(arr) <= 1.0:
            arr = arr * 255  # a float image in 0..1
        elif arr.size and arr.max() > 255:
            arr = arr / 257  # 16-bit range: 65535 -> 255
        return Image.fromarray(np.clip(np.nan_to_num(arr), 0, 255).round().astype(np.uint8), "L").convert("RGB")
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # L, 1, P, CMYK, YCbCr, ...


def resize_to_pixel_bounds(img: Image.Image, min_pixels: int | None, max_pixels: int | None) -> Image.Image:
    """Scale by one factor s (aspect ratio kept) so that min_pixels <= w * h <= max_pixels, as EasyR1's `process_image`:
    s = sqrt(max_pixels / (w * h)) above the bound, s = sqrt(min_pixels / (w * h)) below it. Sizes round down when
    shrinking and up when growing, so the bound holds (EasyR1 rounds both down, landing a few pixels under min_pixels);
    sides stay >= 1 px. BICUBIC; an image within bounds (or with no bounds, None/0) is returned as is."""
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


def _open_bytes(data: bytes, where: str, max_pixels: int | None = None) -> Image.Image:
    return _decode(io.BytesIO(data), max_pixels, where, "image bytes", "cannot decode image bytes")


def _open_path(path: str, base_dir: str | None, where: str, max_pixels: int | None = None) -> Image.Image:
    full = path if os.path.isabs(path) or base_dir is None else os.path.join(base_dir, path)
    if not os.path.isfile(full):
        shown = full if len(full) <= 200 else full[:200] + "..."
        hint = f" (relative paths resolve against {base_dir})" if base_dir and not os.path.isabs(path) else ""
        raise DataError(f"{where}: image file {shown!r} not found{hint}")
    return _decode(full, max_pixels, where, f"image {full!r}", f"cannot read image {full!r}")


def _decode(source, max_pixels: int | None, where: str, name: str, failure: str) -> Image.Image:
    """The decoded image (detached from its file: truncated data fails here), a JPEG at the smallest draft scale
    keeping it above `max_pixels`. Errors start with `where`: a decompression bomb's says the size of `name`, any
    other's `failure`; the bomb warning (1 to 2 x MAX_IMAGE_PIXELS) is silenced: such an image is decoded, bounded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(source) as img:
                w, h = img.size
                if max_pixels and img.format == "JPEG" and w * h > max_pixels:
                    s = math.sqrt(max_pixels / (w * h))  # draft picks a scale >= the requested size
                    img.draft(img.mode if img.mode in ("RGB", "L") else None, (math.ceil(w * s), math.ceil(h * s)))
                img.load()
                out = img.copy()
        except Image.DecompressionBombError as e:
            size = re.search(r"\((\d+) pixels\)", str(e))
            raise DataError(f"{where}: {name} has {int(size.group(1)) if size else 'too many'} pixels, more than PIL "
                            f"decodes safely ({2 * Image.MAX_IMAGE_PIXELS}); shrink the image file") from e
        except Exception as e:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ValueError, ...
            raise DataError(f"{where}: {failure} ({type(e).__name__}: {e})") from e
    out.info["stored_size"] = (w, h)
    return out


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
