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
