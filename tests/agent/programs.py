"""Agent programs for tests/agent/test_program.py, written against `openai` only (each records what it saw)."""

import base64
import io
import time

import openai
from PIL import Image

SEEN = []  # the responses the programs received, for the tests to read
ZOOM = {"type": "function", "function": {"name": "zoom", "description": "crop the image",
                                         "parameters": {"type": "object", "properties": {"bbox": {"type": "array"}}}}}


def data_uri(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _image_part(image):
    return {"type": "image_url", "image_url": {"url": data_uri(image)}}


async def tools(client: openai.AsyncOpenAI, sample):
    """Three turns: the sample's image, a zoom call answered with a crop (an image), then the answer."""
    messages = [{"role": "user", "content": [_image_part(sample.images[0]), {"type": "text", "text": sample.prompt}]}]
    for _ in range(3):
        r = await client.chat.completions.create(model="policy", messages=messages, tools=[ZOOM], logprobs=True)
        SEEN.append(r)
        message = r.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"zoomed {call.function.arguments}"})
        crop = sample.images[0].crop((0, 0, 28, 28)).resize((56, 56))
        messages.append({"role": "user", "content": [_image_part(crop), {"type": "text", "text": "the crop"}]})
    return {"reward": 1.0, "turns": float(len(messages))}


def many(client: openai.OpenAI, sample):
    """One sync request with n=2 and log-probs; the reward file scores the episode."""
    r = client.chat.completions.create(model="policy", n=2, logprobs=True, max_tokens=8,
                                       messages=[{"role": "user", "content": sample.prompt}])
    SEEN.append(r)
    return None


async def raises(client, sample):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    raise KeyError("the environment broke")


def hangs(client, sample):
    time.sleep(3600)


async def never_calls(client, sample):
    return 1.0


async def wrong_model(client, sample):
    try:
        await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    except openai.NotFoundError:
        pass
    return 1.0


def recorded(client: openai.OpenAI, sample):
    """One request; appends a line "RANK port index" to $RLLAVA_TEST_LOG/episodes (the 2-rank test)."""
    import os

    client.chat.completions.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": sample.prompt}])
    with open(os.path.join(os.environ["RLLAVA_TEST_LOG"], "episodes"), "a") as f:
        f.write(f"{os.environ.get('RANK', '0')} {client.base_url.port} {sample.index}\n")
    return float(sample.index % 2)
