"""The search tool (BM25 and MiniLM retrieval over a local corpus), the agent_search data and its reward."""

import importlib.util
import json
import os
import re

import pytest
from PIL import Image

from rllava.agent.search import Search, embed
from rllava.agent.tools import AgentState, ToolEnv
from rllava.config import ConfigError
from rllava.data.synthetic import agent_search_split, agent_search_world, make_dataset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [{"id": "z", "title": "Zorvak", "text": "The red triangle is called Zorvak. Zorvak lives in Mirvale."},
        {"id": "q", "title": "Quenta", "text": "The blue circle is called Quenta. Quenta lives in Dornhelm."},
        {"id": "p", "text": "The green square is called Pelor. Pelor lives in Ashford.", "image": "p.png"}]


@pytest.fixture
def corpus(tmp_path):
    Image.new("RGB", (40, 30), (40, 170, 60)).save(tmp_path / "p.png")
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return str(path)


@pytest.fixture(scope="module")
def minilm():
    return embed  # loads all-MiniLM-L6-v2 once (lru_cache) for the module's tests


@pytest.mark.parametrize("retriever", ["bm25", "dense"])
def test_the_right_document_comes_first(corpus, retriever, minilm):
    search = Search(corpus, top_k=2, retriever=retriever)
    state = AgentState(None)
    obs = search("where does the blue circle live", state)
    assert obs.text.startswith("<information>1. Quenta: The blue circle is called Quenta.")
    assert obs.text.endswith("</information>") and obs.text.count("\n") == 1
    assert state.memory["search"][0][0] == "q"
    assert search("green square", state).images[0].size == (40, 30)  # a document's image comes back
    assert state.memory["search"][1][0] == "p"


def test_max_chars_and_an_empty_query(corpus):
    search = Search(corpus, top_k=3, max_chars=30)
    assert len(search("red triangle", AgentState(None)).text) == len("<information></information>") + 30
    obs = ToolEnv({"search": search}, invalid_call_penalty=-0.1).step(AgentState(None), "<search>  </search>")
    assert obs.error and obs.reward == -0.1 and obs.text.startswith("Error: search: the query is empty")
    assert "Quenta" in ToolEnv({"search": search}, tool_format="json").step(
        AgentState(None), '<tool_call>{"name": "search", "arguments": {"query": "blue circle"}}</tool_call>').text


def test_minilm_embeddings_are_real(minilm):
    a, b, c = minilm(["a red triangle", "the red triangle shape", "income tax law"])
    assert abs(float(a @ a) - 1) < 1e-5 and float(a @ b) > 0.7 > 0.2 > float(a @ c)


@pytest.mark.parametrize("lines, message", [
    (None, "no such file"),
    (['{"id": 1, "text": "x"}', "{oops"], "line 2: not valid JSON"),
    (['{"id": 1}'], 'line 1 needs an "id" and a "text" string'),
    (['{"id": 1, "text": "x"}', '{"id": 1, "text": "y"}'], "line 2: id 1 appears twice"),
    (['{"id": 1, "text": "x", "image": "gone.png"}'], "gone.png does not exist"),
    ([], "holds no document"),
])
def test_bad_corpus_files(tmp_path, lines, message):
    path = tmp_path / "c.jsonl"
    if lines is not None:
        path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=f"rollout.agent.tool_kwargs.search.*{message}"):
        Search(str(path))
    with pytest.raises(ConfigError, match="retriever='tfidf': choose bm25 or dense"):
        Search(str(path), retriever="tfidf")


def test_agent_search_records_need_the_search(tmp_path):
    paths = make_dataset("agent_search", str(tmp_path / "d"), n_train=36, n_val=12)
    corpus = os.path.join(os.path.dirname(paths["train"]), "corpus.jsonl")
    search = Search(corpus, top_k=2)
    rows = {s: [json.loads(line) for line in open(paths[s])] for s in ("train", "val")}
    heldout, fact = agent_search_split(0), lambda r: (r["entity"], r["day"])
    assert {fact(r) for r in rows["val"]} <= heldout and not {fact(r) for r in rows["train"]} & heldout
    assert len(agent_search_world(0)) == 2160 and len(heldout) == 540
    guesses = [r for r in rows["train"] if len(r["turns"]) == 1]  # a third of the train experts guess at once
    assert 0 < len(guesses) < len(rows["train"]) / 2 and all(len(r["turns"]) == 2 for r in rows["val"])
    assert all(re.fullmatch(r"<answer> \w+</answer>", r["turns"][0]) for r in guesses)
    for r in rows["train"] + rows["val"]:  # the expert's query finds the document with the answer, first
        state = AgentState(None)
        obs = search(r["query"], state)
        assert state.memory["search"][0][0] == r["doc_id"] and f" {r['answer']}." in obs.text.split("\n")[0]
        if r not in guesses:
            assert r["turns"] == [f"<search> {r['query']}</search>", f"<answer> {r['answer']}</answer>"]


def _reward():
    spec = importlib.util.spec_from_file_location("agent_search_f1", os.path.join(REPO, "examples", "reward_function",
                                                                                  "agent_search_f1.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_f1_reward_by_hand():
    r = _reward()
    assert r.f1("the Mirvale", "Mirvale") == 1.0 and r.f1("Mirvale!", "mirvale") == 1.0
    assert r.f1("Mir vale town", "Mir vale") == pytest.approx(0.8)  # P 2/3, R 1
    assert r.f1("north", "south") == 0.0
    s = r.score_one("<search> red circle</search>\n<answer> sphere</answer>", "sphere", doc_id="red circle",
                    tool_calls=[("search", " red circle")], tool_memory={"search": [["red circle", "red cube"]]})
    assert s == {"overall": 1.0, "f1": 1.0, "format": 1.0, "accuracy": 1.0, "searched": 1.0, "found": 1.0,
                 "used": 1.0}
    guess = r.score_one("<answer> the big sphere</answer> and more", "sphere")
    assert guess["f1"] == pytest.approx(2 * 0.5 * 1 / 1.5) and guess["format"] == 0.0 and guess["searched"] == 0.0
    assert guess["overall"] == pytest.approx(0.9 * guess["f1"])
    near = r.score_one("<search> red circle day 12</search>\n<answer> x</answer>", "y", query="red circle day 12",
                       tool_calls=[("search", " red circle day 12")], query_weight=0.5)
    assert near["query"] == pytest.approx(1.0, abs=1e-4) and near["overall"] == pytest.approx(0.1 + 0.5 * near["query"])
    far = r.score_one("", "y", query="red circle day 12", tool_calls=[("search", "income tax")], query_weight=0.5)
    assert far["query"] == 0.0  # below 0.5 similarity counts nothing
