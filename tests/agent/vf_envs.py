"""verifiers environments over local data for tests/agent/test_verifiers_env.py (no hub download)."""

import verifiers as vf
from datasets import Dataset

QUESTIONS = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((1, 2), (3, 4), (2, 2), (5, 1))]


def exact(completion, answer) -> float:
    """1 when the last assistant message says the answer inside <answer> tags."""
    text = completion[-1].content if completion else ""
    return float(f"<answer>{answer}</answer>" in (text or ""))


def length(completion) -> float:
    return float(len(completion))


def load_environment(weight: float = 1.0):
    """A SingleTurnEnv: the question, its answer, a rubric of `exact` (weighted) and a 0-weight metric."""
    rubric = vf.Rubric(funcs=[exact, length], weights=[weight, 0.0])
    return vf.SingleTurnEnv(dataset=Dataset.from_list(QUESTIONS), eval_dataset=Dataset.from_list(QUESTIONS[:2]),
                            system_prompt="Answer inside <answer></answer>.", rubric=rubric)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def load_tool_environment():
    """A ToolEnv with one tool: the model calls add, reads the result, answers."""
    return vf.ToolEnv(dataset=Dataset.from_list(QUESTIONS), tools=[add], max_turns=3,
                      rubric=vf.Rubric(funcs=[exact]))


class Countdown(vf.MultiTurnEnv):
    """Two user turns: the env answers the first reply with "Again.", the second ends the episode."""

    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content="Again.")]


def load_multiturn_environment():
    return Countdown(dataset=Dataset.from_list(QUESTIONS), max_turns=2, rubric=vf.Rubric(funcs=[exact]))


def not_an_env():
    return 3


def _png(colour) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (56, 56), colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def load_image_environment():
    """A SingleTurnEnv whose prompts show an image (an image_url part, as verifiers' multimodal datasets have)."""
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png(c)}},
                                                     {"type": "text", "text": "Which colour?"}]}], "answer": name}
            for c, name in (((255, 0, 0), "red"), ((0, 0, 255), "blue"))]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[exact]))
