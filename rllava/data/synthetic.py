"""Synthetic datasets in the record shape of the real ones, generated offline and deterministically.

    python -m rllava.data.synthetic counting --out DIR [--train 4000] [--val 200] [--seed 0] [--size 112]

counting: CLEVR-count-like. Each image holds 1-5 non-overlapping shapes (circle, square, triangle; 8 colours)
on a plain light background, and the question is fixed, so the count is only in the image. Records match the
CLEVR counting sets EasyR1/RLLaVA train on, with `solution` as the SFT target:
    {"images": ["images/train_00000.png"], "problem": "<image>How many shapes are in the image?",
     "answer": "3", "solution": "<answer>3</answer>"}
Sizes are the ones measured to be learnable by a 4.5 M-parameter Qwen2-VL on CPU
(shared/reference/cpu_learning_notes.md): 112 px images, shape radius 11-16 px (scaled with --size).
Counts are balanced (each of 1-5 equally often, exactly when n is a multiple of 5). Each split has its own
RNG stream, so the val set does not change with --train. Same arguments -> byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random

from PIL import Image, ImageDraw

from rllava.data.records import DataError
from rllava.utils.fs import atomic_directory

COLORS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30),
          "purple": (150, 60, 190), "orange": (240, 130, 20), "gray": (110, 110, 110), "cyan": (30, 190, 200)}
BACKGROUND = (235, 235, 230)
# Distance from a shape's centre to its farthest pixel, in units of its radius r (the circumradius):
# square of half-side 0.8 r -> 0.8 * sqrt(2); triangle (0, -r), (+-r, 0.8 r) -> sqrt(1 + 0.8^2).
EXTENT = {"circle": 1.0, "square": 0.8 * math.sqrt(2), "triangle": math.sqrt(1 + 0.8**2)}
GAP = 3  # px of background at least between two shapes, so each is one separate blob
COUNTING_QUESTION = "<image>How many shapes are in the image?"
MAX_COUNT = 5


def _layout(rng: random.Random, count: int, size: int) -> list[tuple[str, int, int, int]]:
    """`count` shapes (kind, x, y, r) whose circumscribed discs keep GAP px apart and inside the canvas,
    by rejection sampling; a layout that gets stuck is redrawn whole (sizes included)."""
    rmin, rmax = round(11 * size / 112), round(16 * size / 112)
    for _ in range(1000):
        placed = []
        for _ in range(count):
            kind, r = rng.choice(tuple(EXTENT)), rng.randint(rmin, rmax)
            e = math.ceil(EXTENT[kind] * r)
            for _ in range(100):
                x, y = rng.randint(e + 1, size - e - 2), rng.randint(e + 1, size - e - 2)
                if all(math.hypot(x - x2, y - y2) > e + e2 + GAP for x2, y2, e2 in
                       ((x2, y2, math.ceil(EXTENT[k2] * r2)) for k2, x2, y2, r2 in placed)):
                    placed.append((kind, x, y, r))
                    break
            else:
                break  # no room for this shape: redraw the whole layout
        if len(placed) == count:
            return placed
    raise DataError(f"synthetic counting: cannot fit {count} shapes in a {size}x{size} image; use --size >= 56")


def draw_counting_image(rng: random.Random, count: int, size: int = 112) -> Image.Image:
    """A `size` x `size` RGB image with `count` separate solid shapes (no anti-aliasing, so each is one blob)."""
    img = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for kind, x, y, r in _layout(rng, count, size):
        color = COLORS[rng.choice(tuple(COLORS))]
        if kind == "circle":
            draw.ellipse([x - r, y - r, x + r, y + r], fill=color)
        elif kind == "square":
            s = round(0.8 * r)
            draw.rectangle([x - s, y - s, x + s, y + s], fill=color)
        else:
            draw.polygon([(x, y - r), (x - r, y + round(0.8 * r)), (x + r, y + round(0.8 * r))], fill=color)
    return img


def make_counting(out_dir: str, n_train: int = 4000, n_val: int = 200, seed: int = 0, size: int = 112) -> dict:
    """Write `train.jsonl`, `val.jsonl` and `images/*.png` under `out_dir`, atomically: everything is built in a
    temporary directory beside it and renamed into place (replacing an older `out_dir`), so an interrupted run
    leaves nothing half-written. Returns {"train": path, "val": path, "images": path}."""
    if n_train < 0 or n_val < 0:
        raise DataError(f"synthetic counting: --train and --val must be >= 0, got {n_train} and {n_val}")
    if size < 56:
        raise DataError(f"synthetic counting: --size must be >= 56 px to fit {MAX_COUNT} shapes, got {size}")
    with atomic_directory(out_dir) as tmp:
        os.makedirs(os.path.join(tmp, "images"))
        for split, n in (("train", n_train), ("val", n_val)):
            rng = random.Random(f"counting-{split}-{seed}")  # str seeds hash with SHA-512: stable across runs
            counts = [1 + i % MAX_COUNT for i in range(n)]
            rng.shuffle(counts)
            with open(os.path.join(tmp, f"{split}.jsonl"), "w", encoding="utf-8") as f:
                for i, count in enumerate(counts):
                    rel = f"images/{split}_{i:05d}.png"
                    draw_counting_image(rng, count, size).save(os.path.join(tmp, rel), format="PNG")
                    f.write(json.dumps({"images": [rel], "problem": COUNTING_QUESTION, "answer": str(count),
                                        "solution": f"<answer>{count}</answer>"}) + "\n")
    return {"train": os.path.join(out_dir, "train.jsonl"), "val": os.path.join(out_dir, "val.jsonl"),
            "images": os.path.join(out_dir, "images")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllava.data.synthetic",
                                     description="Generate a synthetic dataset (offline, deterministic).")
    parser.add_argument("task", choices=["counting"])
    parser.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    parser.add_argument("--train", type=int, default=4000, help="training records")
    parser.add_argument("--val", type=int, default=200, help="held-out records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=112, help="image side in pixels")
    args = parser.parse_args(argv)
    try:
        paths = make_counting(args.out, args.train, args.val, args.seed, args.size)
    except DataError as e:
        parser.exit(2, f"error: {e}\n")
    print(f"wrote {args.train} train and {args.val} val records: {paths['train']}, {paths['val']}")


if __name__ == "__main__":
    main()
