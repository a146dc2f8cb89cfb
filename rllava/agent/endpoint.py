"""The policy served as OpenAI Chat Completions while a rollout runs, for agents written against an OpenAI client
(docs/agents.md, "Agents written for an OpenAI client"; the driver is `rllava.agent.program.ProgramRollout`).

    agent program --POST /v1/chat/completions--> queue --one batched engine.generate--> choices (+ the tokens recorded)

Bound to 127.0.0.1 on a free port; every request carries the run's key (`secrets.token_urlsafe`, never logged) as
its API key, `<run key>.<episode id>`: the episode id tells whose conversation a request continues. Outside a
rollout every request is a 409. Requests waiting together (all live episodes waiting, or the first waiting
`window` seconds) go to the engine as one `generate` call per sampling setting, so K agents of a group cost one
batched generation per turn. Each request's prompt ids, images and sampled ids + log-probs are recorded on its
episode: the trajectory is assembled from them, token in, token out (`ProgramRollout`)."""


import asyncio
import base64
import io
import json
import logging
import re
import secrets
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from PIL import Image

from rllava.data.images import resize_to_pixel_bounds, to_rgb
from rllava.engine.inference.base import Completion, GenerationRequest, SamplingParams
from rllava.model.processor import get_tokenizer

log = logging.getLogger(__name__)
MODEL = "policy"  # the one model served (GET /v1/models): the policy being trained
MM_DROP = ("input_ids", "attention_mask", "mm_token_type_ids")
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# Qwen2.5's tool prompt, for chat templates that render no tools themselves (Qwen2-VL's, Qwen2.5-VL's)
TOOLS_PROMPT = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                "with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\nFor each "
                "function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}}\n</tool_call>")


class APIError(Exception):
    """A request the endpoint answers with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                409: "conflict_error"}.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass
class Turn:
    """One request as recorded: its prompt (expanded ids, raw ids, pixels, images) and the sampled choices."""

    prompt_ids: list[int]
    raw_ids: list[int]
    mm: dict
    images: list
    choices: list[Completion] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # each choice's content as returned
    calls: list[list] = field(default_factory=list)  # each choice's tool calls as returned


@dataclass
class EpisodeLog:
    """What the endpoint knows of one episode: its turns so far, whether it is waiting or over, why it failed."""

    id: str
    where: str  # the sample, for warnings
    max_turns: int
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    error: str = ""  # why the episode is scored 0 ("" if it is not)
    rejected: str = ""  # the last of its requests answered with an error


@dataclass
class Pending:
    episode: EpisodeLog
    turn: Turn
    sampling: SamplingParams
    stop: list[str]
    future: Future


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_image(url: str, where: str) -> Image.Image:
    """An `image_url` part's image: a data: URI or a local path (file:// or plain); a remote URL is a 400."""
    try:
        if url.startswith("data:"):
            return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).copy()
        if re.match(r"[a-z][a-z0-9+.-]*://", url) and not url.startswith("file://"):
            raise APIError(400, f"{where}: {url.split('://')[0]}:// images are not fetched (the trainer has no "
                           "network): send a data: URI or a local path", where, "remote_image")
        return Image.open(url.removeprefix("file://")).copy()
    except APIError:
        raise
    except Exception as e:  # a bad base64, a missing file, not an image
        raise APIError(400, f"{where}: cannot read the image ({type(e).__name__}: {e})", where, "invalid_image") from e


