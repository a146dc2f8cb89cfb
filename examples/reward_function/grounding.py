"""Grounding reward, RLLaVA's (its examples/reward_function/grounding.py, with examples/format_prompt/rec.jinja and
examples/config_grounding.yaml in RLLaVA's qwen2_vl_2b_grounding_vllm_online.sh): the IoU of the first box in the
response, squared, and a format bonus. rllava's grounding reward (the box in <answer> tags, IoU in the frame the
model writes) is grounding_iou.py.

    text     = the response with "<|endoftext|>" removed (config_grounding.yaml keeps special tokens in it)
    format   = 1 if the text starts with "<" or ">", or with object_ref_start, object_ref_end, box_start, box_end or
               im_end: RLLaVA's pattern r"^<|object_ref_start|>.*?<|object_ref_end|><|box_start|>.*?<|box_end|>
               <|im_end|>" leaves its "|" unescaped, so re.match reads it as these alternatives
    box      = the first [a, b, c, d], else (a, b, c, d), else (a, b), (c, d) in the text (else [0, 0, 0, 0]); kept as
               written when the text holds <|box_start|> (Qwen2-VL's 0-1000 frame), else read as fractions of the
               image: int(1000 * v) each
    accuracy = IoU(box, ground truth) ** 2      (the ground truth a box or its text: "[120, 40, 620, 980]")
    overall  = (1 - format_weight) * accuracy + format_weight * format      (format_weight 0.5)

The sequential form RLLaVA's script sets (reward.reward_type=sequential): one reward input a call. The box reading
and IoU are RLLaVA's helpers at RLLaVA's import path, rllava.model.modules.rm.grounding (an IoU whose union is 0 is 0
there, where RLLaVA's divides by zero).
"""

import ast
from typing import Any

from rllava.model.modules.rm.grounding import compute_iou, extract_bbox_answer

FORMAT_STARTS = ("<", ">", "object_ref_start", "object_ref_end", "box_start", "box_end", "im_end")


def compute_score(reward_input: dict[str, Any], format_weight: float = 0.5) -> dict[str, float]:
    text = reward_input["response"].replace("<|endoftext|>", "")
    fmt = 1.0 if text.startswith(FORMAT_STARTS) else 0.0
    box, _ = extract_bbox_answer(text)
    accuracy = compute_iou(box, _truth(reward_input["ground_truth"])) ** 2
    return {"overall": (1 - format_weight) * accuracy + format_weight * fmt, "format": fmt, "accuracy": accuracy}


def _truth(ground_truth):
    """The true box: as given, or read from its text as a Python literal (RLLaVA evals the text)."""
    return ast.literal_eval(ground_truth) if isinstance(ground_truth, str) else ground_truth
