"""The generated reference pages, so neither can drift from the code (tests compare them): docs/config.md from
the schema (every key, its default and the comment beside its field) and docs/algorithms.md from the registries
(every estimator, loss, hybrid, correction and distillation loss: the config keys it reads, its formula and its
paper, both from its docstring).

    python -m rllava.commands.docs      # rewrites docs/config.md and docs/algorithms.md
"""

from __future__ import annotations

import inspect
import os
import re
import typing
from dataclasses import MISSING, fields, is_dataclass

from rllava.algorithms import correction as C
from rllava.algorithms import distill as Dl
from rllava.algorithms import hybrid as H
from rllava.algorithms import kl as K
from rllava.algorithms import ppo as _ppo  # noqa: F401  (registers the built-in estimators and losses)
from rllava.algorithms.hybrid import HYBRID_LOSS_KEYS
from rllava.algorithms.registry import ADV_ESTIMATORS, DISTILL_LOSSES, POLICY_LOSSES
from rllava.config.loader import ALIASES
from rllava.config.schema import PPOConfig

# ------------------------------------------------------------------------------------ docs/config.md
_FIELD = re.compile(r"^    (\w+): [^#]*?(?:#\s*(.*))?$")


def _comments(cls) -> dict[str, str]:
    """Field name -> the comment beside its line in the class's source."""
    return {m.group(1): (m.group(2) or "").strip() for m in map(_FIELD.match, inspect.getsource(cls).splitlines()) if m}


def _default(f):
    value = f.default_factory() if f.default is MISSING else f.default  # every field has a default
    return "{...}" if is_dataclass(value) else value


def _key_rows(cls, prefix: str):
    comments, hints = _comments(cls), typing.get_type_hints(cls)
    for f in fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        sub = next((a for a in (tp, *typing.get_args(tp)) if is_dataclass(a)), None)
        yield key, _default(f), comments.get(f.name, ""), sub is not None
        if sub is not None:
            yield from _key_rows(sub, key + ".")


