"""rllava/data/images.py: every image form, pixel bounds, list normalisation and every error."""

import base64
import io
import re

import pytest
from PIL import Image

from rllava.data.images import load_image, normalize_image_list, resize_to_pixel_bounds
from rllava.data.records import DataError

WHERE = "train.jsonl record 17, images[0]"
W = re.escape(WHERE)  # for pytest.raises(match=...)


def png_bytes(size=(5, 3), color=(10, 200, 30), mode="RGB"):
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def image_file(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(png_bytes())
    return tmp_path


def check(img, size=(5, 3), color=(10, 200, 30)):
    assert isinstance(img, Image.Image) and img.mode == "RGB" and img.size == size
    assert img.getpixel((0, 0)) == color


def test_relative_and_absolute_path(image_file):
    check(load_image("images/a.png", base_dir=str(image_file), where=WHERE))
    check(load_image(str(image_file / "images" / "a.png"), base_dir="/elsewhere", where=WHERE))
    check(load_image(image_file / "images" / "a.png", base_dir=None, where=WHERE))  # os.PathLike


def test_bytes_and_hf_image_dicts(image_file):
    data = png_bytes()
    check(load_image(data, base_dir=None, where=WHERE))
    check(load_image({"bytes": data, "path": None}, base_dir=None, where=WHERE))
    check(load_image({"bytes": data, "path": "ignored.png"}, base_dir=None, where=WHERE))  # bytes win
    check(load_image({"bytes": None, "path": "images/a.png"}, base_dir=str(image_file), where=WHERE))


def test_base64_bare_wrapped_and_data_url():
    text = base64.b64encode(png_bytes()).decode()
    check(load_image(text, base_dir=None, where=WHERE))
    check(load_image("\n".join(text[i:i + 20] for i in range(0, len(text), 20)), base_dir=None, where=WHERE))
    check(load_image("data:image/png;base64," + text, base_dir=None, where=WHERE))


def test_pil_and_mode_conversion():
    check(load_image(Image.new("RGB", (5, 3), (10, 200, 30)), base_dir=None, where=WHERE))
    rgba = load_image(png_bytes(color=(10, 200, 30, 255), mode="RGBA"), base_dir=None, where=WHERE)
    check(rgba)
    gray = load_image(Image.new("L", (5, 3), 77), base_dir=None, where=WHERE)
    check(gray, color=(77, 77, 77))


def test_normalize_image_list():
    assert normalize_image_list(None) == []
    assert normalize_image_list([]) == []
    assert normalize_image_list("") == []
    assert normalize_image_list("a.png") == ["a.png"]
    assert normalize_image_list(["a.png", "b.png"]) == ["a.png", "b.png"]
    assert normalize_image_list(("a.png",)) == ["a.png"]
    assert normalize_image_list({"bytes": b"x", "path": None}) == [{"bytes": b"x", "path": None}]


# ---- pixel bounds ----

def test_resize_down_to_max_pixels():
    # 400 x 200 = 80000 > 20000: s = sqrt(20000 / 80000) = 0.5 -> 200 x 100
    assert resize_to_pixel_bounds(Image.new("RGB", (400, 200)), 100, 20000).size == (200, 100)
    # 300 x 300 = 90000 > 50000: s = 0.745... -> 223.6 -> 223 x 223 = 49729 <= 50000 (rounded down)
    assert resize_to_pixel_bounds(Image.new("RGB", (300, 300)), None, 50000).size == (223, 223)


def test_resize_up_to_min_pixels():
    # 10 x 5 = 50 < 200: s = 2 -> 20 x 10 = 200
    assert resize_to_pixel_bounds(Image.new("RGB", (10, 5)), 200, 10**6).size == (20, 10)
    # 3 x 3 = 9 < 100: s = 3.33 -> 10 x 10 (rounded up; EasyR1's int() gives 9 x 9 = 81 < 100)
    assert resize_to_pixel_bounds(Image.new("RGB", (3, 3)), 100, None).size == (10, 10)


def test_resize_keeps_aspect_bounds_and_one_pixel():
    for w, h in [(1000, 7), (37, 1301), (640, 480), (13, 11)]:
        out = resize_to_pixel_bounds(Image.new("RGB", (w, h)), 3136, 50176)
        assert 3136 <= out.size[0] * out.size[1] <= 50176 or min(out.size) == 1
        assert abs(out.size[0] / out.size[1] - w / h) / (w / h) < 0.2
    # 10000 x 2 with max 100: s = 0.0707 -> 707 x 0.14 -> height kept at 1 px
    assert resize_to_pixel_bounds(Image.new("RGB", (10000, 2)), None, 100).size == (707, 1)


def test_resize_within_bounds_is_identity_and_deterministic():
    img = Image.new("RGB", (64, 64))
    assert resize_to_pixel_bounds(img, 1000, 10000) is img
    assert resize_to_pixel_bounds(img, None, None) is img
    src = Image.effect_noise((97, 61), 50).convert("RGB")
    a, b = resize_to_pixel_bounds(src, None, 1500), resize_to_pixel_bounds(src, None, 1500)
    assert a.tobytes() == b.tobytes()


# ---- errors: DataError naming `where` ----

def test_missing_file(tmp_path):
    with pytest.raises(DataError) as e:
        load_image("images/missing.png", base_dir=str(tmp_path), where=WHERE)
    msg = str(e.value)
    assert msg.startswith(WHERE) and "missing.png' not found" in msg and f"resolve against {tmp_path}" in msg
    with pytest.raises(DataError, match=rf"^{W}: image file .*gone\.png' not found"):
        load_image({"bytes": None, "path": "gone.png"}, base_dir=str(tmp_path), where=WHERE)


def test_truncated_and_corrupt_files(tmp_path):
    data = png_bytes(size=(64, 64))
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.png").write_bytes(b"this is not an image")
    with pytest.raises(DataError, match=rf"^{W}: cannot read image .*cut\.png"):
        load_image("cut.png", base_dir=str(tmp_path), where=WHERE)
    with pytest.raises(DataError, match=rf"^{W}: cannot read image .*junk\.png.*UnidentifiedImageError"):
        load_image("junk.png", base_dir=str(tmp_path), where=WHERE)


def test_undecodable_bytes_and_base64():
    with pytest.raises(DataError, match=rf"^{W}: cannot decode image bytes"):
        load_image(b"\x89PNG but not really", base_dir=None, where=WHERE)
    with pytest.raises(DataError, match=rf"^{W}: cannot decode image bytes"):
        load_image({"bytes": png_bytes()[:40], "path": None}, base_dir=None, where=WHERE)
    with pytest.raises(DataError, match=rf"^{W}: invalid base64 image data"):
        load_image("data:image/png;base64,iVBORw0KGgo!!!", base_dir=None, where=WHERE)
    with pytest.raises(DataError, match=rf"^{W}: cannot decode image bytes"):
        load_image(base64.b64encode(png_bytes())[:48].decode(), base_dir=None, where=WHERE)
    with pytest.raises(DataError, match=rf"^{W}: data URL .* is not a base64 image"):
        load_image("data:text/plain,hello", base_dir=None, where=WHERE)


def test_unknown_type_and_empty_dict():
    with pytest.raises(DataError, match=rf"^{W}: unsupported image value of type int"):
        load_image(3, base_dir=None, where=WHERE)
    with pytest.raises(DataError, match=rf"^{W}: image dict has neither 'bytes' nor 'path'"):
        load_image({"bytes": None, "path": None}, base_dir=None, where=WHERE)


def test_lazy_pil_image_of_a_truncated_file(tmp_path):
    data = png_bytes(size=(64, 64))
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    lazy = Image.open(tmp_path / "cut.png")  # e.g. handed over undecoded by another library
    with pytest.raises(DataError, match=rf"^{W}: cannot decode the image"):
        load_image(lazy, base_dir=None, where=WHERE)


# ---- colour modes: every image reaches the model as the RGB a viewer shows ----

def saved(img, fmt="PNG", **kw):
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_transparency_is_composited_on_white():
    # A transparent background whose hidden colour is black, one opaque red and one half-transparent red pixel.
    rgba = Image.new("RGBA", (4, 2), (0, 0, 0, 0))
    rgba.putpixel((1, 0), (255, 0, 0, 255))
    rgba.putpixel((2, 0), (255, 0, 0, 128))
    img = load_image(saved(rgba), base_dir=None, where=WHERE)
    assert img.mode == "RGB" and img.getpixel((0, 0)) == (255, 255, 255) and img.getpixel((1, 0)) == (255, 0, 0)
    assert img.getpixel((2, 0)) == (255, 127, 127)
    la = Image.new("LA", (2, 1), (0, 0))
    la.putpixel((1, 0), (40, 255))
    img = load_image(saved(la), base_dir=None, where=WHERE)
    assert [img.getpixel((x, 0)) for x in range(2)] == [(255, 255, 255), (40, 40, 40)]
    pal = Image.new("P", (2, 1), 0)
    pal.putpalette([0, 0, 0, 0, 0, 255])
    pal.putpixel((1, 0), 1)
    img = load_image(saved(pal, transparency=0), base_dir=None, where=WHERE)  # palette entry 0 is transparent
    assert [img.getpixel((x, 0)) for x in range(2)] == [(255, 255, 255), (0, 0, 255)]


def test_opaque_palette_grayscale_bilevel_and_cmyk():
    pal = Image.new("P", (2, 1), 1)
    pal.putpalette([0, 0, 0, 0, 200, 0])
    assert load_image(saved(pal), base_dir=None, where=WHERE).getpixel((0, 0)) == (0, 200, 0)
    assert load_image(saved(Image.new("1", (3, 3), 1)), base_dir=None, where=WHERE).getpixel((0, 0)) == (255,) * 3
    cmyk = load_image(saved(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG", quality=100),
                      base_dir=None, where=WHERE)
    r, g, b = cmyk.getpixel((4, 4))
    assert cmyk.mode == "RGB" and r > 240 and g < 15 and b < 15  # cyan/magenta/yellow ink: red


def test_16_and_32_bit_images_are_scaled_not_clipped():
    import numpy as np

    deep = Image.fromarray(np.array([[0, 32896, 65535]], dtype=np.uint16))  # mode I;16
    for data in (deep, saved(deep)):  # as a PIL image, and as a 16-bit PNG (reads back as I;16 or I)
        img = load_image(data, base_dir=None, where=WHERE)
        assert [img.getpixel((x, 0)) for x in range(3)] == [(0, 0, 0), (128, 128, 128), (255, 255, 255)]
    small = Image.fromarray(np.array([[0, 100, 255]], dtype=np.int32), "I")  # an 8-bit image held in I
    img = load_image(small, base_dir=None, where=WHERE)
    assert [img.getpixel((x, 0))[0] for x in range(3)] == [0, 100, 255]
    f = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), "F")
    assert [load_image(f, base_dir=None, where=WHERE).getpixel((x, 0))[0] for x in range(3)] == [0, 128, 255]


