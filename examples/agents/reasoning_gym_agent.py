"""A single-request agent program for reasoning-gym records (docs/agents.md, "Agents written for an OpenAI client").

    rllava train ... 'data.train_files=reasoning_gym:basic_arithmetic?size=4000&seed=0' reward.reward_function=null \
        rollout.agent.program=examples/agents/reasoning_gym_agent.py:run

One request through the policy's endpoint: the sample's messages (its question in the format prompt), the reply is
the episode. It returns None, so the task's own `score_answer` scores the reply (`rllava.reward.reasoning_gym`)."""

import openai


async def run(client: openai.AsyncOpenAI, sample):
    await client.chat.completions.create(model="policy", messages=sample.messages)
    return None
