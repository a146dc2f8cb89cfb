import json

import pytest
from omegaconf import OmegaConf

from rllava.config import DataConfig
from rllava.data.dataset import PromptDataset, encode_prompt
from rllava.data.records import DataError
from rllava.model.processor import load_processor


@pytest.fixture(scope="module")
def processor(tiny_model_dir):
    return load_processor(tiny_model_dir)


def _cfg(**kw):
    base = dict(prompt_key="problem", answer_key="answer", image_key="images", max_prompt_length=512,
                min_pixels=3136, max_pixels=12544)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), base, kw))


def test_sample_messages_images_and_template(tmp_path, counting_dir, processor):
    template = tmp_path / "t.jinja"
    template.write_text("{{ content | trim }} Reply in <answer></answer>. ({{ answer | length }})")
    ds = PromptDataset(f"{counting_dir}/train.jsonl", _cfg(format_prompt=str(template)), processor)
    s = ds[0]
    assert s.messages[0]["content"][0] == {"type": "image"}  # placed where <image> was
    assert s.messages[0]["content"][1]["text"] == "How many shapes are in the image? Reply in <answer></answer>. (1)"
    assert len(s.images) == 1 and s.images[0].size == (112, 112)
    assert s.ground_truth in {"1", "2", "3", "4", "5"} and s.extra == {"solution": f"<answer>{s.ground_truth}</answer>"}
    ids, mm = encode_prompt(processor, s)
    assert ids.count(processor.image_token_id) == mm["image_grid_thw"].prod().item() // 4


def test_overlong_prompts_are_filtered_and_counted(tmp_path, counting_dir, processor, caplog):
    rows = [json.loads(line) for line in open(f"{counting_dir}/train.jsonl")][:6]
    rows[2]["problem"] = "<image>" + " very long question" * 100
    rows[4]["images"] = [rows[4]["images"][0]] * 2
    rows[4]["problem"] = "<image><image>two images"
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "images").symlink_to(f"{counting_dir}/images")
    ds = PromptDataset(str(path), _cfg(max_prompt_length=55), processor)
    assert len(ds) == 4 and ds.num_filtered == 2  # the long one and the two-image one (32 image tokens)
    assert "filtered 2 of 6 prompts: 2 longer than data.max_prompt_length=55 tokens (the longest has 8" in caplog.text
    ds = PromptDataset(str(path), _cfg(max_prompt_length=4096), processor, limit_images=1)
    assert ds.num_filtered == 1
    with pytest.raises(DataError) as e:
        PromptDataset(str(path), _cfg(max_prompt_length=5), processor)
    longest = max(len(encode_prompt(processor, ds.sample(row))[0]) for row in range(6))
    assert str(e.value) == (f"{path}: all 6 prompts were filtered: 6 are longer than data.max_prompt_length=5 tokens "
                            f"(image tokens included; shortest 47, longest {longest}): raise data.max_prompt_length "
                            f"(to {longest} to keep them all)")


def test_bad_records_name_the_record(tmp_path, counting_dir, processor):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "<image><image>x", "answer": "1", "images": ["a.png"]}) + "\n")
    (tmp_path / "a.png").write_bytes(open(f"{counting_dir}/images/train_00000.png", "rb").read())
    with pytest.raises(DataError, match=r"d.jsonl record 0: the prompt has 2 <image> markers but the record has 1"):
        PromptDataset(str(path), _cfg(), processor)
    with pytest.raises(DataError, match=r"records have no field 'question'"):
        PromptDataset(str(path), _cfg(prompt_key="question"), processor)
    missing = tmp_path / "t.jinja"
    with pytest.raises(DataError, match="data.format_prompt: template file .* does not exist"):
        PromptDataset(str(path), _cfg(format_prompt=str(missing)), processor)
    missing.write_text("{% if %}")
    with pytest.raises(DataError, match="data.format_prompt: .*t.jinja line 1"):
        PromptDataset(str(path), _cfg(format_prompt=str(missing)), processor)


# ---- bad records are one line at start-up, naming the file, the record and the key ----

