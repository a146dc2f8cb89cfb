"""Every fenced shell and Python block of README.md and docs/*.md runs as a reader would run it (issue 62).

A block runs unless the line right before its fence marks it, with a reason:

    <!-- docs-test: gpu REASON -->   it needs GPUs (REASON: which); skipped here, where the tests run on CPUs
    <!-- docs-test: skip REASON -->  it is not a program (a sketch, one line of an edit, the test suite itself):
                                     REASON says where what it shows is checked instead

The fast test reads the docs: every ```bash / ```python block is walked or marked, a marker sits right above
such a fence, an untagged block holds no command line (tag it), and each block parses. The slow walk
(`make test-slow`, one case per block, named doc:line) runs a page's blocks in order in a folder of the page's
own (examples/ linked in, outputs/ written there), as a reader walking the page: bash blocks under `bash -e`,
python blocks as a file (under its own name when its first line is `# NAME.py`, as the page says to save it),
both with the venv's python and rllava (README: `source .venv/bin/activate`). Pipeline and sweep commands
(`python -m ...` or `rllava train|sft|sweep`) run through this file's shim (`main`), which adds key=value overrides
(in place of the command's own value of that key) so that they run here, offline, in seconds:

- SUBSTITUTE: a hub model or data set, or a reader's own file, wherever the resolved config holds it -> a tiny
  local stand-in; a run so changed also gets TINY (CPU sizes, 2 steps); any other run of more than SHORT steps
  stops at 2. PLACEHOLDERS: `config=...` is the custom config (started over each time, as a run of the reader's
  own), a bare `...` ("your other keys") is dropped.
- A python block gets SUBSTITUTE in its text and, when it uses them, the names a page leaves to its reader
  (READER: `model`, `train_records`, `val_records`).
- PRESUMED: what a page presumes its reader made before (docs/custom_task.md's model and data, two runs to
  compare), copied in from the fixtures.
"""