def _content(content, where: str, images: list, bounds: tuple) -> list[dict] | str:
    """OpenAI content (a string, or text / image_url parts) as the chat template's parts; images collected."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(400, f"{where} must be a string or a list of parts", where)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url" and isinstance(part.get("image_url"), (dict, str)):
            url = part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
            images.append(resize_to_pixel_bounds(to_rgb(load_image(url, f"{where}[{j}].image_url")), *bounds))
            parts.append({"type": "image"})
        else:
            raise APIError(400, f"{where}[{j}]: expected a text or image_url part", f"{where}[{j}]")
    return parts


def _call_text(call: dict) -> str:
    """A tool call as Qwen writes it: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`."""
    fn = call["function"]
    return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False) + \
        "\n</tool_call>"


def chat_messages(messages, tools, template: str, bounds: tuple) -> tuple[list[dict], list]:
    """OpenAI messages -> the chat template's (and the images, in order). Tool-call arguments become objects as
    templates expect; a template that renders no tools gets Qwen2.5's tool prompt in the system message, calls as
    `<tool_call>` text and tool results as `<tool_response>` user turns, the text Qwen2.5's own template writes."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list", "messages")
    own = "tool_calls" in template
    out, images = [], []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            raise APIError(400, f"{where}: expected a message with a role of system, user, assistant or tool", where)
        role = "system" if m["role"] == "developer" else m["role"]
        msg = {"role": role, "content": _content(m.get("content"), f"{where}.content", images, bounds)}
        calls = []
        for k, c in enumerate(m.get("tool_calls") or []):
            try:
                fn = c["function"]
                args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
                calls.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
            except (KeyError, TypeError, ValueError) as e:
                raise APIError(400, f"{where}.tool_calls[{k}]: expected {{function: {{name, arguments}}}} with "
                               f"JSON arguments ({type(e).__name__}: {e})", f"{where}.tool_calls") from e
        if calls and own:
            msg["tool_calls"] = calls
        elif calls:
            text = msg["content"] if isinstance(msg["content"], str) else "".join(
                p.get("text", "") for p in msg["content"])
            msg["content"] = "\n".join([text] * bool(text) + [_call_text(c) for c in calls])
        if role == "tool" and not own:
            msg = {"role": "user", "content": f"<tool_response>\n{_text(msg['content'])}\n</tool_response>"}
        out.append(msg)
    if tools and not own:
        prompt = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": _text(out[0]["content"]) + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": "You are a helpful assistant.\n\n" + prompt})
    return out, images


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def parse_reply(text: str) -> tuple[str | None, list[dict]]:
    """A model turn as OpenAI returns it: the content before the first `<tool_call>` and the calls (Qwen's JSON);
    a call that is not such JSON stays in the content."""
    calls, first = [], None
    for m in TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
            name, args = obj["name"], obj.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(name, str):
            continue
        first = m.start() if first is None else first
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    content = text if first is None else text[:first].removesuffix("\n")
    return (content or None) if calls else content, calls


def cut_at_stop(tokenizer, c: Completion, stop: list[str]) -> Completion:
    """The completion up to the first token whose text reaches a stop string (that token included: what was
    sampled stays whole; the text returned ends before the stop string)."""
    if not stop:
        return c
    for k in range(1, len(c.token_ids) + 1):
        text = tokenizer.decode(c.token_ids[:k], skip_special_tokens=True)
        if any(s in text for s in stop):
            return Completion(c.token_ids[:k], c.logprobs[:k], "stop")
    return c


def _number(body: dict, key: str, low: float, high: float, integer: bool = False):
    value = body.get(key)
    if value is None:
        return None
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        raise APIError(400, f"{key}={value!r} must be {'an integer' if integer else 'a number'} in [{low}, {high}]",
                       key)
    return value


class PolicyEndpoint:
    """The server (a uvicorn thread) and the batching queue the rollout's thread drains (`pump`)."""

    def __init__(self, processor, *, max_context: int, min_pixels=None, max_pixels=None, window: float = 0.2):
        self.processor, self.tokenizer = processor, get_tokenizer(processor)
        self.max_context, self.bounds, self.window = max_context, (min_pixels, max_pixels), window
        self.key = secrets.token_urlsafe(24)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.episodes: dict[str, EpisodeLog] = {}
        self.queue: list[Pending] = []
        self.cond = threading.Condition()
        self.open = False  # a rollout is running
        self.sampling = SamplingParams()  # the rollout's sampling (the driver sets it for each rollout)
        self.first_wait = 0.0  # when the oldest queued request arrived
        self.generate_calls = 0  # the rollout's batched engine calls, and the requests they carried
        self.batched_requests = 0
        self._start()

    def _start(self) -> None:
        import uvicorn

        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning",
                                access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="rllava-endpoint")
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)

    # the episodes of a rollout
    def begin(self, episodes: list[EpisodeLog]) -> None:
        with self.cond:
            self.episodes, self.open = {e.id: e for e in episodes}, True
            self.generate_calls, self.batched_requests = 0, 0

    def end(self) -> None:
        with self.cond:
            self.open = False
            for p in self.queue:
                p.future.set_exception(APIError(409, "the rollout is over", code="no_rollout"))
            self.queue = []

    def finish(self, episode: EpisodeLog, error: str = "") -> None:
        """The episode is over (its program returned, raised or timed out): its later requests are 409s."""
        with self.cond:
            episode.done, episode.error = True, episode.error or error
            for p in [p for p in self.queue if p.episode is episode]:
                p.future.set_exception(APIError(409, "this episode is over", code="episode_over"))
                self.queue.remove(p)
            self.cond.notify_all()

    def client_key(self, episode: EpisodeLog) -> str:
        return f"{self.key}.{episode.id}"

    def pump(self, engine, live, timeout: float) -> None:
        """Until no episode is live (`live()`: those not over), or `timeout` seconds pass: batch the waiting
        requests into engine calls, when every live episode is waiting or the first has waited `window` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.cond:
                running = live()
                if not running:
                    return
                if not self.queue:
                    self.cond.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                    continue
                waiting = {id(p.episode) for p in self.queue}
                ready = len(waiting) >= len(running) or time.monotonic() - self.first_wait >= self.window
                if not ready:
                    self.cond.wait(timeout=0.01)
                    continue
                batch, self.queue = self.queue, []
            self._generate(engine, batch)

    def _generate(self, engine, batch: list[Pending]) -> None:
        """One engine call per sampling setting (n, temperature, top_p, top_k); budgets: the largest, cut after."""
        groups: dict[tuple, list[Pending]] = {}
        for p in batch:
            s = p.sampling
            groups.setdefault((s.n, s.temperature, s.top_p, s.top_k), []).append(p)
        for items in groups.values():
            requests = [GenerationRequest(p.turn.prompt_ids, p.turn.mm, p.turn.raw_ids, p.turn.images) for p in items]
            budget = max(p.sampling.max_new_tokens for p in items)
            try:
                out = engine.generate(requests, replace(items[0].sampling, max_new_tokens=budget))
            except Exception as e:
                for p in items:
                    p.future.set_exception(e)
                raise
            self.generate_calls, self.batched_requests = self.generate_calls + 1, self.batched_requests + len(items)
            for p, completions in zip(items, out):
                p.future.set_result([self._cut(c, p) for c in completions])

    def _cut(self, c: Completion, p: Pending) -> Completion:
        if len(c.token_ids) > p.sampling.max_new_tokens:
            c = Completion(c.token_ids[:p.sampling.max_new_tokens], c.logprobs[:p.sampling.max_new_tokens], "length")
        return cut_at_stop(self.tokenizer, c, p.stop)

    # the HTTP side
    def _episode(self, authorization: str | None) -> EpisodeLog:
        key = (authorization or "").removeprefix("Bearer ").strip()
        run_key, _, episode = key.partition(".")
        if not secrets.compare_digest(run_key.encode(), self.key.encode()):
            raise APIError(401, "Incorrect API key provided: use the client rllava builds for the episode",
                           code="invalid_api_key")
        if not self.open:
            raise APIError(409, "no rollout is running: the endpoint serves the policy only while rllava rolls out",
                           code="no_rollout")
        found = self.episodes.get(episode)
        if found is None or found.done:
            raise APIError(409, f"episode {episode!r} is not running", code="episode_over")
        return found

    def _request(self, body, episode: EpisodeLog, sampling: SamplingParams) -> Pending:
        """A request body -> its prompt (chat template, processor) and sampling, or an APIError naming the field."""
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        if body.get("model") != MODEL:
            episode.error = episode.error or f"asked for model {body.get('model')!r}, not {MODEL!r}"
            raise APIError(404, f"The model {body.get('model')!r} does not exist: this endpoint serves {MODEL!r}",
                           "model", "model_not_found")
        if body.get("stream"):
            raise APIError(400, "stream=true is not supported", "stream")
        for key in ("top_logprobs", "response_format", "functions"):
            if body.get(key):
                raise APIError(400, f"{key} is not supported", key)
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise APIError(400, "tools must be a list of objects", "tools")
        n = _number(body, "n", 1, 64, integer=True) or 1
        temperature = _number(body, "temperature", 0, 2)
        top_p = _number(body, "top_p", 0, 1)
        max_tokens = _number(body, "max_completion_tokens", 1, 1 << 30, True) or \
            _number(body, "max_tokens", 1, 1 << 30, True)
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop or []
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise APIError(400, "stop must be a string or a list of at most 4 strings", "stop")
        if len(episode.turns) >= episode.max_turns:
            raise APIError(400, f"this episode made its rollout.max_turns={episode.max_turns} requests",
                           code="max_turns")
        messages, images = chat_messages(body.get("messages"), tools, self.processor.chat_template or "",
                                         self.bounds)
        turn = self._encode(messages, images, tools)
        if len(turn.prompt_ids) >= self.max_context:
            raise APIError(400, f"the prompt is {len(turn.prompt_ids)} tokens, the context holds {self.max_context} "
                           "(data.max_prompt_length + data.max_response_length)", "messages", "context_length_exceeded")
        budget = min(max_tokens or sampling.max_new_tokens, sampling.max_new_tokens,
                     self.max_context - len(turn.prompt_ids))
        chosen = replace(sampling, n=n, max_new_tokens=budget,
                         temperature=sampling.temperature if temperature is None else temperature,
                         top_p=sampling.top_p if top_p is None else top_p)
        return Pending(episode, turn, chosen, stop, Future())

    def _encode(self, messages: list[dict], images: list, tools) -> Turn:
        extra = {"tools": tools} if tools else {}
        try:
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
            raw = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if not images:
                return Turn(raw, raw, {}, [])
            enc = self.processor(text=[text], images=images, return_tensors="pt")
        except Exception as e:  # a template raising on the messages, placeholders not matching the images
            raise APIError(400, f"the chat template or processor cannot encode the messages ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})", "messages") from e
        mm = {k: v for k, v in enc.items() if k not in MM_DROP}
        return Turn(enc["input_ids"][0].tolist(), raw, mm, images)

    def _response(self, p: Pending, completions: list[Completion], logprobs: bool) -> dict:
        choices = []
        for i, c in enumerate(completions):
            text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            for s in p.stop:
                text = text.split(s)[0]
            content, calls = parse_reply(text)
            p.turn.choices.append(c)
            p.turn.texts.append(text)
            p.turn.calls.append(calls)
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            lp = None
            if logprobs:
                lp = {"content": [{"token": self.tokenizer.decode([t]), "logprob": v, "top_logprobs": [],
                                   "bytes": list(self.tokenizer.decode([t]).encode())}
                                  for t, v in zip(c.token_ids, c.logprobs)]}
            reason = "length" if c.finish_reason == "length" else "tool_calls" if calls else "stop"
            choices.append({"index": i, "message": message, "finish_reason": reason, "logprobs": lp})
        used = sum(len(c.token_ids) for c in completions)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": MODEL, "choices": choices, "usage": {"prompt_tokens": len(p.turn.prompt_ids),
                                                              "completion_tokens": used,
                                                              "total_tokens": len(p.turn.prompt_ids) + used}}

    def _app(self):
        from fastapi import FastAPI, Request
        from fastapi.concurrency import run_in_threadpool
        from fastapi.responses import JSONResponse

        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

        def error(e: APIError) -> JSONResponse:
            return JSONResponse(e.body(), status_code=e.status)

        @app.get("/v1/models")
        async def models(request: Request):
            try:
                self._episode(request.headers.get("authorization"))
            except APIError as e:
                return error(e)
            return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "rllava"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            episode = None
            try:
                episode = self._episode(request.headers.get("authorization"))
                try:
                    body = await request.json()
                except ValueError:
                    raise APIError(400, "the request body is not JSON") from None
                pending = await run_in_threadpool(self._request, body, episode, self.sampling)
                with self.cond:
                    if episode.done or not self.open:
                        raise APIError(409, "this episode is over", code="episode_over")
                    if not self.queue:
                        self.first_wait = time.monotonic()
                    self.queue.append(pending)
                    self.cond.notify_all()
                completions = await asyncio.wrap_future(pending.future)
                response = self._response(pending, completions, bool(body.get("logprobs")))
                episode.turns.append(pending.turn)
                return response
            except APIError as e:
                if episode is not None:
                    episode.rejected = f"{e.status} {e.message}"
                return error(e)

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def unknown(path: str):
            return error(APIError(404, f"/{path} is not served: POST /v1/chat/completions, GET /v1/models",
                                  code="unknown_url"))

        return app
