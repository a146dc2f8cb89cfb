"""Synthetic datasets in the record shape of the real ones, generated offline and deterministically.

    python -m rllava.data.synthetic TASK --out DIR [--train 4000] [--val 200] [--seed 0] [--size 112]

Every task writes `train.jsonl`, `val.jsonl` and `images/*.png`; each record has the real set's fields plus
`solution`, the SFT target (what the tiny recipes warm up on). Shapes (circle, square, triangle; 8 colours) sit on a
plain light background, never touching. Each split has its own RNG stream (the val set does not change with
--train); same arguments -> byte-identical files. Boxes are (x1, y1, x2, y2), x2 and y2 exclusive: the shape's
pixels are exactly columns x1..x2-1 and rows y1..y2-1.

counting (CLEVR-count-like): 1-5 shapes and a fixed question (the count is only in the image), each count equally
often when n is a multiple of 5. 112 px images, radius 11-16 px (scaled with --size): measured learnable by a
4.75 M-parameter Qwen2-VL on CPU (docs/cpu_learning.md).
    {"images": ["images/train_00000.png"], "problem": "<image>How many shapes are in the image?",
     "answer": "3", "solution": "<answer>3</answer>"}

grounding (RefCOCO-like referring expressions): 1-2 shapes of different colours on a 2 x 2 grid (`_grid_layout`);
the expression names one by colour and kind; `answer` is its box in pixels (RefCOCO's frame), `solution` on
Qwen2-VL's / Qwen3-VL's 0-1000 grid. The image follows the expression, so the text between image and answer is the
same in every prompt (M-RoPE then places each image token at a fixed offset from the answer).
    {"images": [...], "problem": "Locate the red circle.<image>", "expression": "the red circle",
     "answer": [11, 67, 46, 102], "solution": "<answer>[98, 598, 411, 911]</answer>"}

ovd (COCO/LVIS-style open-vocabulary detection): 1-3 shapes on the same grid, 1-2 of the asked kind, each kind in its
own colour (CATEGORY_COLORS); `answer`: every box of that kind on the 0-1000 grid (the OVD task's frame), `solution`
the JSON a detector writes.
    {"images": [...], "problem": "<image>Detect every circle.", "category": "circle",
     "answer": [[98, 598, 411, 911]], "solution": "<answer>[{\"bbox_2d\": [98, 598, 411, 911], \"score\": 0.9}]</answer>"}

math (Geometry3K-like diagrams): a filled regular polygon with 3-6 sides and a question about it (its sides, the sum
of its interior angles, one interior angle 180 (n - 2) / n, or each exterior angle as a fraction of a full turn, a
LaTeX fraction), or two rows of 1-4 dots and an arithmetic question (the total, or how many more on top). A fixed
radius (the area tells the sides apart), bigger dots and these ranges let the tiny models learn (docs/proof.md).
    {"images": [...], "problem": "<image>What fraction of a full turn is each exterior angle of the regular
     polygon?", "answer": "\\frac{1}{5}", "solution": "<answer>\\frac{1}{5}</answer>", "kind": "polygon"}

agent_search (MAT-Search-like, for multi-turn agents with the `search` tool): one shape, a colour x kind entity; the
question asks where it lives on a given day, an arbitrary word (PLACES) that only `corpus.jsonl` (beside the splits,
one document per entity and day) says; the val set asks only facts the train set never does (`agent_search_split`).
`turns` is the expert trajectory (multi-turn SFT replays it through the tool): a search, then the answer it found,
or in GUESS_RATE of the train records a guess without a search; `doc_id` the document holding the answer, `query`
the expert's search (Visual-ARFT's query reward compares the agent's to it).
    {"images": [...], "problem": "<image>Where does the shape in the image live on day 17? Search for it, then
     answer.", "answer": "cylinder", "entity": "red triangle", "day": 17, "doc_id": "red triangle day 17",
     "query": "red triangle day 17", "solution": "<answer> cylinder</answer>",
     "turns": ["<search> red triangle day 17</search>", "<answer> cylinder</answer>"]}
agent_code (MAT-Coding-like, for agents with the sandboxed `code` tool): an upright image (a black bar along its top,
one shape in each half, two colours) turned 90/180/270 degrees, flipped top to bottom, or darkened to a fifth (`op`);
the question asks the upper shape's colour once upright. `turns`: a snippet undoing `op` (AGENT_CODE_FIXES; it saves
fixed.png, which comes back as an image), then the answer; in GUESS_RATE of the train records an answer without code.
    {"images": [...], "problem": "<image>The black bar marks the top. Upright, what colour is the upper shape?",
     "answer": "red", "op": "rotate90", "solution": "<answer> red</answer>",
     "turns": ["<code>from PIL import Image, ImageEnhance\\nImage.open('image.png').rotate(-90,
     expand=True).save('fixed.png')</code>", "<answer> red</answer>"]}
"""