# ---- size: huge images stay bounded, bombs are one line ----

def _png_header(width, height):
    """A (cut) PNG declaring width x height (PIL checks the size at open, before any pixel data)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_decompression_bomb_is_one_line(tmp_path):
    (tmp_path / "bomb.png").write_bytes(_png_header(30000, 30000))
    with pytest.raises(DataError, match=rf"^{W}: image .*bomb\.png' has 900000000 pixels, more than PIL decodes "
                                        r"safely \(\d+\); shrink the image file$"):
        load_image("bomb.png", base_dir=str(tmp_path), where=WHERE)
    with pytest.raises(DataError, match=rf"^{W}: image bytes has 900000000 pixels"):
        load_image(_png_header(30000, 30000), base_dir=None, where=WHERE)


def test_large_jpeg_decodes_at_a_reduced_scale_and_keeps_its_stored_size():
    from rllava.data.images import stored_size

    data = saved(Image.new("RGB", (1600, 800), (200, 30, 30)), "JPEG")
    img = load_image(data, base_dir=None, where=WHERE, max_pixels=20000)
    assert img.size == (200, 100) and stored_size(img) == (1600, 800)  # 1/8 scale: 20000 px, not below the bound
    img = load_image(data, base_dir=None, where=WHERE, max_pixels=100000)
    assert img.size == (800, 400) and stored_size(img) == (1600, 800)  # 1/2: 1/4 would fall below 100000 px
    full = load_image(data, base_dir=None, where=WHERE)
    assert full.size == (1600, 800) and stored_size(full) == (1600, 800)
    out = resize_to_pixel_bounds(img, None, 100000)
    assert out.size[0] * out.size[1] <= 100000 and abs(out.getpixel((5, 5))[0] - 200) < 8


def test_a_12000_pixel_square_jpeg_keeps_memory_bounded(tmp_path):
    """Decoded whole, 12000 x 12000 is 144 MB as grayscale and 432 MB as RGB; with the draft scale the
    process grows by a few MB. Measured in a fresh process (peak RSS), with PIL's bomb warning made an error."""
    import subprocess
    import sys

    Image.new("L", (12000, 12000), 90).save(tmp_path / "big.jpg", quality=50)
    code = ("import resource, warnings\n"
            "from PIL import Image\n"
            "warnings.simplefilter('error', Image.DecompressionBombWarning)\n"
            "from rllava.data.images import load_image, resize_to_pixel_bounds\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            f"img = load_image('big.jpg', base_dir={str(tmp_path)!r}, where='w', max_pixels=4194304)\n"
            "img = resize_to_pixel_bounds(img, 3136, 4194304)\n"
            "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
            "print(img.size, img.getpixel((0, 0)), grew // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    w, h, grew_mb = int(out[0].strip("(,")), int(out[1].strip(")")), int(out[-1])
    assert w == h and w * h <= 4194304 and w >= 2000
    assert grew_mb < 80, f"loading grew the process by {grew_mb} MB"
