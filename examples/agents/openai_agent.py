"""A two-tool VLM agent written only against `openai` (docs/agents.md, "Agents written for an OpenAI client").

    rllava train config=... rollout.agent.program=examples/agents/openai_agent.py:run rollout.max_turns=3

The model sees the sample's image and question, and may call `zoom` (a crop of the image, shown back as an image)
or `image_size` (its width and height, as text) before it answers. The reward file scores the episode (run returns
None); return a number instead to score it here."""

import base64
import io
import json

import openai

TOOLS = [
    {"type": "function", "function": {
        "name": "zoom", "description": "Show a crop of the image, [x1, y1, x2, y2] in pixels.",
        "parameters": {"type": "object", "properties": {"bbox": {"type": "array", "items": {"type": "number"}}},
                       "required": ["bbox"]}}},
    {"type": "function", "function": {
        "name": "image_size", "description": "The image's width and height in pixels.",
        "parameters": {"type": "object", "properties": {}}}},
]


def data_uri(image) -> str:
    """A PIL image as a data: URI (PNG: the pixels arrive unchanged)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def run_tool(call, image) -> list[dict]:
    """The messages a tool call adds: its result (and, for zoom, the crop as a user turn)."""
    name, reply = call.function.name, {"role": "tool", "tool_call_id": call.id}
    try:
        args = json.loads(call.function.arguments or "{}")
        if name == "image_size":
            return [{**reply, "content": f"{image.width} x {image.height}"}]
        if name == "zoom":
            x1, y1, x2, y2 = (int(v) for v in args["bbox"])
            crop = image.crop((max(0, x1), max(0, y1), min(image.width, max(x2, x1 + 28)),
                               min(image.height, max(y2, y1 + 28))))
            return [{**reply, "content": "the crop follows"},
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_uri(crop)}}]}]
        return [{**reply, "content": f"Error: no tool {name!r}"}]
    except (ValueError, KeyError, TypeError) as e:
        return [{**reply, "content": f"Error: {type(e).__name__}: {e}"}]


async def run(client: openai.AsyncOpenAI, sample):
    image = sample.images[0]
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_uri(image)}},
                                             {"type": "text", "text": sample.prompt.replace("<image>", "")}]}]
    for _ in range(3):
        try:
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        except openai.BadRequestError:  # rollout.max_turns reached, or the context is full: the episode ends
            break
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages += run_tool(call, image)
    return None
