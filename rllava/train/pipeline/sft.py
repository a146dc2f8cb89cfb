"""Supervised fine-tuning on reference responses, with the same config, data, model and Actor as RLVR.

    python -m rllava.train.pipeline.sft config=examples/config.yaml data.target_key=solution k=v

Each step teacher-forces `data.target_key` (the reference response) after the prompt and minimises its NLL
(the `sft` policy loss) through `Actor.update`: SFT is the RL update with given instead of sampled responses.
Used to warm a model up before RL (a random tiny model cannot learn from reward alone). With agent rollouts
(`rollout.agent.tools`) the target is a list of turns, replayed through the agent driver (`AgentRollout.replay`):
the tools answer the expert's calls, and only the expert's turns are trained.
"""

from __future__ import annotations

from rllava.config import ConfigError
from rllava.config.schema import agent_on
from rllava.data.dataset import encode_prompt
from rllava.data.protocol import Batch, Sample, Segment, Trajectory, collate
from rllava.model.processor import get_tokenizer
from rllava.train.cli import run_cli
from rllava.train.loop import build_run, train_loop
from rllava.train.tracker import Timer


def reference_trajectory(processor, sample: Sample, max_response_length: int) -> Trajectory:
    """[prompt (given), reference response + EOS (trained, off-policy)], truncated to the response budget."""
    tok = get_tokenizer(processor)
    prompt_ids, mm = encode_prompt(processor, sample)
    target = tok(str(sample.target), add_special_tokens=False)["input_ids"][:max_response_length - 1]
    return Trajectory(sample=sample, group_id=sample.index, mm_inputs=mm, response=str(sample.target),
                      segments=[Segment(prompt_ids, trained=False),
                                Segment(target + [tok.eos_token_id], trained=True, off_policy=True)])


def train(cfg) -> str:
    if cfg.trainer.async_training:
        raise ConfigError("trainer.async_training=true overlaps rollout and training, and SFT has no rollout: set "
                          "trainer.async_training=false")
    if cfg.rollout.agent.program:
        raise ConfigError("rollout.agent.program: multi-turn SFT replays the expert's turns through rllava's own "
                          "tools (rollout.agent.tools), and a program's tools are its own: warm up with single-turn "
                          "SFT (unset rollout.agent.program) and run the program in RL")
    if not cfg.data.target_key:
        raise ConfigError("the SFT pipeline needs data.target_key: the record field holding the reference response")
    run = build_run(cfg, role="sft")
    pad_id = get_tokenizer(run.processor).pad_token_id

    def step(samples: list[Sample], timer: Timer) -> tuple[dict[str, float], Batch]:
        if agent_on(cfg):  # multi-turn: the expert's turns, the tools' observations between them (given)
            trajectories = run.rollout.replay(samples)
        else:
            trajectories = [reference_trajectory(run.processor, s, cfg.data.max_response_length) for s in samples]
        batch = collate(trajectories, pad_id)
        with timer("update"):
            return run.actor.update(batch), batch

    return train_loop(run, step, "sft")


def main(argv: list[str] | None = None) -> None:
    run_cli(train, argv)


if __name__ == "__main__":
    main()
