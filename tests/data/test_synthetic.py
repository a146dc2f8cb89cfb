"""rllava/data/synthetic.py: record shapes, determinism, balance, atomic writes, and that each image really holds
its answer (shapes counted as blobs, boxes equal to the named shape's pixels, SFT targets scoring perfectly)."""

import collections
import json
import math
import os

import numpy as np
import pytest
from PIL import Image

from rllava.data import synthetic
from rllava.data.records import DataError, load_records
from rllava.data.synthetic import (BACKGROUND, COLORS, COUNTING_QUESTION, POLYGON_QUESTIONS, draw_shapes, latex, main,
                                   make_counting, make_dataset, shape_box, to_grid)
from rllava.reward.function import load_reward_function


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def count_blobs(image) -> int:
    """8-connected groups of non-background pixels of an image (or image file), by an iterative flood fill."""
    image = image if isinstance(image, Image.Image) else Image.open(image)
    fg = (np.asarray(image.convert("RGB")) != np.array(BACKGROUND)).any(-1)  # (H, W)
    seen, blobs = np.zeros_like(fg), 0
    for y0, x0 in zip(*np.nonzero(fg)):
        if seen[y0, x0]:
            continue
        blobs += 1
        seen[y0, x0] = True
        stack = [(y0, x0)]
        while stack:
            y, x = stack.pop()
            for yy in range(max(y - 1, 0), min(y + 2, fg.shape[0])):
                for xx in range(max(x - 1, 0), min(x + 2, fg.shape[1])):
                    if fg[yy, xx] and not seen[yy, xx]:
                        seen[yy, xx] = True
                        stack.append((yy, xx))
    return blobs


def test_record_shape_and_images(counting_dir):
    records = read_jsonl(os.path.join(counting_dir, "train.jsonl"))
    assert len(records) == 64 and len(read_jsonl(os.path.join(counting_dir, "val.jsonl"))) == 16
    assert records[0]["images"] == ["images/train_00000.png"]
    for r in records:
        assert set(r) == {"images", "problem", "answer", "solution"}
        assert r["problem"] == COUNTING_QUESTION == "<image>How many shapes are in the image?"
        assert r["answer"] in {"1", "2", "3", "4", "5"} and r["solution"] == f"<answer>{r['answer']}</answer>"
    img = Image.open(os.path.join(counting_dir, records[0]["images"][0]))
    assert img.size == (112, 112) and img.mode == "RGB"
    ds = load_records(os.path.join(counting_dir, "val.jsonl"))  # loads through the normal record path
    assert ds.column_names == ["images", "problem", "answer", "solution"]


def test_drawn_shapes_match_the_answer(counting_dir):
    records = read_jsonl(os.path.join(counting_dir, "val.jsonl"))
    for r in records:
        assert count_blobs(os.path.join(counting_dir, r["images"][0])) == int(r["answer"]), r


def test_counts_are_balanced(counting_dir):
    counts = collections.Counter(r["answer"] for r in read_jsonl(os.path.join(counting_dir, "val.jsonl")))
    assert sorted(counts) == ["1", "2", "3", "4", "5"]
    assert max(counts.values()) - min(counts.values()) <= 1  # 16 records: 4, 3, 3, 3, 3
    counts = collections.Counter(r["answer"] for r in read_jsonl(os.path.join(counting_dir, "train.jsonl")))
    assert max(counts.values()) - min(counts.values()) <= 1  # 64 records: 13, 13, 13, 13, 12


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = make_counting(str(tmp_path / "a"), n_train=10, n_val=5, seed=7)
    b = make_counting(str(tmp_path / "b"), n_train=10, n_val=5, seed=7)
    c = make_counting(str(tmp_path / "c"), n_train=10, n_val=5, seed=8)
    for split in ("train", "val"):
        assert open(a[split], "rb").read() == open(b[split], "rb").read()
    names = sorted(os.listdir(a["images"]))
    assert len(names) == 15 and names == sorted(os.listdir(b["images"]))
    for name in names:
        pa, pb = Image.open(os.path.join(a["images"], name)), Image.open(os.path.join(b["images"], name))
        assert pa.tobytes() == pb.tobytes()
    differ = [Image.open(os.path.join(a["images"], n)).tobytes() != Image.open(os.path.join(c["images"], n)).tobytes()
              for n in names]
    assert all(differ)


