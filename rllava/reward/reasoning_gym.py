"""reasoning-gym's scorers as the reward of its records (`rllava.data.reasoning_gym`; docs/data.md, "reasoning-gym"):
with data.train_files=reasoning_gym:... and no reward.reward_function, each response scores

    r = dataset.score_answer(extract_answer(response), dataset[reasoning_gym_index])

the task's own scorer on its own entry, the answer being the text inside the response's last <answer>...</answer>
(reasoning_gym.utils.extract_answer; no such tag: None, which most tasks score 0). A record from elsewhere, or a
scorer that raises, is a failure of the sample (reward.strict / reward.fallback_score)."""

from __future__ import annotations

from rllava.data.protocol import Trajectory
from rllava.data.reasoning_gym import is_reasoning_gym, task_dataset
from rllava.reward.function import Fallible


def uses_reasoning_gym(data_cfg) -> bool:
    """data.train_files or a validation set is a reasoning_gym: spec."""
    sets = data_cfg.val_sets() or {}
    return any(is_reasoning_gym(s) for s in [data_cfg.train_files, data_cfg.val_files,
                                             *(e["path"] for e in sets.values())])


class ReasoningGymScore(Fallible):
    """A Scoring source (rllava.reward.scoring): the task's score_answer, and `answered` (an <answer> tag found)."""

    def __init__(self, strict: bool = False, fallback_score: float = 0.0):
        super().__init__("reward reasoning_gym score_answer", strict, fallback_score)

    def score(self, trajectories: list[Trajectory], train: bool = False):
        return self.finish([self.score_one(t) for t in trajectories], trajectories)

    def score_one(self, t: Trajectory) -> dict[str, float] | str:
        from reasoning_gym.utils import extract_answer

        spec, index = t.sample.extra.get("reasoning_gym"), t.sample.extra.get("reasoning_gym_index")
        if not is_reasoning_gym(spec) or not isinstance(index, int):
            return (f"{t.sample.where} is not a reasoning_gym: record and no reward.reward_function scores it: "
                    "set reward.reward_function (or the set's own reward_function)")
        dataset = task_dataset(spec, "reasoning_gym")
        answer = extract_answer(t.response or "")
        try:
            value = float(dataset.score_answer(answer, dataset[index]))
        except Exception as e:  # noqa: BLE001 (the task's scorer on a model's answer)
            return f"score_answer raised {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        return {"overall": value, "answered": float(answer is not None)}

    def close(self) -> None:
        pass
