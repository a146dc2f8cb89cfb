"""RLLaVA's grounding helpers (`rllava/model/modules/rm/grounding.py` in TinyLoopX/RLLaVA), which its
`examples/reward_function/grounding.py` imports: `from rllava.model.modules.rm.grounding import
extract_bbox_answer, compute_iou`. Same contract, so that file runs here unchanged; rllava's own rewards use
`rllava.reward.boxes` instead (coordinate frames, no eval of model output).
"""

from __future__ import annotations

import re

from rllava.reward.boxes import box_iou

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
    """Intersection over union of two (x1, y1, x2, y2) boxes: rllava's `box_iou` (0 when either is not a box,
    where RLLaVA's own divides by zero or scores a reversed box)."""
    return box_iou(box1, box2)