def test_val_set_does_not_depend_on_train_size(tmp_path):
    a = make_counting(str(tmp_path / "a"), n_train=5, n_val=5, seed=0)
    b = make_counting(str(tmp_path / "b"), n_train=15, n_val=5, seed=0)
    assert open(a["val"]).read() == open(b["val"]).read()
    assert Image.open(os.path.join(a["images"], "val_00004.png")).tobytes() == \
        Image.open(os.path.join(b["images"], "val_00004.png")).tobytes()


def test_other_sizes_fit_five_shapes(tmp_path):
    paths = make_counting(str(tmp_path / "small"), n_train=5, n_val=0, seed=0, size=56)
    for r in read_jsonl(paths["train"]):
        img = os.path.join(tmp_path, "small", r["images"][0])
        assert Image.open(img).size == (56, 56) and count_blobs(img) == int(r["answer"])


def test_interrupted_run_leaves_nothing_and_keeps_the_old_set(tmp_path, monkeypatch):
    out = tmp_path / "counting"
    make_counting(str(out), n_train=5, n_val=0, seed=0)
    before = open(out / "train.jsonl").read()
    calls = []

    def failing_draw(rng, count, size=112):
        calls.append(count)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return Image.new("RGB", (size, size), BACKGROUND)

    monkeypatch.setattr(synthetic, "draw_counting_image", failing_draw)
    with pytest.raises(KeyboardInterrupt):
        make_counting(str(out), n_train=10, n_val=0, seed=1)
    assert sorted(os.listdir(tmp_path)) == ["counting"]  # no temporary directory left beside it
    assert open(out / "train.jsonl").read() == before
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        make_counting(str(tmp_path / "new"), n_train=10, n_val=0, seed=1)
    assert sorted(os.listdir(tmp_path)) == ["counting"]


def test_cli(tmp_path, capsys):
    main(["counting", "--out", str(tmp_path / "cli"), "--train", "5", "--val", "5", "--seed", "3"])
    assert "wrote 5 train and 5 val records" in capsys.readouterr().out
    assert len(read_jsonl(tmp_path / "cli" / "train.jsonl")) == 5
    assert len(os.listdir(tmp_path / "cli" / "images")) == 10


def test_bad_arguments(tmp_path):
    with pytest.raises(DataError, match="--size must be >= 56 px to fit 5 shapes, got 40"):
        make_counting(str(tmp_path / "x"), n_train=5, n_val=5, size=40)
    with pytest.raises(DataError, match="must be >= 0, got -1 and 5"):
        make_counting(str(tmp_path / "x"), n_train=-1, n_val=5)
    with pytest.raises(SystemExit):
        main(["counting", "--out", str(tmp_path / "x"), "--size", "40"])
    assert not os.path.exists(tmp_path / "x")


# --- grounding, ovd, math ---------------------------------------------------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _reward(name):
    return load_reward_function(os.path.join(REPO, "examples/reward_function", f"{name}.py:score_one"))


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    return {task: make_dataset(task, str(root / task), n_train=24, n_val=8, seed=0)
            for task in ("grounding", "ovd", "math")}


def _pixels(paths, record):
    return np.asarray(Image.open(os.path.join(os.path.dirname(paths["train"]), record["images"][0])).convert("RGB"))


def test_grounding_box_is_the_named_shape(sets):
    grounding = _reward("grounding_iou")
    for r in read_jsonl(sets["grounding"]["train"]):
        assert set(r) == {"images", "problem", "expression", "answer", "solution"}
        color, kind = r["expression"].split()[1:]
        assert r["problem"] == f"Locate the {color} {kind}.<image>" and kind in {"circle", "square", "triangle"}
        ys, xs = np.nonzero((_pixels(sets["grounding"], r) == COLORS[color]).all(-1))  # colours are distinct
        assert r["answer"] == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]  # the box is exactly its pixels
        assert 0 <= r["answer"][0] < r["answer"][2] <= 112 and 0 <= r["answer"][1] < r["answer"][3] <= 112
        # the SFT target, on the 0-1000 grid, scores IoU ~1 (grid rounding only)
        assert grounding(r["solution"], r["answer"], [(112, 112)], [(112, 112)], frame="qwen2_vl")["iou"] > 0.97


