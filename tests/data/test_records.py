"""rllava/data/records.py: every accepted data form, `@split`, max_samples, base_dir and every error."""

import io
import json
import os

import datasets
import pytest
from PIL import Image

from rllava.data.images import load_image
from rllava.data.records import DataError, base_dir, check_keys, load_records, split_spec

ROWS = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}, {"problem": "3+3?", "answer": "6"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def as_rows(ds):
    return [{k: ds[i][k] for k in ("problem", "answer")} for i in range(len(ds))]


def test_jsonl(tmp_path):
    ds = load_records(write_jsonl(tmp_path / "train.jsonl", ROWS))
    assert as_rows(ds) == ROWS


def test_jsonl_keeps_fields_missing_from_the_first_record(tmp_path):
    rows = [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2", "extra": 7}]
    ds = load_records(write_jsonl(tmp_path / "train.jsonl", rows))
    assert ds["extra"] == [None, 7]


def test_json_list_and_data_field(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps(ROWS, indent=2))
    (tmp_path / "dict.json").write_text(json.dumps({"data": ROWS}))
    assert as_rows(load_records(str(tmp_path / "list.json"))) == ROWS
    assert as_rows(load_records(str(tmp_path / "dict.json"))) == ROWS


def test_parquet(tmp_path):
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "train.parquet"))
    assert as_rows(load_records(str(tmp_path / "train.parquet"))) == ROWS
    assert as_rows(load_records(str(tmp_path / "train.parquet") + "@train")) == ROWS


def test_save_to_disk_dataset_and_dataset_dict(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "single"))
    assert as_rows(load_records(str(tmp_path / "single"))) == ROWS
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                               "test": datasets.Dataset.from_list(ROWS[:1])})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert as_rows(load_records(str(tmp_path / "dict") + "@test")) == ROWS[:1]
    assert len(load_records(str(tmp_path / "dict") + "@train")) == 3
    with pytest.raises(DataError, match=r"has splits train, test: choose one with .*@<split>"):
        load_records(str(tmp_path / "dict"))
    with pytest.raises(DataError, match=r"no split 'validation' \(splits: train, test\)"):
        load_records(str(tmp_path / "dict") + "@validation")


def test_hub_style_directory(tmp_path):
    (tmp_path / "hub" / "data").mkdir(parents=True)
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "hub/data/train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(ROWS[:2]).to_parquet(str(tmp_path / "hub/data/test-00000-of-00001.parquet"))
    assert as_rows(load_records(str(tmp_path / "hub") + "@train")) == ROWS
    assert as_rows(load_records(str(tmp_path / "hub") + "@test")) == ROWS[:2]


def test_path_with_at_sign_that_exists(tmp_path):
    (tmp_path / "v@2").mkdir()
    spec = write_jsonl(tmp_path / "v@2" / "train.jsonl", ROWS)
    assert split_spec(spec) == (spec, None)
    assert len(load_records(spec)) == 3
    assert split_spec("hiyouga/math12k@train") == ("hiyouga/math12k", "train")


def test_max_samples(tmp_path):
    spec = write_jsonl(tmp_path / "train.jsonl", ROWS)
    assert as_rows(load_records(spec, max_samples=2)) == ROWS[:2]
    assert len(load_records(spec, max_samples=10)) == 3
    assert len(load_records(spec, max_samples=-1)) == 3


def test_image_feature_column_from_parquet_stays_lazy_and_loads(tmp_path):
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), (255, 0, 0)).save(buf, format="PNG")
    features = datasets.Features({"problem": datasets.Value("string"), "images": datasets.Sequence(datasets.Image())})
    ds = datasets.Dataset.from_dict({"problem": ["q"], "images": [[{"bytes": buf.getvalue(), "path": None}]]},
                                    features=features)
    ds.to_parquet(str(tmp_path / "img.parquet"))
    records = load_records(str(tmp_path / "img.parquet"))
    assert isinstance(records.features["images"].feature, datasets.Image)  # kept as the Image feature
    assert set(records[0]["images"][0]) == {"bytes", "path"}  # undecoded: load_image decodes it by rllava's rules
    img = load_image(records[0]["images"][0], base_dir=None, where="img.parquet record 0, images[0]")
    assert img.size == (6, 4) and img.mode == "RGB" and img.getpixel((0, 0)) == (255, 0, 0)
    single = datasets.Dataset.from_dict({"problem": ["q"], "image": [{"bytes": buf.getvalue(), "path": None}]},
                                        features=datasets.Features({"problem": datasets.Value("string"),
                                                                    "image": datasets.Image()}))
    single.save_to_disk(str(tmp_path / "saved"))
    raw = load_records(str(tmp_path / "saved"))[0]["image"]
    assert set(raw) == {"bytes", "path"} and load_image(raw, base_dir=None, where="x").size == (6, 4)


def test_base_dir(tmp_path):
    spec = write_jsonl(tmp_path / "train.jsonl", ROWS)
    assert base_dir(spec) == str(tmp_path)
    assert base_dir(spec, str(tmp_path / "imgs")) == str(tmp_path / "imgs")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert base_dir(str(tmp_path / "saved") + "@train") == str(tmp_path / "saved")
    assert base_dir("hiyouga/math12k@train") is None


def test_check_keys(tmp_path):
    spec = write_jsonl(tmp_path / "train.jsonl", ROWS)
    ds = load_records(spec)
    check_keys(ds, spec, ["problem", "answer"])
    with pytest.raises(DataError) as e:
        check_keys(ds, spec, ["prompt", "answer", "images"])
    msg = str(e.value)
    assert spec in msg and "'prompt', 'images'" in msg and "fields: problem, answer" in msg