@pytest.fixture
def write(tmp_path, counting_dir):
    """write(rows) -> the path of a jsonl of `rows`, beside a copy of one counting image as a.png."""
    (tmp_path / "a.png").write_bytes(open(f"{counting_dir}/images/train_00000.png", "rb").read())

    def write(rows, name="d.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(tmp_path / name)
    return write


def test_answers_reach_the_sample_as_written(write, processor):
    answers = ["3", "007", 3, 3.5, [1, 2], {"label": "cat"}]
    path = write([{"problem": f"<image>q{i}", "answer": a, "images": ["a.png"]} for i, a in enumerate(answers)])
    ds = PromptDataset(path, _cfg(), processor)
    got = [ds[i].ground_truth for i in range(len(ds))]
    assert got == answers and [type(a) for a in got] == [type(a) for a in answers]


@pytest.mark.parametrize("key", ["problem", "answer"])
def test_a_record_without_its_prompt_or_answer(write, processor, key):
    rows = [{"problem": "<image>q", "answer": "1", "images": ["a.png"]} for _ in range(3)]
    del rows[1][key]
    path = write(rows)
    config_key = {"problem": "data.prompt_key", "answer": "data.answer_key"}[key]
    rest = ", ".join(k for k in ("problem", "answer", "images") if k != key)
    with pytest.raises(DataError) as e:
        PromptDataset(path, _cfg(), processor)
    assert str(e.value) == f"{path} record 1 has no {key!r} ({config_key}; its fields: {rest}): every record needs one"
    rows[1][key] = None  # null is the same as missing
    with pytest.raises(DataError, match=rf"record 1 has no {key!r}"):
        PromptDataset(write(rows), _cfg(), processor)


def test_an_image_key_matching_no_field(write, processor):
    rows = [{"problem": "How many?", "answer": "1", "image": "a.png"}] * 3 + \
           [{"problem": "<image>How many?", "answer": "1", "image": "a.png"}]
    path = write(rows)
    with pytest.raises(DataError) as e:  # the default key, but a prompt has a marker: not a text-only set
        PromptDataset(path, _cfg(), processor)
    assert str(e.value) == (f"{path}: data.image_key='images' matches no field of the records (fields: problem, "
                            "answer, image) but record 3's prompt has a <image> marker: set data.image_key to the "
                            "field holding the images")
    text_only = write([{"problem": "How many?", "answer": "1"}], "text.jsonl")
    with pytest.raises(DataError, match=r"data.image_key='pictures' matches no field .* but data.image_key was set"):
        PromptDataset(text_only, _cfg(image_key="pictures"), processor)
    with pytest.raises(DataError, match=r"data.video_key='clips' matches no field .* but data.video_key was set"):
        PromptDataset(text_only, _cfg(video_key="clips"), processor)
    assert PromptDataset(text_only, _cfg(), processor)[0].images == []  # text-only with default keys: fine
    ds = PromptDataset(path, _cfg(image_key="image"), processor)
    assert len(ds[0].images) == 1 and ds[3].messages[0]["content"][0] == {"type": "image"}


def test_markers_must_match_the_images(write, processor):
    ok = {"problem": "<image>q", "answer": "1", "images": ["a.png"]}
    path = write([ok, ok, {"problem": "<image>q", "answer": "1", "images": []}])
    with pytest.raises(DataError, match=r"d.jsonl record 2: the prompt has 1 <image> markers but the record has 0 "
                                        r"images \(in data.image_key='images'\)"):
        PromptDataset(path, _cfg(), processor)
    path = write([ok, {"problem": "<video>q", "answer": "1", "images": ["a.png"], "videos": None}])
    with pytest.raises(DataError, match=r"record 1: the prompt has 1 <video> markers but the record has 0 videos"):
        PromptDataset(path, _cfg(), processor)
    # with data.filter_overlong_prompts=false only the first records are built at start-up; the rest when read
    rows = [ok] * 9 + [{"problem": "<image><image>q", "answer": "1", "images": ["a.png"]}]
    ds = PromptDataset(write(rows), _cfg(filter_overlong_prompts=False), processor)
    assert len(ds) == 10 and len(ds[8].images) == 1
    with pytest.raises(DataError, match=r"record 9: the prompt has 2 <image> markers but the record has 1 images"):
        ds[9]


def test_a_template_that_drops_an_image_is_caught_at_encoding(write, processor):
    """A chat template that renders no image placeholder, or a message with more image parts than images: the
    processor's own error, named with the record instead of surfacing from deep inside a rollout. (transformers
    < 5.23 encodes a prompt without placeholders: rllava's own check names the record then.)"""
    path = write([{"problem": "<image>q", "answer": "1", "images": ["a.png"]}] * 2)
    ds = PromptDataset(path, _cfg(), processor)
    sample = ds[1]
    dropping = processor.chat_template.replace("<|vision_start|><|image_pad|><|vision_end|>", "")
    original, processor.chat_template = processor.chat_template, dropping
    try:
        with pytest.raises(DataError, match=rf"^{path} record 1: (the processor cannot encode the prompt with its 1 "
                                            r"image\(s\) \(ValueError: .*Found total 0 <\|image_pad\|> tokens and 1|"
                                            r"the encoded prompt has 0 image placeholder tokens but its 1 image)"):
            encode_prompt(processor, sample)
    finally:
        processor.chat_template = original
    sample.messages[0]["content"].insert(0, {"type": "image"})  # two image parts, one image
    with pytest.raises(DataError, match=rf"^{path} record 1: the processor cannot encode the prompt with its 1 "
                                        r"image\(s\) \(\w+: "):  # transformers 5.20: a StopIteration
        encode_prompt(processor, sample)


def test_placeholder_guard(write, processor):
    """Image tokens cut from an encoded prompt (truncation through them), or an image the ids have no tokens
    for: named with the record before the model sees the mismatch."""
    from rllava.data.dataset import check_placeholders

    path = write([{"problem": "<image>q", "answer": "1", "images": ["a.png"]},
                  {"problem": "<image>x<image>y", "answer": "1", "images": ["a.png", "a.png"]}])
    ds = PromptDataset(path, _cfg(), processor)
    sample = ds[1]
    ids, mm = encode_prompt(processor, sample)
    check_placeholders(processor, ids, mm, sample)  # as encoded: 2 x 16 image tokens
    first = ids.index(processor.image_token_id)
    with pytest.raises(DataError) as e:
        check_placeholders(processor, ids[:first + 5], mm, sample)  # truncated inside the first image's tokens
    assert str(e.value) == (f"{path} record 1: the encoded prompt has 5 image placeholder tokens but its 2 image(s) "
                            "need 32: the chat template (data.override_chat_template or the tokenizer's) must render "
                            "every {'type': 'image'} part of the message")
    one_image = encode_prompt(processor, ds[0])
    with pytest.raises(DataError, match="has 16 image placeholder tokens but its 2 image"):
        check_placeholders(processor, one_image[0], mm, sample)  # one image's tokens, two images' features


def test_placeholder_guard_knows_the_modular_vlm(tmp_path_factory, write):
    """The LLaVA-style processor of the modular VLM: the guard's count agrees with the processor's expansion
    (no false alarm), and catches a cut."""
    from rllava.data.dataset import check_placeholders
    from rllava.model.tiny import build_tiny

    model_dir = build_tiny("tinyllava", str(tmp_path_factory.mktemp("models") / "tinyllava"), size="small")
    proc = load_processor(model_dir)
    ds = PromptDataset(write([{"problem": "<image>q", "answer": "1", "images": ["a.png"]}]), _cfg(), proc)
    ids, mm = encode_prompt(proc, ds[0])
    token = proc.image_token_id
    assert ids.count(token) > 1
    with pytest.raises(DataError, match=f"has {ids.count(token) - 1} image placeholder tokens but its 1 image"):
        check_placeholders(proc, ids[:ids.index(token)] + ids[ids.index(token) + 1:], mm, ds[0])


def test_tiny_and_odd_images(write, tmp_path, processor):
    from PIL import Image

    Image.new("RGBA", (1, 1), (0, 0, 0, 0)).save(tmp_path / "dot.png")
    Image.new("RGB", (1000, 2), (9, 9, 9)).save(tmp_path / "line.png")
    dot = {"problem": "<image>q", "answer": "1", "images": ["dot.png"]}
    ds = PromptDataset(write([dot]), _cfg(), processor)
    s = ds[0]  # 1 x 1 -> 56 x 56 (min_pixels 3136), white (transparent on white), encodes to 4 image tokens
    assert s.images[0].size == (56, 56) and s.images[0].getpixel((0, 0)) == (255, 255, 255)
    assert s.image_sizes == [(1, 1)]
    ids, mm = encode_prompt(processor, s)
    assert ids.count(processor.image_token_id) == 4
    path = write([dot, {"problem": "<image>q", "answer": "1", "images": ["line.png"]}])
    with pytest.raises(DataError, match=rf"^{path} record 1: the processor cannot encode the prompt with its 1 "
                                        r"image\(s\) \(ValueError: absolute aspect ratio must be smaller than 200"):
        PromptDataset(path, _cfg(), processor)  # 1000 x 2: an aspect ratio Qwen-VL refuses


def test_missing_and_truncated_image_files_name_the_record(write, tmp_path, processor):
    data = (tmp_path / "a.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    ok = {"problem": "<image>q", "answer": "1", "images": ["a.png"]}
    with pytest.raises(DataError, match=r"d.jsonl record 1, images\[0\]: image file .*gone.png' not found"):
        PromptDataset(write([ok, {**ok, "images": ["gone.png"]}]), _cfg(), processor)
    with pytest.raises(DataError, match=r"d.jsonl record 1, images\[0\]: cannot read image .*cut.png"):
        PromptDataset(write([ok, {**ok, "images": ["cut.png"]}]), _cfg(), processor)


def test_image_feature_columns_decode_by_rllava_rules(tmp_path, processor):
    """A parquet/hub Image column reaches load_image undecoded: a decompression bomb inside one is the same one
    line naming the record, not PIL's exception from inside `datasets`."""
    import datasets

    features = datasets.Features({"problem": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "images": datasets.Sequence(datasets.Image())})
    rows = {"problem": ["<image>q", "<image>q"], "answer": ["1", "2"],
            "images": [[{"bytes": _png(), "path": None}],
                       [{"bytes": _png_header(30000, 30000), "path": None}]]}
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "d.parquet"))
    with pytest.raises(DataError, match=r"d.parquet record 1, images\[0\]: image bytes has 900000000 pixels"):
        PromptDataset(str(tmp_path / "d.parquet"), _cfg(), processor)
    ds = PromptDataset(str(tmp_path / "d.parquet"), _cfg(max_samples=1), processor)
    assert ds[0].images[0].size == (56, 56) and ds[0].image_sizes == [(8, 8)]