def render_config() -> str:
    lines = ["# Config reference", "",
             "Generated from `rllava/config/schema.py` by `python -m rllava.commands.docs`; do not edit.",
             "Keys are RLLaVA's; `rllava:` marks keys or defaults of our own. Set them in YAML (`config=FILE`)",
             "or on the command line (`key=value`).", "", "## Aliases", "", "| alias | canonical key |", "|---|---|"]
    lines += [f"| `{a}` | `{c}` |" for a, c in sorted(ALIASES.items())]
    section = None
    for key, default, comment, is_section in _key_rows(PPOConfig, ""):
        top = key.split(".")[0]
        if top != section:
            section = top
            lines += ["", f"## {section}", "", "| key | default | meaning |", "|---|---|---|"]
        if is_section and "." not in key:
            continue
        shown = "section" if is_section else f"`{default!r}`".replace("|", "\\|")
        lines.append(f"| `{key}` | {shown} | {comment.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- docs/algorithms.md
# Keyword-only parameter -> where its value comes from.
SOURCES = {
    "norm_adv_by_std_in_grpo": "`algorithm.norm_adv_by_std_in_grpo`", "gamma": "`algorithm.gamma`",
    "lam": "`algorithm.lam`", "clip_ratio_low": "`actor.clip_ratio_low`", "clip_ratio_high": "`actor.clip_ratio_high`",
    "clip_ratio_c": "`actor.clip_ratio_c`", "token_rewards": "token rewards (KL-shaped if `algorithm.use_kl_in_reward`)",
    "values": "critic values", "baseline_scores": "greedy-rollout reward (made by the rollout stage)",
    "discount": "`rollout.discount`", "step_advantage_w": "`algorithm.step_advantage_w`",
    "gigpo_mean_std_cross_steps": "`algorithm.gigpo_mean_std_cross_steps`",
    "turn_index": "agent rollout: each token's turn", "turn_anchors": "agent rollout: the observation before each turn",
    "turn_rewards": "agent rollout: each turn's tool reward",
    "success_reward_threshold": "`algorithm.success_reward_threshold`",
    **{k: f"`actor.{k}`" for k in HYBRID_LOSS_KEYS},
}


def _formula(doc: str) -> str:
    """The raw docstring's first block indented past the function body (the formula), for a table cell."""
    lines, block = doc.splitlines(), []
    for line in lines[1:]:
        if line.startswith(" " * 8) and line.strip():
            block.append(line.strip())
        elif block:
            break
    return "<br>".join(s.replace("|", "\\|") for s in block)


def _paper(doc: str) -> str:
    ids = re.findall(r"arXiv:(\d{4}\.\d{4,5})", doc)
    return ", ".join(f"[arXiv:{i}](https://arxiv.org/abs/{i})" for i in dict.fromkeys(ids))


def _rows(table: dict) -> list[str]:
    rows = []
    for name, fn in sorted(table.items()):
        doc = fn.__doc__ or ""
        params = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
        keys = ", ".join(SOURCES.get(p, f"`actor.policy_loss.{p}`") for p in params if p != "eps") or "-"
        alias = f" (= `{fn.__name__}`)" if fn.__name__ != name else ""
        rows.append(f"| `{name}`{alias} | {keys} | {_formula(doc)} | {_paper(doc)} |")
    return rows


def _reference(doc: str) -> str:
    """The docstring's `Reference: ...` paragraph (the implementation it follows, and where rllava differs)."""
    match = re.search(r"Reference: (.*?)(?:\n\s*\n|\Z)", doc, re.S)
    return " ".join(match.group(1).split()) if match else ""


def _reference_section() -> list[str]:
    rows = [f"- `{name}`: {_reference(fn.__doc__ or '')}" for table in (ADV_ESTIMATORS, POLICY_LOSSES)
            for name, fn in sorted(table.items()) if _reference(fn.__doc__ or "")]
    return ["## Reference implementations, and where rllava differs", "",
            "The SFT+RL hybrids, SAPO, GMPO and GiGPO have parity tests whose expected numbers come from the "
            "reference's formula (`tests/algorithms/test_parity_hybrids.py`, `test_parity_rl.py`); the others are "
            "tested against hand-computed examples (`tests/algorithms/test_advantage.py`, `test_losses.py`).",
            "", *rows, ""]


def _hybrid_section() -> list[str]:
    """The hybrids: the method table of `rllava.algorithms.hybrid`'s docstring, then its schedules and weights."""
    doc = H.__doc__.split("\n\n")
    rows = [f"| `{f.__name__}` | {_formula(f.__doc__)} | {_paper(f.__doc__)} |"
            for f in (H.mu_schedule, H.phi, H.reshape, H.on_policy_ratio, H.hint_probability, H.srft_weights)]
    return ["## SFT+RL hybrids (CHORD, LUFFY, UFT, HPT, SRFT)", "", doc[1], "", "```", doc[2].strip("\n"), "```", "",
            doc[3], "", "| schedule / weight | formula | paper |", "|---|---|---|", *rows, ""]


def _correction_section() -> list[str]:
    """Rollout correction (`rllava.algorithms.correction`): applied by the Actor to any loss's RL term."""
    reads = ((C.rollout_importance_weights, "`algorithm.rollout_is`, `algorithm.rollout_is_cap` (or "
                                            "`actor.tis_imp_ratio_cap`)"),
             (C.rollout_rejection_mask, "`algorithm.rollout_rs`, `algorithm.rollout_rs_threshold`"),
             (C.mismatch_metrics, "(on with any correction or `decoupled_ppo`)"))
    rows = [f"| `{f.__name__}` | {keys} | {_formula(f.__doc__)} |" for f, keys in reads]
    refs = [f"- `{f.__name__}`: {_reference(f.__doc__)}" for f, _ in reads]
    return ["## Rollout correction (`algorithm.rollout_is`, `algorithm.rollout_rs`)", "", C.__doc__.split("\n\n")[0]
            .replace("\n", " "), "", "| function | reads | formula |", "|---|---|---|", *rows, "", *refs, ""]


def _kl_section() -> list[str]:
    """KL in the reward (`rllava.algorithms.kl`): its module docstring, the indented formulas as code blocks."""
    lines = ["## KL in the reward (`algorithm.use_kl_in_reward`, `algorithm.kl_ctrl`)", ""]
    for part in K.__doc__.split("\n\n"):
        if part.startswith("    "):
            lines += ["```", part.strip("\n"), "```", ""]
        else:
            lines += [" ".join(part.split()), ""]
    return lines


def _distill_section() -> list[str]:
    """On-policy distillation (`rllava.algorithms.distill`): the module's formula, then one row per registered loss."""
    doc = Dl.__doc__.split("\n\n")
    rows = [f"| `{name}` | {', '.join(fn.reads)} | {_formula(fn.__doc__)} |"
            for name, fn in sorted(DISTILL_LOSSES.items())]
    refs = [f"- `{name}`: {_reference(fn.__doc__)}" for name, fn in sorted(DISTILL_LOSSES.items())]
    return ["## On-policy distillation (`algorithm.distill`)", "", doc[0].replace("\n", " "), "", "```",
            doc[1].strip("\n"), "```", "", doc[2].replace("\n", " "), "",
            "Keys: `algorithm.distill.teacher_path` (the teacher; its tokenizer must be the student's), `.loss` (below), "
            "`.coef` (its weight), `.use_reward` (false: pure distillation), `.route_field` + `.teachers` (one teacher "
            "per value of a record field; other rows: `teacher_path`), `.engine` (hf: the teacher in the trainer, "
            "sharded and offloaded like the policy; vllm / sglang: its log-probs from an engine of its own, for k1 / "
            "k3), `.offload`, `.engine_kwargs`. Register a loss with `@register_distill_loss(name, reads=...)` in a "
            "file of `algorithm.plugins`: a function of `LossInputs`, `reads` naming the fields it reads among "
            "logprobs, old_logprobs, teacher_logprobs and full_kl.", "", doc[3].replace("\n", " "), "", "| loss | reads | formula |", "|---|---|---|", *rows,
            "", *refs, ""]


def render_algorithms() -> str:
    head = "| name | reads | formula | paper |\n|---|---|---|---|"
    return "\n".join([
        "# Algorithms", "",
        "Generated by `python -m rllava.commands.docs` from the registries in",
        "`rllava/algorithms/` (a test keeps it in sync). Select an estimator with `algorithm.adv_estimator=NAME` and",
        "a policy loss with `actor.policy_loss.loss_mode=NAME` (alias `algorithm.policy_loss_fn`); the keys each",
        "one reads are its keyword-only parameters. Register your own with `@register_adv_estimator`,",
        "`@register_policy_loss` or `@register_ppo` in a file listed in `algorithm.plugins`.", "",
        "## Advantage estimators (`algorithm.adv_estimator`)", "", head, *_rows(ADV_ESTIMATORS), "",
        "## Policy losses (`actor.policy_loss.loss_mode`)", "", head, *_rows(POLICY_LOSSES), "",
        *_hybrid_section(), *_correction_section(), *_kl_section(), *_distill_section(), *_reference_section(),
    ])


def main() -> None:
    docs = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs")
    for name, render in (("config.md", render_config), ("algorithms.md", render_algorithms)):
        with open(os.path.join(docs, name), "w") as f:
            f.write(render())


if __name__ == "__main__":
    main()
