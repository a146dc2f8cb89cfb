"""Videos: sampling at fps, the frame cap, pixel bounds, both record forms, errors, and dataset records."""

import io
import json
import re

import pytest
from omegaconf import OmegaConf
from PIL import Image

from rllava.config import DataConfig
from rllava.data.dataset import PromptDataset, encode_prompt
from rllava.data.records import DataError
from rllava.data.video import VideoSpec, load_video, num_sampled_frames
from rllava.model.processor import load_processor


def _gray(i):  # frame i of a test clip is a flat gray of level 8 i, so a decoded frame tells its index
    return Image.new("RGB", (64, 48), (8 * i,) * 3)


@pytest.fixture(scope="module")
def clip(tmp_path_factory, write_mp4):
    """3 s at 10 fps: 30 frames, 64 x 48."""
    return write_mp4(tmp_path_factory.mktemp("clip") / "clip.mp4", [_gray(i) for i in range(30)], fps=10)


def _spec(**kw):
    return VideoSpec(**{"fps": 2.0, "max_frames": 768, "min_pixels": None, "max_pixels": None, **kw})


def _levels(video):
    return [video.frames[k].getpixel((20, 20))[0] for k in range(len(video.frames))]


def test_file_is_sampled_at_fps(clip):
    v = load_video(clip, _spec(fps=2.0), base_dir=None, where="w")
    # 30 frames / 10 fps * 2 fps = 6 frames, linspace(0, 29, 6) rounded
    assert v.indices == [0, 6, 12, 17, 23, 29] and v.fps == 10.0 and v.total_frames == 30
    assert all(abs(level - 8 * i) <= 8 for level, i in zip(_levels(v), v.indices))  # the right frames (lossy codec)
    assert v.metadata().sampled_fps == pytest.approx(2.0) and v.metadata().timestamps[1] == pytest.approx(0.6)
    # 1.5 fps: 4.5 frames -> rounded down to the temporal patch (2): 4
    assert load_video(clip, _spec(fps=1.5), base_dir=None, where="w").indices == [0, 10, 19, 29]
    # faster than the source: every frame, once
    assert load_video(clip, _spec(fps=30.0), base_dir=None, where="w").indices == list(range(30))


def test_max_frames_caps_and_rounds_to_the_temporal_patch(clip):
    assert load_video(clip, _spec(fps=10.0, max_frames=5), base_dir=None, where="w").indices == [0, 10, 19, 29]
    assert num_sampled_frames(30, 10.0, _spec(fps=10.0, max_frames=1)) == 2  # at least one temporal patch
    assert num_sampled_frames(3, 10.0, _spec(fps=0.1)) == 2


@pytest.mark.parametrize("bounds", [(None, None), (None, 28 * 28), (28 * 28 * 8, None), (5000, 9000)])
def test_frames_are_resized_within_the_pixel_bounds(clip, bounds):
    lo, hi = bounds
    v = load_video(clip, _spec(min_pixels=lo, max_pixels=hi), base_dir=None, where="w")
    (w, h), = {f.size for f in v.frames}
    assert w % 28 == 0 and h % 28 == 0
    assert (lo or 0) <= w * h <= (hi or 10**9)
    assert (w, h) == {(None, None): (56, 56), (None, 784): (28, 28), (6272, None): (112, 84),
                      (5000, 9000): (84, 84)}[bounds]


def test_file_forms_and_a_container_without_a_frame_count(clip, tmp_path):
    data = open(clip, "rb").read()
    for obj in (data, {"bytes": data, "path": None}, {"bytes": None, "path": "clip.mp4"}, "clip.mp4"):
        base = clip.rsplit("/", 1)[0]
        assert load_video(obj, _spec(), base_dir=base, where="w").indices == [0, 6, 12, 17, 23, 29]
    import av

    path = tmp_path / "c.mkv"  # Matroska records no frame count: frames are counted from the packets
    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for i in range(30):
            c.mux(s.encode(av.VideoFrame.from_image(_gray(i))))
        c.mux(s.encode())
    v = load_video(str(path), _spec(), base_dir=None, where="w")
    assert v.indices == [0, 6, 12, 17, 23, 29] and v.total_frames == 30


