"""Tiny, randomly initialised Qwen-VL models (plus a TinyLLaVA-style modular VLM, arch `tinyllava`, text-only Qwen2 /
Qwen3 LMs, `qwen2` / `qwen3`, and a Qwen2 reward model, `qwen2_rm`) built offline, for tests and CPU demos.

    python -m rllava.model.tiny --arch qwen2_vl --out DIR [--size small|demo]

writes a real Hugging Face checkpoint (config, safetensors weights, tokenizer, processor, chat template) with
`save_pretrained`, which `actor.model.model_path=DIR` loads through the same Auto classes as a real Qwen checkpoint.
The tokenizer is a byte-level BPE trained here on generated text (no hub download), with Qwen's special tokens, so
chat templates and image placeholders behave as in the real models. Sizes (docs/cpu_learning.md): `demo` = 4 text
layers, hidden 256, vision depth 4, embed 128 (4.75 M parameters as Qwen2-VL; learns the counting task on CPU);
`small` = 2 layers, hidden 128 (~1 M; for fast tests only); `wide` = the demo's depths at 4x its widths (benchmarks).

The vision tower's weight matrices are drawn with std VISION_INIT_STD = 0.2 instead of the config's 0.02: at widths
of 64-128 the 0.02 init makes every image look alike to the language model, and SFT on the counting task then sat at
chance (20 %) for ~150 steps; with 0.2 it reaches ~55 % held-out in 40 steps (lr 1e-3, batch 32), the pace
docs/cpu_learning.md records. (0.1: 51 % after 100 steps.)
"""

from __future__ import annotations

import argparse
import random

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rllava.model.processor import image_only_processor_class
from rllava.utils.fs import atomic_directory

ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "tinyllava")  # VLMs
TEXT_ARCHS = ("qwen2", "qwen3", "qwen2_rm")  # text-only LMs (the processor is the tokenizer)
# qwen2_rm: a Qwen2 reward model (Qwen2ForSequenceClassification, one label: reward.model.model_path)
VISION_INIT_STD = 0.2

# Qwen's special tokens, in Qwen's order. Ids are assigned from 0 in this order.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]

# The Qwen2-VL chat format (same layout for Qwen2.5-VL/Qwen3-VL): a default system turn, `<|im_start|>role`,
# images as <|vision_start|><|image_pad|><|vision_end|> (the processor expands <|image_pad|> per image).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SIZES = {
    #        text layers, hidden, heads, kv heads, ffn, vision depth, vision embed, vision heads
    "small": dict(layers=2, hidden=128, heads=4, kv_heads=2, ffn=256, v_depth=2, v_embed=64, v_heads=4),
    "demo": dict(layers=4, hidden=256, heads=4, kv_heads=2, ffn=512, v_depth=4, v_embed=128, v_heads=4),
    # 4x the demo widths (benchmarks/vs_trl.py --size wide: does a speed-up hold as the matmuls grow?)
    "wide": dict(layers=4, hidden=1024, heads=16, kv_heads=8, ffn=2048, v_depth=4, v_embed=512, v_heads=8),
}


def _corpus(seed: int = 0) -> list[str]:
    """Text that looks like what the tiny models will read and write: task prompts, tagged answers,
    numbers, boxes and JSON, plus the chat scaffolding."""
    rng = random.Random(seed)
    colors = ["red", "green", "blue", "yellow", "purple", "orange", "gray", "cyan", "brown", "black", "white"]
    shapes = ["circle", "square", "triangle", "cube", "sphere", "cylinder", "shape", "object", "item"]
    words = ("how many are there in the image what is the of a an and or to find count locate box answer "
             "question think step first then output final value angle length area triangle line point degrees "
             "please reason inside tags format json bounding coordinates label confidence detect all "
             "you are a helpful assistant system user assistant the with for is it this that number numbers "
             "shapes objects tags").split()
    lines = []
    for _ in range(6000):
        c, s, n = rng.choice(colors), rng.choice(shapes), rng.randint(0, 20)
        lines += [
            f"How many {c} {s}s are in the image? <answer>{n}</answer>",
            f"<think>I see {n} {s}s.</think><answer>{n}</answer>",
            f'[{{"bbox_2d": [{rng.randint(0, 999)}, {rng.randint(0, 999)}, {rng.randint(0, 999)}, '
            f'{rng.randint(0, 999)}], "label": "{c} {s}", "score": {rng.random():.2f}}}]',
            f"\\boxed{{{rng.randint(0, 360)}}} {rng.randint(0, 99)}/{rng.randint(1, 99)} = {rng.random():.3f}",
            " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))).capitalize() + rng.choice(".?!:"),
        ]
    return lines


def build_tokenizer(vocab_size: int = 2048, seed: int = 0) -> PreTrainedTokenizerFast:
    """Byte-level BPE (as Qwen's) trained on `_corpus`, with Qwen's special tokens and chat template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_corpus(seed), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=SPECIAL_TOKENS[1:], padding_side="left",
                                  model_max_length=32768)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _text_config(tok, size: dict) -> dict:
    """The language model's sizes and special ids (shared by every arch)."""
    return dict(vocab_size=len(tok), hidden_size=size["hidden"], intermediate_size=size["ffn"],
                num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                num_key_value_heads=size["kv_heads"], max_position_embeddings=4096,
                bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def _text_lm(arch: str, tok, size: dict):
    """A text-only Qwen2 / Qwen3 causal LM, or a Qwen2 reward model (one logit), of the tiny sizes."""
    from transformers import (Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen3Config,
                              Qwen3ForCausalLM)

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
                             "qwen2_rm": (Qwen2Config, Qwen2ForSequenceClassification)}[arch]
    head = {"num_labels": 1} if arch == "qwen2_rm" else {}
    return model_cls(config_cls(**_text_config(tok, size), head_dim=size["hidden"] // size["heads"],
                                tie_word_embeddings=False, **head))


