"""An OpenEnv environment server on 127.0.0.1 (no docker) driven through its client by an agent program
(examples/agents/openenv_agent.py): its observations are the user turns, its reward the episode's."""

import os

import pytest

from rllava.agent.program import ProgramRollout, ProgramScore
from rllava.data.protocol import Sample
from rllava.engine.inference.base import SamplingParams
from rllava.model.processor import get_tokenizer, load_processor
from tests.agent.test_program import ScriptedEngine

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "agents",
                       "openenv_agent.py")


def test_an_openenv_server_drives_the_episode(tiny_model_dir):
    proc = load_processor(tiny_model_dir)
    tok = get_tokenizer(proc)
    engine = ScriptedEngine(tok, ["red", "blue"])  # turn 1 says red, turn 2 blue
    rollout = ProgramRollout(engine, proc, f"{EXAMPLE}:run", max_turns=4, max_context=4096, episode_timeout=60,
                             window=60.0)
    samples = [Sample(i, [{"role": "user", "content": "go"}], [], ground_truth=word, source="t")
               for i, word in enumerate(("red", "blue", "green"))]
    try:
        out = rollout.generate(samples, SamplingParams(n=2, max_new_tokens=8))
    finally:
        rollout.close()
    assert rollout.program.__globals__["_server"]["url"].startswith("http://127.0.0.1:")
    assert [len(t.segments) for t in out] == [2, 2, 4, 4, 4, 4]  # red: right at once; blue: the second try
    given = tok.decode(out[2].segments[2].token_ids)
    assert "No: say blue." in given  # the environment's observation, a given segment
    for t in out:
        assert all(s.token_ids in engine.sampled for s in t.segments if s.trained)
    scores, details = ProgramScore(None).score(out)
    assert scores.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert [d["steps"] for d in details] == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
