"""rllava/data/synthetic.py: record shape, determinism, balance, atomic writes, and that each image really holds
`answer` shapes (counted as separate blobs of non-background pixels)."""

import collections
import json
import os

import numpy as np
import pytest
from PIL import Image

from rllava.data import synthetic
from rllava.data.records import DataError, load_records
from rllava.data.synthetic import BACKGROUND, COUNTING_QUESTION, main, make_counting


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def count_blobs(path) -> int:
    """8-connected groups of non-background pixels, by an iterative flood fill."""
    fg = (np.asarray(Image.open(path).convert("RGB")) != np.array(BACKGROUND)).any(-1)  # (H, W)
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