def test_frame_lists_are_padded_and_thinned(tmp_path):
    _gray(2).save(tmp_path / "f2.png")
    buf = io.BytesIO()
    _gray(3).save(buf, format="PNG")
    frames = [_gray(0), _gray(1), "f2.png", buf.getvalue(), _gray(4)]
    v = load_video(frames, _spec(fps=4.0), base_dir=str(tmp_path), where="w")
    assert v.indices == [0, 1, 2, 3, 4, 4] and v.fps == 4.0 and v.total_frames == 5  # last frame repeated
    assert _levels(v) == [0, 8, 16, 24, 32, 32] and v.frames[0].size == (56, 56)
    v = load_video(frames, _spec(max_frames=3), base_dir=str(tmp_path), where="w")  # cap 3 -> 2 (temporal patch)
    assert v.indices == [0, 4] and _levels(v) == [0, 32]


def test_bad_videos_name_the_record_and_key(tmp_path):
    (tmp_path / "bad.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    where = "d.jsonl record 3, videos[0]"
    cases = [("missing.mp4", "video file .*missing.mp4' not found"), ("bad.mp4", "cannot decode the video"),
             (b"garbage", "cannot decode the video"), ([], "no frames"),
             (["nope.png"], "image file .*nope.png' not found"),
             (7, "unsupported video value of type int"), ({"path": None}, "neither 'bytes' nor 'path'")]
    for obj, message in cases:
        with pytest.raises(DataError, match=rf"^{re.escape(where)}(\[0\])?: .*{message}"):
            load_video(obj, _spec(), base_dir=str(tmp_path), where=where)


# ---------------------------------------------------------------- dataset records


@pytest.fixture(scope="module")
def processor(tiny_model_dir):
    return load_processor(tiny_model_dir)


def _cfg(**kw):
    base = dict(prompt_key="problem", answer_key="answer", max_prompt_length=512, min_pixels=3136, max_pixels=12544)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), base, kw))


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_records_with_videos_both_forms(tmp_path, clip, processor):
    for i in range(4):
        _gray(i).save(tmp_path / f"f{i}.png")
    (tmp_path / "clip.mp4").symlink_to(clip)
    frames = [f"f{i}.png" for i in range(4)]
    path = _write(tmp_path / "d.jsonl", [
        {"problem": "What changes?", "answer": "1", "videos": ["clip.mp4"]},
        {"problem": "Compare <video> with <video>.", "answer": "2", "videos": [frames, "clip.mp4"]},
        {"problem": "<image> then <video>", "answer": "3", "videos": "clip.mp4", "images": ["f1.png"]},
        {"problem": "text only", "answer": "4", "videos": None},  # a <video> marker here would be an error
    ])
    ds = PromptDataset(path, _cfg(video_fps=1.0, video_min_pixels=28 * 28, video_max_pixels=28 * 28), processor)
    s = [ds[i] for i in range(4)]
    assert s[0].messages[0]["content"] == [{"type": "video"}, {"type": "text", "text": "What changes?"}]
    assert [p["type"] for p in s[1].messages[0]["content"]] == ["text", "video", "text", "video", "text"]
    assert [p["type"] for p in s[2].messages[0]["content"]] == ["image", "text", "video"]
    assert s[3].messages[0]["content"] == "text only" and s[3].videos == []
    assert [len(v.frames) for v in s[1].videos] == [4, 2]  # a list of 4 frames; 3 s at 1 fps -> 3 -> 2
    assert s[1].videos[0].frames[0].size == (28, 28)  # video_max_pixels, not max_pixels
    assert len(s[2].images) == 1 and "videos" not in s[0].extra
    for sample in s[:3]:
        ids, mm = encode_prompt(processor, sample)
        grids = mm["video_grid_thw"]
        assert len(grids) == len(sample.videos) and mm["pixel_values_videos"].shape[0] == grids.prod(-1).sum()
        assert ids.count(processor.video_token_id) == grids.prod(-1).sum() // 4
        assert ids.count(processor.image_token_id) == (mm["image_grid_thw"].prod(-1).sum() // 4 if sample.images else 0)


def test_video_pixel_bounds_fall_back_to_the_image_ones(tmp_path, clip, processor):
    (tmp_path / "clip.mp4").symlink_to(clip)
    path = _write(tmp_path / "d.jsonl", [{"problem": "p", "answer": "1", "videos": ["clip.mp4"]}])
    assert PromptDataset(path, _cfg(max_pixels=28 * 28 * 4), processor)[0].videos[0].frames[0].size == (56, 56)
    assert PromptDataset(path, _cfg(min_pixels=28 * 28 * 12), processor)[0].videos[0].frames[0].size == (112, 84)


def test_overlong_video_prompts_are_filtered_and_counted(tmp_path, clip, processor, caplog):
    (tmp_path / "clip.mp4").symlink_to(clip)
    rows = [{"problem": "p", "answer": "1"}, {"problem": "p", "answer": "2", "videos": ["clip.mp4"]},
            {"problem": "p", "answer": "3", "videos": ["clip.mp4", "clip.mp4"]}]
    path = _write(tmp_path / "d.jsonl", rows)
    # a video is 6 frames of 56 x 56: grid (3, 4, 4) = 48 patches, 12 tokens after the 2 x 2 merge, + start/end
    lengths = [len(encode_prompt(processor, PromptDataset(path, _cfg(), processor).sample(i))[0]) for i in range(3)]
    assert lengths[1] - lengths[0] == lengths[2] - lengths[1] == 14
    ds = PromptDataset(path, _cfg(max_prompt_length=lengths[1]), processor)
    assert len(ds) == 2 and ds.num_filtered == 1 and "filtered 1 of 3 prompts" in caplog.text
    ds = PromptDataset(path, _cfg(max_prompt_length=lengths[0]), processor)
    assert [ds[i].ground_truth for i in range(len(ds))] == ["1"]


def test_bad_video_records_name_the_record(tmp_path, clip, processor):
    (tmp_path / "clip.mp4").symlink_to(clip)
    path = _write(tmp_path / "d.jsonl", [{"problem": "<video><video>", "answer": "1", "videos": ["clip.mp4"]}])
    with pytest.raises(DataError, match=r"d.jsonl record 0: the prompt has 2 <video> markers but the record has 1"):
        PromptDataset(path, _cfg(), processor)
    path = _write(tmp_path / "e.jsonl", [{"problem": "p", "answer": "1", "videos": ["clip.mp4"]},
                                         {"problem": "p", "answer": "1", "videos": ["gone.mp4"]}])
    with pytest.raises(DataError, match=r"e.jsonl record 1, videos\[0\]: video file .*gone.mp4' not found"):
        PromptDataset(path, _cfg(), processor)
    from rllava.model.tiny import build_tokenizer

    with pytest.raises(DataError, match="takes no video input"):
        PromptDataset(path, _cfg(), build_tokenizer())


def test_video_keys_are_checked():
    def problems(**data):
        return _cfg(**data).check()

    assert problems() == []
    assert problems(video_max_frames=0) == ["data.video_max_frames=0 must be > 0"]
    assert problems(video_min_pixels=-1) == ["data.video_min_pixels=-1 must be > 0 (or null)"]
    assert problems(video_min_pixels=5000, max_pixels=4000, min_pixels=100) == [
        "data.video_min_pixels=5000 is above data.video_max_pixels=null (null = data.min_pixels=100 / "
        "data.max_pixels=4000)"]
    assert problems(min_pixels=5000, max_pixels=4000) == ["data.min_pixels=5000 is above data.max_pixels=4000"]