# ---- errors: one DataError (a ValueError) naming the file, line or spec ----

def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nothere\.jsonl: no such file or directory"):
        load_records(str(tmp_path / "nothere.jsonl"))
    with pytest.raises(DataError, match="no such file or directory"):
        load_records("./some/dir/train")


def test_unsupported_extension(tmp_path):
    (tmp_path / "train.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match=r"train\.csv: unsupported file type '\.csv'; use \.jsonl, \.json, \.parquet"):
        load_records(str(tmp_path / "train.csv"))


def test_malformed_jsonl_line_is_named(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n\n{"problem": "b", "answer": \n')
    with pytest.raises(DataError, match=r"train\.jsonl line 3: not valid JSON"):
        load_records(str(path))
    path.write_text('{"problem": "a", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"train\.jsonl line 2: expected a JSON object, got list"):
        load_records(str(path))


def test_malformed_json(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[\n{"problem": "a"},\n{"problem": }\n]')
    with pytest.raises(DataError, match=r"train\.json line 3: not valid JSON"):
        load_records(str(path))
    path.write_text('{"rows": []}')
    with pytest.raises(DataError, match=r'expected a list of objects or \{"data": \[\.\.\.\]\}, got a dict'):
        load_records(str(path))
    path.write_text('[{"problem": "a"}, 3]')
    with pytest.raises(DataError, match=r"train\.json: item 1 is a int, expected a JSON object"):
        load_records(str(path))


@pytest.mark.parametrize("name,text",
                         [("e.jsonl", ""), ("w.jsonl", "\n \n"), ("e.json", "[]"), ("d.json", '{"data": []}')])
def test_empty_dataset(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=f"{name}: no records"):
        load_records(str(tmp_path / name))


def test_empty_after_max_samples_and_empty_spec(tmp_path):
    spec = write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DataError, match=r"no records \(data.max_samples=0\)"):
        load_records(spec, max_samples=0)
    with pytest.raises(DataError, match="set data.train_files"):
        load_records("")


def test_split_on_a_single_file(tmp_path):
    spec = write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DataError, match=r"single-split source \(split 'train'\) has no split 'test'; drop '@test'"):
        load_records(spec + "@test")


def test_corrupt_parquet_and_empty_directory(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"bad\.parquet: cannot read it as parquet"):
        load_records(str(tmp_path / "bad.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: cannot load it as a dataset directory"):
        load_records(str(tmp_path / "empty"))


def test_unknown_hub_name_offline(monkeypatch):
    # The real hub code path, made to fail at once (offline mode) instead of retrying the network for ~20 s.
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as e:
        load_records("rllava-tests/no-such-dataset@train")
    msg = str(e.value)
    assert msg.startswith("rllava-tests/no-such-dataset@train: not found locally")
    assert "could not be loaded from the Hugging Face hub" in msg and "\n" not in msg
    assert isinstance(e.value, ValueError)


# ---- values reach the reward as written (datasets alone gives a column one type: 3.0, 7, ...) ----

@pytest.mark.parametrize("answers", [[3, 3.5], ["3", "007", 3], ["3", "007"], [3, [1, 2], {"x": 1}, None, True],
                                     [{"a": 1}, {"b": 2}], [[1, 2.5], ["x"]], [2**70, 1]])
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_json_values_keep_their_types(tmp_path, answers, suffix):
    rows = [{"problem": f"q{i}", "answer": a} for i, a in enumerate(answers)]
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        write_jsonl(path, rows)
    else:
        path.write_text(json.dumps(rows))
    ds = load_records(str(path))
    got = [ds[i]["answer"] for i in range(len(ds))]
    assert got == answers and [type(a) for a in got] == [type(a) for a in answers]
    assert list(ds["answer"]) == answers
    assert [r["answer"] for r in ds.select([len(ds) - 1])] == answers[-1:]  # select keeps the decoding
    assert load_records(str(path), max_samples=1)[0]["answer"] == answers[0]


def test_uniform_columns_keep_their_arrow_type(tmp_path):
    rows = [{"problem": "a", "answer": "3", "n": 1, "x": 0.5, "ok": True, "images": ["a.png"]},
            {"problem": "b", "answer": "007", "n": 2, "x": 1.0, "ok": False, "images": ["b.png", "c.png"]}]
    ds = load_records(write_jsonl(tmp_path / "train.jsonl", rows))
    assert {k: ds.features[k].dtype for k in ("answer", "n", "x", "ok")} == \
        {"answer": "string", "n": "int64", "x": "float64", "ok": "bool"}
    assert [ds[i] for i in range(2)] == rows


def test_an_edited_file_is_read_again(tmp_path):
    spec = write_jsonl(tmp_path / "train.jsonl", ROWS)
    assert load_records(spec)[0]["answer"] == "2"
    write_jsonl(tmp_path / "train.jsonl", [{"problem": "1+1?", "answer": "two"}])
    assert load_records(spec)[0]["answer"] == "two"


def test_decoded_columns_get_a_fingerprint_not_a_random_hash(tmp_path):
    """A JSON-encoded column's decoding transform is hashable (datasets/fingerprint.py `update_fingerprint`: an
    unhashable transform gets `generate_random_fingerprint()` and a multi-line "couldn't be hashed" warning, which
    the closure over json.loads raised on every run): the same file loads with the same fingerprint twice."""
    path = write_jsonl(tmp_path / "train.jsonl", [{"problem": "a", "answer": [1, 2]}, {"problem": "b", "answer": 3}])
    first, second = load_records(path), load_records(path)
    assert first._fingerprint == second._fingerprint and first[0]["answer"] == [1, 2]
