"""Qwen-VL inputs with several images and with videos, without torchvision: the PIL video processor's patches,
placeholder counts, the forward of each tiny architecture, rollout, and padded vs padding-free log-probs."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from rllava.data.dataset import encode_prompt
from rllava.data.protocol import Sample, collate
from rllava.data.video import Video
from rllava.engine.inference.base import SamplingParams
from rllava.engine.inference.hf import HFRolloutEngine
from rllava.model.forward import model_inputs, token_logprobs
from rllava.model.processor import get_tokenizer, load_processor
from rllava.model.tiny import build_tiny
from rllava.roles.rollout import Rollout

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("archs")
    return {arch: tiny_model_dir if arch == "qwen2_vl" else build_tiny(arch, str(out / arch), size="small")
            for arch in ARCHS}


def _factor(processor) -> int:
    return processor.image_processor.patch_size * processor.image_processor.merge_size


def _frames(n: int, w: int, h: int, seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(n)]


def _video(processor, n_frames: int = 4, blocks=(2, 1), seed: int = 0) -> Video:
    """n frames of (w, h) = blocks x the merge factor, sampled every 2nd frame of a 2 fps source."""
    f = _factor(processor)
    return Video(_frames(n_frames, blocks[0] * f, blocks[1] * f, seed), fps=2.0,
                 indices=list(range(0, 2 * n_frames, 2)), total_frames=2 * n_frames)


def _reference_patches(frames: np.ndarray, image_processor) -> torch.Tensor:
    """transformers' Qwen2VLVideoProcessor (and Qwen3-VL's) `patchify`, written out: rescale, normalize, then
    view [1, T/tp, tp, C, H/p/m, m, p, W/p/m, m, p] and permute (0, 1, 4, 7, 5, 8, 3, 2, 6, 9)."""
    p, m, tp = image_processor.patch_size, image_processor.merge_size, image_processor.temporal_patch_size
    x = torch.tensor(frames, dtype=torch.float32).permute(0, 3, 1, 2) / 255
    mean, std = (torch.tensor(v)[:, None, None] for v in (image_processor.image_mean, image_processor.image_std))
    x = (x - mean) / std
    T, C, H, W = x.shape
    x = x.view(1, T // tp, tp, C, H // p // m, m, p, W // p // m, m, p).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return x.reshape(T // tp * (H // p) * (W // p), C * tp * p * p)


@pytest.mark.parametrize("arch", ARCHS)
def test_pil_video_processor_matches_the_video_processor_layout(arch_dirs, arch):
    processor = load_processor(arch_dirs[arch])
    video = _video(processor, n_frames=4, blocks=(3, 2)).array()
    out = processor.video_processor([video, video[:3]])  # 3 frames: the last is repeated to fill the patch
    f = _factor(processor) // processor.image_processor.merge_size  # patch size
    assert out["video_grid_thw"].tolist() == [[2, 4, 6], [2, 4, 6]]
    padded = np.concatenate([video[:3], video[2:3]])
    expected = torch.cat([_reference_patches(video, processor.image_processor),
                          _reference_patches(padded, processor.image_processor)])
    assert out["pixel_values_videos"].shape == (2 * 2 * 24, 3 * 2 * f * f)
    torch.testing.assert_close(out["pixel_values_videos"], expected, atol=1e-5, rtol=1e-5)
    # a still video (two equal frames) gives exactly the image processor's patches of that frame
    still = processor.video_processor([video[:1].repeat(2, axis=0)])["pixel_values_videos"]
    image = processor.image_processor([video[0]], do_resize=False, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(still, image)
    with pytest.raises(ValueError, match="do_resize=True is not supported"):
        processor.video_processor([video], do_resize=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_pil_path_equals_transformers_video_processor(arch_dirs, arch):
    """Where torchvision is installed (GPU machines), transformers' own video processor runs; both paths give
    the same prompt ids and tensors."""
    pytest.importorskip("torchvision")
    from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor

    from rllava.model.processor import _base_processor_class

    pil = load_processor(arch_dirs[arch])
    ip = pil.image_processor
    video_cls = Qwen3VLVideoProcessor if arch == "qwen3_vl" else Qwen2VLVideoProcessor
    video_processor = video_cls(patch_size=ip.patch_size, merge_size=ip.merge_size,
                                temporal_patch_size=ip.temporal_patch_size, image_mean=ip.image_mean,
                                image_std=ip.image_std)
    standard = _base_processor_class(arch)(ip, pil.tokenizer, video_processor, chat_template=pil.chat_template)
    sample = _sample(pil, 0, 1, 2)
    (ids, mm), (ref_ids, ref_mm) = encode_prompt(pil, sample), encode_prompt(standard, sample)
    assert ids == ref_ids and mm.keys() == ref_mm.keys()
    for k in mm:
        torch.testing.assert_close(mm[k], ref_mm[k], atol=1e-5, rtol=1e-5, check_dtype=False, msg=k)


def _sample(processor, i: int, n_images: int, n_videos: int, text: str = "How many") -> Sample:
    f = _factor(processor)
    images = [Image.new("RGB", (f * (1 + k), f * (2 - k % 2)), (40 * i, 80 * k, 200)) for k in range(n_images)]
    videos = [_video(processor, n_frames=4 + 2 * k, blocks=(1 + k, 1), seed=10 * i + k) for k in range(n_videos)]
    content = [{"type": "image"}] * n_images + [{"type": "video"}] * n_videos + [{"type": "text", "text": text}]
    return Sample(index=i, messages=[{"role": "user", "content": content}], images=images, videos=videos,
                  ground_truth="1")


@pytest.mark.parametrize("arch", ARCHS)
def test_placeholder_counts_and_forward(arch_dirs, arch):
    processor = load_processor(arch_dirs[arch])
    model = AutoModelForImageTextToText.from_pretrained(arch_dirs[arch], dtype=torch.float32)
    tok = get_tokenizer(processor)
    for n_images, n_videos in [(2, 0), (3, 0), (0, 1), (2, 2)]:
        sample = _sample(processor, 0, n_images, n_videos)
        ids, mm = encode_prompt(processor, sample)
        for pixel_key, grid_key, token_id, n in [("pixel_values", "image_grid_thw", processor.image_token_id, n_images),
                                                 ("pixel_values_videos", "video_grid_thw", processor.video_token_id,
                                                  n_videos)]:
            if not n:
                assert pixel_key not in mm and grid_key not in mm and ids.count(token_id) == 0
                continue
            grid, pixels = mm[grid_key], mm[pixel_key]
            assert len(grid) == n and pixels.shape[0] == grid.prod(-1).sum()
            assert ids.count(token_id) == grid.prod(-1).sum() // processor.image_processor.merge_size**2
        if n_videos:
            assert mm["video_grid_thw"][:, 0].tolist() == [2 + k for k in range(n_videos)]  # frames / 2
        if arch == "qwen2_5_vl" and n_videos:  # temporal_patch_size / sampled fps (every 2nd frame at 2 fps)
            assert mm["second_per_grid_ts"].tolist() == [2.0] * n_videos
        if arch == "qwen3_vl" and n_videos:  # frame-pair timestamps: frames 0, 2 at 2 fps -> 0.5 s, 4, 6 -> 2.5 s
            assert "<0.5 seconds>" in tok.decode(ids) and "<2.5 seconds>" in tok.decode(ids)
        batch = collate([_trajectory(sample, ids, mm, [5, 6, 7])], tok.pad_token_id)
        inputs = model_inputs(model, batch)
        types = inputs["mm_token_type_ids"][0]
        assert (types == 1).sum() == ids.count(processor.image_token_id)
        assert (types == 2).sum() == ids.count(processor.video_token_id)
        with torch.no_grad():
            assert model(**inputs).logits.shape == (1, len(ids) + 3, len(tok))


def _trajectory(sample, ids, mm, response, group_id=0):
    from rllava.data.protocol import Segment, Trajectory

    return Trajectory(sample=sample, group_id=group_id, mm_inputs=mm,
                      segments=[Segment(ids, trained=False), Segment(response, trained=True)])


def _values_and_grads(model, batch, padding_free):
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs(model, batch, with_entropy=True, entropy_grad=True, padding_free=padding_free)
    g = torch.Generator().manual_seed(0)
    ((lp * torch.randn(lp.shape, generator=g)).sum() + ent.sum()).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _load(path, attn_implementation: str = "sdpa"):
    model = AutoModelForImageTextToText.from_pretrained(path, attn_implementation=attn_implementation,
                                                        dtype=torch.float32)
    return model, load_processor(path)


def roll_out(model, processor, samples, n: int, max_new_tokens: int):
    """Trajectories of the HF engine (left-padded micro-batch of 8 prompts) and their collated batch."""
    tok = get_tokenizer(processor)
    engine = HFRolloutEngine(pad_token_id=tok.pad_token_id, stop_token_ids=[tok.eos_token_id], banned_token_ids=[],
                             micro_batch_size=8, device=torch.device("cpu"))
    engine.load(model)
    trajectories = Rollout(engine, processor).generate(samples, SamplingParams(n=n, max_new_tokens=max_new_tokens))
    engine.offload()
    return trajectories, collate(trajectories, tok.pad_token_id)


def assert_rollout_logprobs_are_the_forwards(model, batch):
    """The rollout's sampling log-probs are those of the training forward (eval mode), on every trained token."""
    model.eval()
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch)
    torch.testing.assert_close(lp * batch.loss_mask, batch.rollout_logprobs * batch.loss_mask, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_rollout_and_padding_free_log_probs_with_images_and_videos(arch_dirs, arch):
    """Rows with 0, 1, 2 images, a video, and an image + a video: rollout samples them (left-padded M-RoPE), the
    padded and the packed training forward give the same log-probs, entropy and gradients, and a selection of
    rows carries its own videos."""
    torch.manual_seed(0)
    model, processor = _load(arch_dirs[arch], attn_implementation="sdpa")  # the packed rows' varlen masks
    samples = [_sample(processor, i, n_images, n_videos, "How many" + " red" * i)
               for i, (n_images, n_videos) in enumerate([(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)])]
    _, batch = roll_out(model, processor, samples, n=1, max_new_tokens=4)
    assert batch.model_inputs()["video_grid_thw"].shape[0] == 2 and batch.model_inputs()["image_grid_thw"].shape[0] == 4
    assert_rollout_logprobs_are_the_forwards(model, batch)

    padded, packed = _values_and_grads(model, batch, False), _values_and_grads(model, batch, True)
    for a, b in zip(padded[:2], packed[:2]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert padded[2].keys() == packed[2].keys() and any("visual" in n for n in padded[2])
    for name in padded[2]:
        torch.testing.assert_close(padded[2][name], packed[2][name], atol=1e-5, rtol=1e-5, msg=name)

    part = batch.select([4, 3])  # (image + video), video: its own tensors, in row order
    inputs = part.model_inputs()
    assert inputs["video_grid_thw"].tolist() == [t.mm_inputs["video_grid_thw"][0].tolist() for t in part.trajectories]
    with torch.no_grad():
        lp_part, _ = token_logprobs(model, part, padding_free=True)
    torch.testing.assert_close(lp_part, padded[0][[4, 3], :lp_part.shape[1]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_samples_of_a_prompt_share_one_prefill(arch_dirs, arch):
    """n = 3 samples of left-padded prompts with images and videos: the prompts are prefilled once (4 rows, not
    12) and the vision tower sees each prompt's pixels once, the samples differ, and every sample's rollout
    log-probs are the training forward's (the copied KV cache and M-RoPE offsets are those of its own prompt)."""
    torch.manual_seed(0)
    model, processor = _load(arch_dirs[arch])
    samples = [_sample(processor, i, n_images, n_videos, "How many" + " red" * i)
               for i, (n_images, n_videos) in enumerate([(1, 0), (0, 0), (2, 0), (1, 1)])]
    patches, visual = [], model.model.visual
    original = visual.forward
    visual.forward = lambda pixels, *a, **kw: (patches.append(pixels.shape[0]), original(pixels, *a, **kw))[1]
    shapes = []  # [rows, tokens] of each language-model forward
    model.model.language_model.register_forward_pre_hook(
        lambda _, args, kw: shapes.append(tuple(kw["inputs_embeds"].shape[:2])), with_kwargs=True)
    trajectories, batch = roll_out(model, processor, samples, n=3, max_new_tokens=6)
    assert len(trajectories) == 12
    given = sum(int(t.mm_inputs[k].shape[0]) for t in trajectories[::3] for k in ("pixel_values", "pixel_values_videos")
                if k in t.mm_inputs)
    assert sum(patches) == given  # each prompt's images and videos encoded once
    assert shapes[0][0] == 4 and shapes[0][1] > 1 and all(tokens == 1 for _, tokens in shapes[1:])  # one prefill
    assert len({t.response for t in trajectories}) > 4  # the copies sample apart
    assert_rollout_logprobs_are_the_forwards(model, batch)
