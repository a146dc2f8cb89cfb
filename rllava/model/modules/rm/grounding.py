"""RLLaVA's grounding helpers (`rllava/model/modules/rm/grounding.py` in TinyLoopX/RLLaVA), which its
`examples/reward_function/grounding.py` imports: `from rllava.model.modules.rm.grounding import
extract_bbox_answer, compute_iou`. Same contract, so that file runs here unchanged; rllava's own rewards use
`rllava.reward.boxes` instead (coordinate frames, no eval of model output).
"""

from __future__ import annotations

import re

_NUM = r"(-?\d+(?:\.\d+)?)"
# RLLaVA's three box spellings, tried in this order: [a, b, c, d], (a, b, c, d), (a, b), (c, d)
_PATTERNS = [re.compile(rf"\[\s*{_NUM},\s*{_NUM},\s*{_NUM},\s*{_NUM}\s*\]"),
             re.compile(rf"\(\s*{_NUM},\s*{_NUM},\s*{_NUM},\s*{_NUM}\s*\)"),
             re.compile(rf"\(\s*{_NUM},\s*{_NUM}\),\s*\(\s*{_NUM},\s*{_NUM}\)")]


def parse_float_sequence_within(text: str) -> list[float]:
    """The first box in `text` as four floats, or [0, 0, 0, 0]."""
    for pattern in _PATTERNS:
        match = pattern.search(text)
        if match:
            return [float(match.group(i)) for i in range(1, 5)]
    return [0, 0, 0, 0]


def extract_bbox_answer(content: str) -> tuple[list, bool]:
    """(box, is_qwen2vl): Qwen2-VL's `<|box_start|>` answers are in its 0-1000 frame and kept as they are;
    other answers are taken as 0-1 fractions and scaled to 0-1000 (RLLaVA's convention)."""
    is_qwen2vl = "<|box_start|>" in content
    bbox = parse_float_sequence_within(content)
    if not is_qwen2vl:
        bbox = [int(x * 1000) for x in bbox]
    return bbox, is_qwen2vl


def compute_iou(box1, box2) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes; 0 when both are empty (RLLaVA divides by zero)."""
    x_left, y_top = max(box1[0], box2[0]), max(box1[1], box2[1])
    x_right, y_bottom = min(box1[2], box2[2]), min(box1[3], box2[3])
    intersection = max(0, x_right - x_left) * max(0, y_bottom - y_top)
    union = (box1[2] - box1[0]) * (box1[3] - box1[1]) + (box2[2] - box2[0]) * (box2[3] - box2[1]) - intersection
    return intersection / union if union > 0 else 0.0