import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from rllava.commands import COMMANDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)  # the venv's python and torchrun
DOCS = ["README.md", *sorted(f"docs/{n}" for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md"))]
LANGS = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
MARK = re.compile(r"<!-- docs-test: (gpu|skip) (\S.*?) -->")
COMMAND = re.compile(r"^\s*(\$ )?(python3?|torchrun|rllava|make|bash|pip|accelerate) ", re.MULTILINE)
SUITE = re.compile(r"\bmake test")  # runs the suite itself: marked, never run

SUBSTITUTE = {  # FX: the fixtures' folder
    "Qwen/Qwen2.5-VL-3B-Instruct": "{FX}/outputs/custom/model",
    "Qwen/Qwen2.5-7B-Instruct": "{FX}/outputs/custom/model",  # examples/config.yaml's
    "hiyouga/math12k@train": "{FX}/outputs/custom/data/train.jsonl",
    "hiyouga/math12k@test": "{FX}/outputs/custom/data/val.jsonl",
    "/models/my-rm": "{FX}/rm",  # docs/reward_models.md: a reward model of the reader's
    "./acc.py:compute_score": "./examples/custom/reward.py:compute_score",  # and a reward of theirs
}
TINY = ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.max_response_length=16",
        "trainer.max_steps=2"]
SHORT = 4
PLACEHOLDERS = {"config=...": ["config=examples/custom/config.yaml", "trainer.overwrite=true"], "...": []}
PRESUMED = {
    "README.md": ["outputs/custom/model", "outputs/custom/data", "outputs/rllava/grpo", "outputs/rllava/rloo"],
    "docs/experiments.md": ["outputs/rllava/grpo", "outputs/rllava/rloo"],
    "docs/reward_models.md": ["outputs/custom/model", "outputs/custom/data"],
    "docs/agents.md": ["outputs/custom/model", "outputs/custom/data"],
}
READER = '''\
import json, os
from transformers import AutoModelForImageTextToText

def _records(split):  # the fixtures' counting records, their images by absolute path
    data = os.path.join(FX, "outputs/custom/data")
    rows = [json.loads(line) for line in open(os.path.join(data, f"{split}.jsonl"))]
    return [dict(row, images=[os.path.join(data, p) for p in row["images"]]) for row in rows]

model = AutoModelForImageTextToText.from_pretrained(os.path.join(FX, "outputs/custom/model"))
train_records, val_records = _records("train"), _records("val")
'''
READS = re.compile(r"\b(model|train_records|val_records)\b")
SHELL = ''.join(f'{prog}() {{ "$DOCS_PY" "$DOCS_SHIM" {prog} "$@"; }}\n' for prog in ("python", "torchrun", "rllava")) \
    + 'export -f python torchrun rllava\n'


@dataclass
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: tuple[str, str] | None  # (gpu | skip, reason)

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def parse(doc: str) -> tuple[list[Block], list[int]]:
    """The doc's fenced blocks, and the lines of docs-test markers that are malformed or sit on no fence."""
    lines = open(os.path.join(REPO, doc)).read().splitlines()
    blocks, bad, start = [], [], None
    for i, line in enumerate(lines):
        if line.startswith("```") and start is None:
            start = i
        elif line.startswith("```"):
            mark = MARK.fullmatch(lines[start - 1]) if start else None
            blocks.append(Block(doc, start + 1, lines[start][3:].strip(), "\n".join(lines[start + 1:i]) + "\n",
                                mark.groups() if mark else None))
            start = None
        elif line.startswith("<!-- docs-test") and not (MARK.fullmatch(line) and lines[i + 1:i + 2] != []
                                                         and lines[i + 1].startswith("```")):
            bad.append(i + 1)
    return blocks, bad


BLOCKS = [block for doc in DOCS for block in parse(doc)[0]]
WALKED = [block for block in BLOCKS if block.lang in LANGS]


def problems(block: Block) -> str | None:
    """Why the docs walk cannot take this block as it stands, or None."""
    if block.lang not in LANGS:
        if block.mark or COMMAND.search(block.text):
            return f"a ```{block.lang} block with {'a marker' if block.mark else 'a command'}: tag it ```bash or ```python"
        return None
    if block.mark is None and SUITE.search(block.text):
        return "runs the test suite: mark it <!-- docs-test: skip REASON -->"
    if LANGS[block.lang] == "python":
        try:
            compile(block.text, block.name, "exec")
        except SyntaxError as e:
            return f"not Python: {e}"
        return None
    res = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
    return f"not bash: {res.stderr.strip()}" if res.returncode else None


def indented_commands(doc: str) -> list[int]:
    """Lines of commands in an indented (unfenced) block: the walk reads fences only, so it would never run them."""
    found, fenced = [], False
    for i, line in enumerate(open(os.path.join(REPO, doc)).read().splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("    ") and COMMAND.match(line):
            found.append(i + 1)
    return found


def test_every_doc_block_is_walked_or_marked():
    found = [f"{doc}:{line}: a marker reads '<!-- docs-test: gpu|skip REASON -->', right above a ```bash or "
             f"```python fence" for doc in DOCS for line in parse(doc)[1]]
    found += [f"{doc}:{line}: a command in an indented block: fence it (```bash)" for doc in DOCS
              for line in indented_commands(doc)]
    found += [f"{block.name}: {why}" for block in BLOCKS for why in [problems(block)] if why]
    assert not found, "\n".join(found)
    assert len(WALKED) > 20  # the parse finds the docs' blocks


def _flat(obj, prefix: str = ""):
    """(dotted key, value) of every leaf of a config dataclass."""
    if dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            yield from _flat(getattr(obj, field.name), f"{prefix}{field.name}.")
    else:
        yield prefix[:-1], obj


def overrides(keys: list[str], fx: str) -> list[str]:
    """What the shim appends to a pipeline's or a sweep's key=value arguments (module docstring)."""
    from rllava.config import ConfigError, load_config

    fixed = [k for k in keys if "=" in k and not k.startswith("-") and "," not in k.split("=", 1)[1]]  # no axes
    try:
        cfg = load_config(fixed)
    except ConfigError:
        return []  # the command itself says what is wrong
    extra = [f"{key}={SUBSTITUTE[value].format(FX=fx)}" for key, value in _flat(cfg)
             if isinstance(value, str) and value in SUBSTITUTE]
    if extra:
        return extra + TINY
    if cfg.trainer.max_steps is None or cfg.trainer.max_steps > SHORT:
        return ["trainer.max_steps=2"]
    return []


def main(prog: str, *args: str) -> None:
    """The walk's `python` / `torchrun`: the command with `overrides` appended to a pipeline or a sweep, printed
    first, and its exit status printed when it fails (a failure inside `a && b` does not stop `bash -e`)."""
    args = [a for arg in args for a in PLACEHOLDERS.get(arg, [arg])]
    module, start = "", 0  # the module run, and where its arguments start
    if "-m" in args:
        module, start = args[args.index("-m") + 1], args.index("-m") + 2
    elif prog == "rllava" and args[:1] and args[0] in COMMANDS:  # the console script: rllava NAME ...
        module, start = COMMANDS[args[0]][0], 1
    if module.startswith("rllava.train.pipeline.") or module == "rllava.commands.sweep":
        extra = overrides(args[start:], os.environ["DOCS_FX"])
        keys = {e.split("=", 1)[0] for e in extra}  # in place of the command's own (a sweep refuses a key twice)
        args = [a for a in args if a.split("=", 1)[0] not in keys] + extra
    print(f"docs-walk: + {prog} {shlex.join(args)}", file=sys.stderr, flush=True)
    code = subprocess.run([os.path.join(BIN, prog), *args]).returncode
    if code:
        print(f"docs-walk: exit {code}", file=sys.stderr)
    sys.exit(code)


class Page:
    """A doc's folder: its blocks run there in order, as a reader walking the page runs them."""

    def __init__(self, doc: str, root, fx: str):
        self.doc, self.dir, self.fx, self.ran = doc, root / doc.replace("/", "_"), fx, set()
        self.dir.mkdir()
        (self.dir / "examples").symlink_to(os.path.join(REPO, "examples"))
        for path in PRESUMED.get(doc, []):
            shutil.copytree(os.path.join(fx, path), self.dir / path)

    def run(self, block: Block) -> subprocess.CompletedProcess:
        """Run the page's earlier blocks not run yet (a case run alone), then this one; output merged."""
        for earlier in WALKED:
            if earlier.doc == block.doc and earlier.line < block.line and not earlier.mark and earlier.line not in self.ran:
                self._run(earlier)
        return self._run(block)

    def _run(self, block: Block) -> subprocess.CompletedProcess:
        self.ran.add(block.line)
        env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], "DOCS_FX": self.fx,
               "DOCS_PY": sys.executable, "DOCS_SHIM": os.path.abspath(__file__), "HF_HUB_OFFLINE": "1",
               "PET_STANDALONE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
        command = ["bash", "-e", "-c", SHELL + block.text] if LANGS[block.lang] == "bash" else [sys.executable, self._save(block)]
        return subprocess.run(command, cwd=self.dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=3600)

    def _save(self, block: Block) -> str:
        """The python block as the reader's file: `# NAME.py` as written, else with SUBSTITUTE and READER."""
        named = re.match(r"# (\w+\.py)\b", block.text)
        text = block.text
        if named is None:
            for hub, local in SUBSTITUTE.items():
                text = text.replace(hub, local.format(FX=self.fx))
            if READS.search(text):
                text = f"FX = {self.fx!r}\n{READER}\n{text}"
        path = self.dir / (named.group(1) if named else f"docs_block_{block.line}.py")
        path.write_text(text)
        return str(path)


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory) -> str:
    """The stand-ins: a tiny Qwen2-VL and reward model, 16 + 4 counting records, two 2-step runs to compare."""
    from rllava.data.synthetic import make_counting
    from rllava.model.tiny import build_tiny
    from rllava.train.pipeline import rlvr

    fx = tmp_path_factory.mktemp("docs_fixtures")
    model, data = build_tiny("qwen2_vl", str(fx / "outputs/custom/model"), size="small"), fx / "outputs/custom/data"
    make_counting(str(data), n_train=16, n_val=4)
    build_tiny("qwen2_rm", str(fx / "rm"), size="small")
    with contextlib.chdir(REPO):
        for estimator in ("grpo", "rloo"):
            rlvr.main(["config=examples/custom/config.yaml", f"actor.model.model_path={model}",
                       f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl",
                       f"trainer.outputs_dir={fx}/outputs", "trainer.project_name=rllava",
                       f"trainer.experiment_name={estimator}", f"algorithm.adv_estimator={estimator}",
                       "trainer.max_steps=2"])
    return str(fx)


@pytest.fixture(scope="session")
def page(tmp_path_factory, fixtures):
    """`page(doc)`: the doc's Page, made on first use."""
    root, made = tmp_path_factory.mktemp("docs_pages"), {}

    def get(doc: str) -> Page:
        if doc not in made:
            made[doc] = Page(doc, root, fixtures)
        return made[doc]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("block", WALKED, ids=lambda block: block.name)
def test_doc_block_runs(block, page):
    if block.mark:
        pytest.skip(f"{block.mark[0]}: {block.mark[1]}")
    res = page(block.doc).run(block)
    assert res.returncode == 0 and "docs-walk: exit" not in res.stdout, \
        f"{block.name} (exit {res.returncode}):\n{block.text}\n--- output (tail) ---\n{res.stdout[-6000:]}"


if __name__ == "__main__":
    main(*sys.argv[1:])