def test_shape_box_matches_drawn_pixels():
    for shape in [("circle", 30, 40, 12), ("square", 50, 50, 20), ("triangle", 60, 55, 16)]:
        ys, xs = np.nonzero((np.asarray(draw_shapes(112, [shape], ["red"])) == COLORS["red"]).all(-1))
        assert shape_box(*shape) == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], shape
    assert to_grid([0, 56, 112, 28], 112) == [0, 500, 1000, 250]


def test_ovd_boxes_are_every_shape_of_the_category(sets):
    ovd = _reward("ovd_ap")
    categories = set()
    for r in read_jsonl(sets["ovd"]["train"]):
        assert set(r) == {"images", "problem", "category", "answer", "solution"}
        assert r["problem"] == f"<image>Detect every {r['category']}." and 1 <= len(r["answer"]) <= 2
        categories.add(r["category"])
        pixels = _pixels(sets["ovd"], r)
        for box in r["answer"]:
            assert 0 <= box[0] < box[2] <= 1000 and 0 <= box[1] < box[3] <= 1000
            x1, y1, x2, y2 = (round(v * 112 / 1000) for v in box)
            assert (pixels[y1:y2, x1:x2] != BACKGROUND).any(-1).mean() > 0.4  # a shape fills the box
        # the category's colour (one per kind) is only inside its boxes: the answer misses none of them
        mine = (pixels == COLORS[synthetic.CATEGORY_COLORS[r["category"]]]).all(-1)
        for box in r["answer"]:
            x1, y1, x2, y2 = (round(v * 112 / 1000) for v in box)
            mine[max(0, y1 - 1):y2 + 1, max(0, x1 - 1):x2 + 1] = False
        assert not mine.any(), r
        assert ovd(r["solution"], r["answer"])["overall"] == 1.0  # the SFT target is a perfect detection
    assert categories == {"circle", "square", "triangle"}


def test_math_answers(sets):
    math_reward = _reward("math_answer")
    possible = {latex(f(n)) for f in POLYGON_QUESTIONS.values() for n in range(3, 7)}
    assert {"\\frac{1}{5}", "108", "720", "6"} <= possible
    kinds = set()
    for r in read_jsonl(sets["math"]["train"]):
        assert set(r) == {"images", "problem", "answer", "solution", "kind"}
        kinds.add(r["kind"])
        assert math_reward(r["solution"], r["answer"])["overall"] == 1.0
        path = os.path.join(os.path.dirname(sets["math"]["train"]), r["images"][0])
        if r["kind"] == "polygon":
            assert r["answer"] in possible
            # the radius is fixed, so the filled area is the regular n-gon's: (n / 2) r^2 sin(2 pi / n)
            sides = {latex(f(n)): n for n in range(3, 7) for q, f in POLYGON_QUESTIONS.items() if q in r["problem"]}
            n, radius = sides[r["answer"]], 0.42 * 112
            area = (np.asarray(Image.open(path).convert("RGB")) != BACKGROUND).any(-1).sum()
            assert abs(area / (n / 2 * radius**2 * math.sin(2 * math.pi / n)) - 1) < 0.05, r
        else:  # count the dots of each row as blobs
            img = Image.open(path)
            top = count_blobs(img.crop((0, 0, 112, 56)))
            bottom = count_blobs(img.crop((0, 56, 112, 112)))
            expected = top + bottom if "total" in r["problem"] else top - bottom
            assert r["answer"] == str(expected), r
    assert kinds == {"polygon", "arithmetic"}


@pytest.mark.parametrize("task", ["grounding", "ovd", "math"])
def test_every_task_is_deterministic(tmp_path, task):
    a = make_dataset(task, str(tmp_path / "a"), n_train=4, n_val=2, seed=5)
    b = make_dataset(task, str(tmp_path / "b"), n_train=4, n_val=2, seed=5)
    c = make_dataset(task, str(tmp_path / "c"), n_train=4, n_val=2, seed=6)
    assert open(a["train"]).read() == open(b["train"]).read() != open(c["train"]).read()
    for name in sorted(os.listdir(a["images"])):
        assert open(os.path.join(a["images"], name), "rb").read() == open(os.path.join(b["images"], name), "rb").read()


def test_cli_other_tasks(tmp_path, capsys):
    main(["ovd", "--out", str(tmp_path / "ovd"), "--train", "3", "--val", "1"])
    assert "wrote 3 train and 1 val records" in capsys.readouterr().out
    with pytest.raises(DataError, match="unknown task 'vqa'; choose one of counting, grounding, ovd, math"):
        make_dataset("vqa", str(tmp_path / "x"))
