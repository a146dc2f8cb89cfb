"""Session fixtures: tiny models and synthetic data, built once per test run (offline, on CPU)."""

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "OMP_NUM_THREADS" not in os.environ:  # the commands tests run choose their threads by the load otherwise
    import torch  # (rllava.train.cli.cpu_threads), and say so: no test may depend on how busy the machine is

    os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())  # torch's own default, for every subprocess


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small (~1 M parameter) random Qwen2-VL checkpoint directory."""
    from rllava.model.tiny import build_tiny

    return build_tiny("qwen2_vl", str(tmp_path_factory.mktemp("models") / "qwen2_vl"), size="small")


@pytest.fixture(scope="session")
def counting_dir(tmp_path_factory):
    """A small synthetic CLEVR-like counting set: train.jsonl, val.jsonl, images/."""
    from rllava.data.synthetic import make_counting

    out = str(tmp_path_factory.mktemp("data") / "counting")
    make_counting(out, n_train=64, n_val=16, seed=0)
    return out


def _write_mp4(path, frames, fps: int = 10) -> str:
    """Encode PIL frames (all one even size) as an MPEG-4 .mp4 with PyAV, at `fps` frames per second."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_image(frame)))
        container.mux(stream.encode())
    return str(path)


@pytest.fixture(scope="session")
def write_mp4():
    """`write_mp4(path, frames, fps=10)`: a small real video file for video tests."""
    return _write_mp4


@pytest.fixture(scope="session")
def counting_videos_dir(tmp_path_factory, counting_dir):
    """The counting set as videos: train.jsonl/val.jsonl whose records hold one video each, an .mp4 of the
    record's image (4 frames at 2 fps, the shapes drifting right) or, every third record, that image's frames as
    a list of paths."""
    import json

    from PIL import Image

    out = tmp_path_factory.mktemp("counting_videos")
    (out / "images").symlink_to(os.path.join(counting_dir, "images"))
    for split in ("train", "val"):
        with open(os.path.join(counting_dir, f"{split}.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        with open(out / f"{split}.jsonl", "w") as f:
            for i, row in enumerate(rows):
                image = row.pop("images")[0]
                if i % 3 == 2:
                    row["videos"] = [[image] * 4]
                else:
                    img = Image.open(os.path.join(counting_dir, image)).convert("RGB")
                    frames = [Image.new("RGB", img.size, img.getpixel((0, 0))) for _ in range(4)]
                    for k, frame in enumerate(frames):
                        frame.paste(img.crop((0, 0, img.width - 2 * k, img.height)), (2 * k, 0))
                    row["videos"] = [os.path.basename(_write_mp4(out / f"{split}_{i:03d}.mp4", frames, fps=2))]
                row["problem"] = "<video>How many shapes are in the video?"
                f.write(json.dumps(row) + "\n")
    return str(out)


@pytest.fixture
def distinct_reward(tmp_path):
    """A `reward.reward_function` for pipeline tests. A random model never answers right, so it rewards what its
    samples do vary in: distinct characters."""
    path = tmp_path / "distinct.py"
    path.write_text("def compute_score(response, ground_truth):\n"
                    "    return {'overall': len(set(response)) / 20, 'accuracy': 0.0}\n")
    return f"{path}:compute_score"


@pytest.fixture
def straight_and_resumed(tmp_path, monkeypatch):
    """`run(stop_at, args) -> (outputs of a straight rlvr run, outputs of the same run stopped right after
    checkpoint `stop_at`, as if the job hit its time limit, and resumed with trainer.resume=auto)`."""
    from rllava.train import checkpoint as C
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    def run(stop_at: int, args: list[str]) -> tuple[str, str]:
        straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
        rlvr.main([*args, *keys_for(straight)])
        save = C.save_checkpoint

        def save_then_stop(run_, step):
            path = save(run_, step)
            if step == stop_at:
                raise KeyboardInterrupt
            return path

        monkeypatch.setattr(C, "save_checkpoint", save_then_stop)
        with pytest.raises(SystemExit):
            rlvr.main([*args, *keys_for(stopped)])
        monkeypatch.setattr(C, "save_checkpoint", save)
        rlvr.main([*args, *keys_for(stopped)])
        return straight, stopped

    return run