def _png_header(width, height):
    """A (cut) PNG declaring width x height: PIL refuses it at open, before any pixel data."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _png():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def test_rllava_agent_search_dataset_keeps_final_answer_rows(tmp_path, counting_dir, processor):
    """RLLaVA's AgentSearchDataset, by name: rows whose `solution` holds a final <answer> (its RFT mix also has
    gold-<search>-only rows), the ground truth being the text inside the tags (agent_search_dataset.py)."""
    rows = [json.loads(line) for line in open(f"{counting_dir}/train.jsonl")][:5]
    rows[1]["solution"] = "<think>look it up</think><search> red day 3</search>"  # a search step: dropped
    rows[3]["solution"] = None
    rows[4]["solution"] = "<think>so</think>\n<answer>\n two words \n</answer>"
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "images").symlink_to(f"{counting_dir}/images")
    cfg = _cfg(answer_key="solution", dataset_class="examples/tasks/agent_search/agent_search_dataset.py:"
               "AgentSearchDataset")
    ds = PromptDataset(str(path), cfg, processor)
    assert len(ds) == 3 and [ds[i].ground_truth for i in range(3)] == [rows[0]["answer"], rows[2]["answer"],
                                                                     "two words"]
    (tmp_path / "e.jsonl").write_text(json.dumps(rows[1]) + "\n")
    with pytest.raises(DataError, match=r"e.jsonl: data.dataset_class=AgentSearchDataset keeps records whose "
                                        r"'solution' holds a final <answer>...</answer>, and none of the 1 does"):
        PromptDataset(str(tmp_path / "e.jsonl"), cfg, processor)
