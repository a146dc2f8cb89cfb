"""Reward shaping terms added to the training reward (never to validation scores), computed from the rollout
itself rather than by the user's reward function: DAPO's overlong penalty (`reward.overlong_buffer.*`) and the
n-gram repetition penalty (`reward.repetition_penalty.*`). `rllava.reward.scoring` adds each once to the sum."""

from __future__ import annotations

from rllava.data.protocol import Trajectory


def overlong_penalty(length: int, max_len: int, buffer_len: int, factor: float) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476), added to the reward:

        0                                     if |y| <= L_max - L_buf
        factor * ((L_max - L_buf) - |y|) / L_buf   if L_max - L_buf < |y| <= L_max   (linear, down to -factor)"""
    start = max_len - buffer_len
    return 0.0 if length <= start else factor * max(start - length, -buffer_len) / buffer_len


def repetition_penalty(token_ids: list[int], ngram_size: int, factor: float) -> float:
    """An n-gram repetition penalty on one response's token ids, after Yeo et al. 2025 ("Demystifying Long
    Chain-of-Thought Reasoning in LLMs", arXiv:2502.03373), who penalise repeated n-grams so long rollouts stop looping:

        G = the L - n + 1 windows of n consecutive tokens (none if L < n)
        penalty = -factor * (|G| - |distinct(G)|) / |G|          (0 when G is empty)

    i.e. -factor times the share of n-grams repeating an earlier one: 0 without one, near -factor for a loop."""
    grams = [tuple(token_ids[i:i + ngram_size]) for i in range(len(token_ids) - ngram_size + 1)]
    return -factor * (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def response_token_ids(t: Trajectory) -> list[int]:
    """The tokens the policy wrote (every trained segment, in order; an agent's turns joined)."""
    return [i for s in t.segments if s.trained for i in s.token_ids]