def _tinyllava(tok, size: dict):
    """A TinyLLaVA-style modular VLM (rllava.model.modular): a tiny Qwen2 LLM + a tiny SigLIP tower (112 px
    images in 28 px patches: 16 image tokens) + the 2-layer MLP connector. The features come from the tower's
    last layer (TinyLLaVA: the penultimate) so that every tower layer is trained."""
    from transformers import Qwen2Config, SiglipVisionConfig
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from rllava.model.modular import compose

    llm = Qwen2Config(**_text_config(tok, size), tie_word_embeddings=False)
    vision = SiglipVisionConfig(hidden_size=size["v_embed"], intermediate_size=2 * size["v_embed"],
                                num_hidden_layers=size["v_depth"], num_attention_heads=size["v_heads"],
                                image_size=112, patch_size=28, vision_use_head=False)
    return compose(llm, vision, connector="mlp2x_gelu", tokenizer=tok, image_token="<|image_pad|>",
                   image_processor=SiglipImageProcessorPil(size={"height": 112, "width": 112}),
                   chat_template=CHAT_TEMPLATE, vision_feature_layer=-1)


def _model_and_processor(arch: str, tok, size: dict):
    """Config + model class + processor for one architecture; only the sizes differ from the real models."""
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration, Qwen3VLConfig, Qwen3VLForConditionalGeneration)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    ids = {name: tok.convert_tokens_to_ids(t) for name, t in
           [("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    head_dim = size["hidden"] // size["heads"]
    text = _text_config(tok, size)
    # M-RoPE splits the rotary half-dimension over (time, height, width); sections must sum to head_dim/2.
    half = head_dim // 2
    mrope = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    text["rope_parameters"] = rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope}
    patch = 16 if arch == "qwen3_vl" else 14
    # Qwen2.5-VL's and Qwen3-VL's towers (Qwen2-VL's names its widths differently)
    vision = dict(depth=size["v_depth"], hidden_size=size["v_embed"], intermediate_size=2 * size["v_embed"],
                  num_heads=size["v_heads"], patch_size=patch, out_hidden_size=size["hidden"])
    if arch == "qwen3_vl":
        text["head_dim"], rope["mrope_interleaved"] = head_dim, True
        vision.update(num_position_embeddings=256, deepstack_visual_indexes=[size["v_depth"] // 2])
        config_cls, model_cls = Qwen3VLConfig, Qwen3VLForConditionalGeneration
    elif arch == "qwen2_vl":
        vision = dict(depth=size["v_depth"], embed_dim=size["v_embed"], hidden_size=size["hidden"],
                      num_heads=size["v_heads"], patch_size=patch)
        config_cls, model_cls = Qwen2VLConfig, Qwen2VLForConditionalGeneration
    else:
        vision.update(window_size=56, fullatt_block_indexes=[size["v_depth"] - 1])
        config_cls, model_cls = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    config = config_cls(text_config=text, vision_config=vision, **ids)
    config.tie_word_embeddings = False
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                               min_pixels=(patch * 2) ** 2, max_pixels=(patch * 2) ** 2 * 256)
    processor_cls = image_only_processor_class(arch)
    processor = processor_cls(image_processor=image_processor, tokenizer=tok, chat_template=CHAT_TEMPLATE)
    return config, model_cls, processor


def build_tiny(arch: str, out_dir: str, size: str = "demo", seed: int = 0) -> str:
    """Write a tiny random `arch` checkpoint to `out_dir` (atomically) and return the path."""
    if arch not in ARCHS + TEXT_ARCHS:
        raise ValueError(f"unknown --arch {arch!r}; choose one of {', '.join(ARCHS + TEXT_ARCHS)}")
    if size not in SIZES:
        raise ValueError(f"unknown --size {size!r}; choose one of {', '.join(SIZES)}")
    torch.manual_seed(seed)
    tok = build_tokenizer(seed=seed)
    if arch in TEXT_ARCHS:
        model, processor = _text_lm(arch, tok, SIZES[size]), tok
    elif arch == "tinyllava":
        model, processor = _tinyllava(tok, SIZES[size])
    else:
        config, model_cls, processor = _model_and_processor(arch, tok, SIZES[size])
        model = model_cls(config)
    tower = None if arch in TEXT_ARCHS else model.model.vision_tower if arch == "tinyllava" else model.model.visual
    with torch.no_grad():
        for p in tower.parameters() if tower is not None else []:
            if p.dim() >= 2:  # linear / conv / embedding weights; norms and biases keep their init
                p.normal_(0.0, VISION_INIT_STD)
    if getattr(model, "generation_config", None) is not None:  # a reward model does not generate
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
    return out_dir


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2_vl", choices=ARCHS + TEXT_ARCHS)
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", default="demo", choices=sorted(SIZES))
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the tokenizer: a distillation "
                        "student and teacher need the same --seed (and may differ in --size or in training)")
    args = parser.parse_args(argv)
    print(f"wrote tiny {args.arch} ({args.size}) to {build_tiny(args.arch, args.out, args.size, args.seed)}")


if __name__ == "__main__":
    main()