import argparse
import json
import math
import os
import random
from fractions import Fraction

from PIL import Image, ImageDraw, ImageEnhance

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
KINDS = tuple(EXTENT)
# OVD: each category has its own colour, as real object categories differ in more than outline (issue 7,
# docs/proof.md: with random colours the tiny Qwen3-VL told the kinds apart after 200-300 SFT steps, not ~150).
CATEGORY_COLORS = {"circle": "red", "square": "blue", "triangle": "green"}
MAX_COUNT = 5


def _grid_layout(rng: random.Random, count: int, size: int, cells: int = 2) -> list[tuple]:
    """`count` shapes (kind, x, y, r) in distinct cells of a `cells` x `cells` grid, each centred in its cell with
    radius 0.3 cell (inside it whatever the kind): a box takes one of cells^2 x 3 kinds positions. Fixed, as measured
    (issue 7, docs/proof.md): jittered centres and radii made every coordinate a spread of number tokens, answered
    with one mean box per kind. A 2 x 2 grid matches the 2 x 2 blocks of image tokens a 112 px image makes."""
    cell = size / cells
    return [(rng.choice(KINDS), round((k % cells + 0.5) * cell), round((k // cells + 0.5) * cell), round(0.3 * cell))
            for k in rng.sample(range(cells * cells), count)]


def _corners(kind: str, x: int, y: int, r: int) -> list[int] | list[tuple[int, int]]:
    """What PIL draws: the ellipse/rectangle bounds or the triangle's vertices (the square's half-side 0.8 r)."""
    if kind == "circle":
        return [x - r, y - r, x + r, y + r]
    if kind == "square":
        s = round(0.8 * r)
        return [x - s, y - s, x + s, y + s]
    return [(x, y - r), (x - r, y + round(0.8 * r)), (x + r, y + round(0.8 * r))]


def shape_box(kind: str, x: int, y: int, r: int) -> list[int]:
    """The pixel box (x1, y1, x2, y2), x2/y2 exclusive, of a shape drawn by `draw_shapes`."""
    c = _corners(kind, x, y, r)
    if kind == "triangle":
        xs, ys = [p[0] for p in c], [p[1] for p in c]
        c = [min(xs), min(ys), max(xs), max(ys)]
    return [c[0], c[1], c[2] + 1, c[3] + 1]


def draw_shapes(size: int, shapes: list[tuple], colors: list[str]) -> Image.Image:
    """A `size` x `size` RGB image, each shape (kind, x, y, r) a blob of exactly its colour (no anti-aliasing)."""
    img = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for (kind, x, y, r), color in zip(shapes, colors):
        paint = {"circle": draw.ellipse, "square": draw.rectangle, "triangle": draw.polygon}[kind]
        paint(_corners(kind, x, y, r), fill=COLORS[color])
    return img


def draw_counting_image(rng: random.Random, count: int, size: int = 112) -> Image.Image:
    """`count` separate shapes in random colours (colours may repeat), their circumscribed discs GAP px apart and
    inside the canvas, by rejection sampling; a layout that gets stuck is redrawn whole (sizes included)."""
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
            return draw_shapes(size, placed, [rng.choice(tuple(COLORS)) for _ in placed])
    raise DataError(f"synthetic: cannot fit {count} shapes in a {size}x{size} image; use --size >= 56")


def to_grid(box: list[int], size: int) -> list[int]:
    """A pixel box of a `size` px square image on the 0-1000 grid (Qwen2-VL / Qwen3-VL / OVD frame)."""
    return [round(v * 1000 / size) for v in box]


def _counting(rng: random.Random, i: int, size: int) -> tuple[Image.Image, dict]:
    count = 1 + i % MAX_COUNT  # balanced; `make_dataset` shuffles the order through `order`
    return draw_counting_image(rng, count, size), {"problem": COUNTING_QUESTION, "answer": str(count),
                                                   "solution": f"<answer>{count}</answer>"}


def _grounding(rng: random.Random, i: int, size: int) -> tuple[Image.Image, dict]:
    shapes = _grid_layout(rng, rng.randint(1, 2), size)
    colors = rng.sample(tuple(COLORS), len(shapes))  # distinct colours: "the red circle" names one shape
    k = rng.randrange(len(shapes))
    box = shape_box(*shapes[k])
    expression = f"the {colors[k]} {shapes[k][0]}"
    return draw_shapes(size, shapes, colors), {
        "problem": f"Locate {expression}.<image>", "expression": expression, "answer": box,
        "solution": "<answer>[{}, {}, {}, {}]</answer>".format(*to_grid(box, size))}


def _ovd(rng: random.Random, i: int, size: int) -> tuple[Image.Image, dict]:
    category = KINDS[i % len(KINDS)]
    shapes = []
    while not 1 <= sum(s[0] == category for s in shapes) <= 2:
        shapes = _grid_layout(rng, rng.randint(1, 3), size)
    colors = [CATEGORY_COLORS[s[0]] for s in shapes]
    boxes = sorted(to_grid(shape_box(*s), size) for s in shapes if s[0] == category)
    detections = ", ".join(f'{{"bbox_2d": [{b[0]}, {b[1]}, {b[2]}, {b[3]}], "score": 0.9}}' for b in boxes)
    return draw_shapes(size, shapes, colors), {
        "problem": f"<image>Detect every {category}.", "category": category, "answer": boxes,
        "solution": f"<answer>[{detections}]</answer>"}


POLYGON_QUESTIONS = {  # question -> answer as a fraction of n (the number of sides)
    "How many sides does the polygon have?": lambda n: Fraction(n),
    "Find the sum of the interior angles of the polygon, in degrees.": lambda n: Fraction(180 * (n - 2)),
    "Find the measure of each interior angle of the regular polygon, in degrees.": lambda n: Fraction(180 * (n - 2), n),
    "What fraction of a full turn is each exterior angle of the regular polygon?": lambda n: Fraction(1, n),
}
DOTS_QUESTIONS = {
    "How many dots are there in total?": lambda top, bottom: top + bottom,
    "How many more dots are in the top row than in the bottom row?": lambda top, bottom: top - bottom,
}


def latex(q: Fraction) -> str:
    """12 -> '12', 900/7 -> '\\frac{900}{7}' (Geometry3K writes fractions in LaTeX)."""
    return str(q.numerator) if q.denominator == 1 else f"\\frac{{{q.numerator}}}{{{q.denominator}}}"


def _math(rng: random.Random, i: int, size: int) -> tuple[Image.Image, dict]:
    img = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(img)
    color = COLORS[rng.choice(tuple(COLORS))]
    if i % 2 == 0:  # a regular polygon, filled, randomly turned
        sides, radius, turn = rng.randint(3, 6), 0.42 * size, rng.uniform(0, 2 * math.pi)
        points = [(size / 2 + radius * math.cos(turn + 2 * math.pi * k / sides),
                   size / 2 + radius * math.sin(turn + 2 * math.pi * k / sides)) for k in range(sides)]
        draw.polygon(points, fill=color)
        question = rng.choice(tuple(POLYGON_QUESTIONS))
        kind, answer = "polygon", latex(POLYGON_QUESTIONS[question](sides))
    else:  # two rows of dots: top >= bottom
        top, bottom = sorted((rng.randint(1, 4), rng.randint(1, 4)), reverse=True)
        r, step = size // 14, size / 5
        for row, count in ((size * 0.27, top), (size * 0.73, bottom)):
            for k in range(count):
                draw.ellipse([step * (k + 1) - r, row - r, step * (k + 1) + r, row + r], fill=color)
        question = rng.choice(tuple(DOTS_QUESTIONS))
        kind, answer = "arithmetic", str(DOTS_QUESTIONS[question](top, bottom))
    return img, {"problem": f"<image>{question}", "answer": answer, "solution": f"<answer>{answer}</answer>",
                 "kind": kind}


# Where the agent_search entities "live": words that are one token (with their leading space) in the tiny models'
# vocabulary, so an answer is copied from the search result as one token (made-up names split into 5-7 pieces).
PLACES = ("angle", "area", "bounding", "confidence", "coordinates", "cube", "cylinder", "degrees", "final", "first",
          "format", "item", "label", "length", "line", "number", "object", "output", "point", "reason", "sphere",
          "step", "system", "value")
AGENT_SEARCH_QUESTION = "<image>Where does the shape in the image live on day {day}? Search for it, then answer."
DAYS = range(10, 100)  # two-digit days: one token each, and words of 2+ characters to BM25's tokenizer
# The share of train records whose expert trajectory (`turns`) answers at once with a guess instead of searching:
# the warm-up leaves a model that sometimes answers from "memory", as pretrained VLMs do before agent RL (RLLaVA's
# MAT-Search baseline), and RL has to find out that searching pays.
GUESS_RATE = 1 / 3


def agent_search_world(seed: int) -> dict[tuple[str, int], str]:
    """(entity, day) -> the place the entity lives that day, for the 24 colour x kind entities ("red triangle") and
    90 days: the agent_search corpus's facts. 2160 facts, each asked ~2-3 times in 4000 records, are too many for a
    tiny model to memorise (with 480, GRPO rewarded recalling the train facts and the held-out F1 fell), and a
    record's image and question do not give its answer: it is read from a search result. Seed only: one corpus."""
    rng = random.Random(f"agent_search-world-{seed}")
    return {(f"{c} {k}", d): rng.choice(PLACES) for c in COLORS for k in KINDS for d in DAYS}


def agent_search_split(seed: int) -> set[tuple[str, int]]:
    """The (entity, day) facts only the val set asks about (a quarter): answered by searching, not from memory."""
    facts = sorted(agent_search_world(seed))
    return set(random.Random(f"agent_search-heldout-{seed}").sample(facts, len(facts) // 4))


def _agent_search(rng: random.Random, i: int, size: int, *, split: str, seed: int):
    world, heldout = agent_search_world(seed), agent_search_split(seed)
    facts = sorted(f for f in world if (f in heldout) == (split == "val"))
    entity, day = facts[rng.randrange(len(facts))]
    color, kind = entity.split()
    shapes = _grid_layout(rng, 1, size)
    image = draw_shapes(size, [(kind, *shapes[0][1:])], [color])
    place, doc = world[(entity, day)], f"{entity} day {day}"
    # the expert writes a space before each word, so its tokens are the corpus's (" cylinder" is one token)
    turns = [f"<search> {doc}</search>", f"<answer> {place}</answer>"]
    if split == "train" and rng.random() < GUESS_RATE:  # a model that answers from memory: a guess, no search
        turns = [f"<answer> {rng.choice(PLACES)}</answer>"]
    return image, {"problem": AGENT_SEARCH_QUESTION.format(day=day), "answer": place, "entity": entity, "day": day,
                   "doc_id": doc, "query": doc, "solution": f"<answer> {place}</answer>", "turns": turns}


def _agent_search_corpus(out_dir: str, seed: int) -> None:
    """corpus.jsonl: one document per fact, "On day 17 the red triangle lives in cylinder." (id: the expert's query)."""
    with open(os.path.join(out_dir, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for (entity, day), place in agent_search_world(seed).items():
            text = f"On day {day} the {entity} lives in {place}."
            f.write(json.dumps({"id": f"{entity} day {day}", "text": text}) + "\n")


# agent_code: how each degradation is undone by the expert's snippet (PIL's rotate turns counter-clockwise)
AGENT_CODE_FIXES = {
    "rotate90": "Image.open('image.png').rotate(-90, expand=True).save('fixed.png')",
    "rotate180": "Image.open('image.png').rotate(180).save('fixed.png')",
    "rotate270": "Image.open('image.png').rotate(90, expand=True).save('fixed.png')",
    "flip": "Image.open('image.png').rotate(180).save('fixed.png')",  # the upper shape comes back to the top
    "dark": "ImageEnhance.Brightness(Image.open('image.png')).enhance(5).save('fixed.png')",
}
AGENT_CODE_QUESTION = "<image>The black bar marks the top. Upright, what colour is the upper shape?"
DARKEN = 0.2  # the dark images' brightness (the fix brightens 5x)


def degrade(image: Image.Image, op: str) -> Image.Image:
    """The upright `image` after agent_code's degradation `op` (a key of AGENT_CODE_FIXES)."""
    if op.startswith("rotate"):
        return image.rotate(int(op[6:]), expand=True)
    if op == "flip":
        return image.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    return ImageEnhance.Brightness(image).enhance(DARKEN)


def _agent_code(rng: random.Random, i: int, size: int, *, split: str, seed: int):
    upper, lower = rng.sample(sorted(COLORS), 2)
    bar = max(2, size // 10)
    r = round(rng.uniform(11, 14) * size / 112)
    shapes = [(rng.choice(KINDS), rng.randint(r + 2, size - r - 3), rng.randint(bar + r + 2, size // 2 - r - 1)),
              (rng.choice(KINDS), rng.randint(r + 2, size - r - 3), rng.randint(size // 2 + r + 1, size - r - 3))]
    image = draw_shapes(size, [(k, x, y, r) for k, x, y in shapes], [upper, lower])
    ImageDraw.Draw(image).rectangle([0, 0, size - 1, bar - 1], fill=(0, 0, 0))
    op = rng.choice(sorted(AGENT_CODE_FIXES))
    code = "from PIL import Image, ImageEnhance\n" + AGENT_CODE_FIXES[op]
    turns = [f"<code>{code}</code>", f"<answer> {upper}</answer>"]
    if split == "train" and rng.random() < GUESS_RATE:  # answers from the degraded image, no code
        turns = [f"<answer> {rng.choice(sorted(COLORS))}</answer>"]
    return degrade(image, op), {"problem": AGENT_CODE_QUESTION, "answer": upper, "op": op,
                                "solution": f"<answer> {upper}</answer>", "turns": turns}


TASKS = {"counting": _counting, "grounding": _grounding, "ovd": _ovd, "math": _math, "agent_search": _agent_search,
         "agent_code": _agent_code}
EXTRA_FILES = {"agent_search": _agent_search_corpus}  # files beside the splits (the search corpus)
SPLIT_AWARE = {"agent_search", "agent_code"}  # generators told the split (the val set differs) and the seed


def make_dataset(task: str, out_dir: str, n_train: int = 4000, n_val: int = 200, seed: int = 0,
                 size: int = 112) -> dict:
    """Write `train.jsonl`, `val.jsonl` and `images/*.png` of `task` under `out_dir` atomically (built beside it,
    then renamed into place, replacing an older `out_dir`): an interrupted run leaves nothing half-written.
    Returns {"train": path, "val": path, "images": path}."""
    if task not in TASKS:
        raise DataError(f"synthetic: unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if n_train < 0 or n_val < 0:
        raise DataError(f"synthetic {task}: --train and --val must be >= 0, got {n_train} and {n_val}")
    if size < 56:
        raise DataError(f"synthetic {task}: --size must be >= 56 px to fit {MAX_COUNT} shapes, got {size}")
    with atomic_directory(out_dir) as tmp:
        os.makedirs(os.path.join(tmp, "images"))
        for split, n in (("train", n_train), ("val", n_val)):
            rng = random.Random(f"{task}-{split}-{seed}")  # str seeds hash with SHA-512: stable across runs
            order = list(range(n))
            rng.shuffle(order)  # i % k balances classes; shuffled so consecutive records differ
            extra = {"split": split, "seed": seed} if task in SPLIT_AWARE else {}
            with open(os.path.join(tmp, f"{split}.jsonl"), "w", encoding="utf-8") as f:
                for j, i in enumerate(order):
                    rel = f"images/{split}_{j:05d}.png"
                    image, fields = TASKS[task](rng, i, size, **extra)
                    image.save(os.path.join(tmp, rel), format="PNG")
                    f.write(json.dumps({"images": [rel], **fields}) + "\n")
        if task in EXTRA_FILES:
            EXTRA_FILES[task](tmp, seed)
    return {"train": os.path.join(out_dir, "train.jsonl"), "val": os.path.join(out_dir, "val.jsonl"),
            "images": os.path.join(out_dir, "images")}


def make_counting(out_dir: str, n_train: int = 4000, n_val: int = 200, seed: int = 0, size: int = 112) -> dict:
    """The counting set (see the module docstring)."""
    return make_dataset("counting", out_dir, n_train, n_val, seed, size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllava.data.synthetic",
                                     description="Generate a synthetic dataset (offline, deterministic).")
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    for flag, default, text in (("--train", 4000, "training records"), ("--val", 200, "held-out records"),
                                ("--seed", 0, None), ("--size", 112, "image side in pixels")):
        parser.add_argument(flag, type=int, default=default, help=text)
    args = parser.parse_args(argv)
    try:
        paths = make_dataset(args.task, args.out, args.train, args.val, args.seed, args.size)
    except DataError as e:
        parser.exit(2, f"error: {e}\n")
    print(f"wrote {args.train} train and {args.val} val records: {paths['train']}, {paths['val']}")


if __name__ == "__main__":
    main()
