"""Load a `PPOConfig`: schema defaults <- YAML file <- dotted command-line overrides.

    load_config(["config=examples/config.yaml", "actor.optim.lr=1e-3", "trainer.logger=[console,jsonl]"])

`--config FILE` and `--config=FILE` work too (RLLaVA's scripts pass them); `as_config` takes the Python API's forms
(a dict, a YAML path, a PPOConfig) through the same checks: each source's keys, flattened and made canonical, are
merged in (an unknown key or a type error names its key and source), and `PPOConfig.__post_init__` validates.
"""

import copy
import dataclasses
import difflib
import functools
import os
import sys
import typing
from collections.abc import Mapping
from typing import Any, Optional, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rllava.config.schema import (DERIVED_KEYS, LEAVES, SECTIONS, USER_KEYS, ConfigError, PPOConfig, _is_optional,
                                  _strip_optional, run_dir)

# Other names for canonical keys (from RLLaVA scripts and common habits). Rewritten before merging.
ALIASES = {"rollout.engine": "rollout.name", "rollout.max_new_tokens": "data.max_response_length",
           "algorithm.policy_loss_fn": "actor.policy_loss.loss_mode", "trainer.total_steps": "trainer.max_steps",
           "trainer.total_training_steps": "trainer.max_steps"}

COMMAND_LINE = "on the command line"
# Other frameworks' names (TRL's, Hugging Face Trainer's) for rllava's keys: suggested, not accepted, as their
# meanings differ in details (TRL's beta is the KL loss coefficient, which also needs algorithm.use_kl_loss=true)
OTHER_NAMES = {"learning_rate": "actor.optim.lr", "num_generations": "rollout.n", "beta": "actor.kl_loss_coef",
               "max_completion_length": "data.max_response_length", "num_train_epochs": "trainer.total_epochs"}


def _type_name(tp: Any) -> str:
    base = _strip_optional(tp)
    origin = typing.get_origin(base)
    if origin is typing.Union:  # actor.ppo_micro_batch_size: int or str (auto)
        return " or ".join(_type_name(a) for a in typing.get_args(base))
    name = ("a mapping" if origin is dict or base is dict else f"list[{_type_name(typing.get_args(base)[0])}]"
            if origin is list else getattr(base, "__name__", str(base)))
    return f"{name} or null" if _is_optional(tp) else name


def _closest(key: str) -> Optional[str]:
    """The valid key a typo most likely meant, or None when nothing is close."""
    candidates = list(LEAVES) + list(ALIASES)
    parent, _, leaf = key.rpartition(".")
    if leaf in OTHER_NAMES:
        return OTHER_NAMES[leaf]
    same_leaf = [c for c in candidates if c.rpartition(".")[2] == leaf]
    match = difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0)
    if match:  # right name, wrong section: rollout.max_prompt_length -> data.max_prompt_length
        return match[0]
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    match = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    if match:  # a typo in the last part: actor.optim.lrr -> actor.optim.lr
        return siblings[match[0]]
    # a typo in a section name: actor.modle.model_path
    return next(iter(difflib.get_close_matches(key, candidates, n=1, cutoff=0.85)), None)


def _flatten(node: dict, prefix: str, out: dict[str, Any]) -> None:
    """Dotted keys down to schema leaves; a dict-typed leaf keeps its value as one mapping."""
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key not in LEAVES and key not in ALIASES:
            _flatten(v, key + ".", out)
        else:
            out[key] = v


def _overrides(raw: DictConfig, source: str) -> dict[str, Any]:
    """Flat canonical overrides from one source; ConfigError on unknown keys and alias conflicts. `rollout.seed=none`
    (or null/None), as RLLaVA accepts, is null for a key that takes a number or null; a string key keeps the text. On
    the command line a bare `key=` (the shell's empty value, as RLLaVA scripts give data.val_files), which OmegaConf
    reads as null, is the empty string for a string key."""
    flat: dict[str, Any] = {}
    _flatten(OmegaConf.to_container(raw, resolve=False), "", flat)
    problems, canonical, given_as = [], {}, {}  # given_as: canonical key -> the key as written
    for key, value in flat.items():
        target = ALIASES.get(key, key)
        if target in canonical and canonical[target] != value:
            problems.append(f"config keys '{given_as[target]}' and '{key}' both set '{target}', to "
                            f"{canonical[target]!r} and {value!r} ({source}); keep only '{target}'")
            continue
        if target in SECTIONS and not (value == {} or (value is None and SECTIONS[target])):
            problems.append(f"config key '{key}' is a section; give its keys ({target}.<key>=...), "
                            f"got {value!r} ({source})")
        elif target not in LEAVES and target not in SECTIONS:
            hint = f"; did you mean '{close}'?" if (close := _closest(key)) else ""
            problems.append(f"unknown config key '{key}' ({source}){hint}")
        canonical[target], given_as[target] = value, key
    if problems:
        raise ConfigError(problems)
    for key, value in canonical.items():
        tp = LEAVES.get(key)
        none = isinstance(value, str) and value.lower() in ("none", "null") and tp is not None and _is_optional(tp)
        if source == COMMAND_LINE and value is None and tp in (str, Any):  # Any: data.val_files
            canonical[key] = ""
        elif none and _strip_optional(tp) is not str:
            canonical[key] = None
    return canonical


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return out


# keys that name a file or directory: `~` there is the home directory, as in a shell
PATH_KEYS = {f"{m}.{k}" for m in ("actor.model", "critic.model", "reward.model")
             for k in ("model_path", "tokenizer_path", "lora_weight_path")} | {
    "ref.model_path", "data.train_files", "data.val_files", "data.expert_files", "data.format_prompt",
    "data.train_image_dir", "data.val_image_dir", "reward.reward_function", "rollout.env_config_path",
    "rollout.tool_config_path", "trainer.outputs_dir", "trainer.save_checkpoint_path", "trainer.load_checkpoint_path",
    "trainer.resume", "algorithm.plugins", "rollout.agent.plugins", "algorithm.distill.teacher_path"}


def _merge(base: DictConfig, overrides: dict[str, Any], source: str) -> None:
    """Merge in place; on failure, merge one key at a time so every type error names its key. `~/runs/x` in a path
    key is under the home directory (not a folder named `~` here)."""
    def home(v):
        return os.path.expanduser(v) if isinstance(v, str) and v.startswith("~") else v
    overrides = {k: ([home(x) for x in v] if isinstance(v, list) else home(v)) if k in PATH_KEYS else v
                 for k, v in overrides.items()}
    try:
        base.merge_with(_nest(overrides))
        return
    except OmegaConfBaseException as e:
        first_error = e
    problems: list[str] = []
    for key, value in overrides.items():
        try:
            base.merge_with(_nest({key: value}))
        except OmegaConfBaseException:
            tp = LEAVES.get(key, dict)
            hint = f"; write a list, e.g. {key}=[a,b]" if typing.get_origin(_strip_optional(tp)) is list else ""
            problems.append(f"config key '{key}' expects {_type_name(tp)}, got {value!r} ({source}){hint}")
    raise ConfigError(problems or f"cannot merge config ({source}): {str(first_error).splitlines()[0]}")


EXAMPLES = os.path.realpath(os.path.abspath(os.path.join(__file__, "..", "..", "..", "examples")))


@functools.cache
def _defaults() -> DictConfig:
    return OmegaConf.structured(PPOConfig)  # ~0.1 s, so built once and copied


def load_config(args: Optional[Sequence[str]] = None) -> PPOConfig:
    """A validated PPOConfig from argv-style args (default: sys.argv[1:]). Raises ConfigError naming the key, value
    and source of every problem; warns about keys the chosen actor.strategy ignores."""
    config_path, dotlist, rest = None, [], list(sys.argv[1:] if args is None else args)
    while rest:
        arg = rest.pop(0)
        if arg == "--config":
            if not rest:
                raise ConfigError("--config needs a file: --config examples/config.yaml")
            path = rest.pop(0)
        elif arg.startswith(("--config=", "config=")):
            path = arg.split("=", 1)[1]
        elif "=" not in arg or arg.startswith("-") or arg.startswith("="):
            raise ConfigError(f"command-line argument '{arg}' is not key=value (e.g. actor.optim.lr=1e-6) "
                              f"or config=FILE")
        else:
            dotlist.append(arg)
            continue
        if config_path is not None:
            raise ConfigError(f"two config files given ('{config_path}' and '{path}'); pass one, "
                              f"and override single keys as key=value")
        config_path = path
    cfg, said = copy.deepcopy(_defaults()), set()
    if config_path is not None:
        try:
            raw = OmegaConf.load(config_path)
        except FileNotFoundError:
            raise ConfigError(f"config file '{config_path}' not found (config={config_path})") from None
        except (OSError, yaml.YAMLError, OmegaConfBaseException) as e:
            raise ConfigError(f"config file '{config_path}' is not valid YAML: {' '.join(str(e).split())}") from None
        if not isinstance(raw, DictConfig):
            raise ConfigError(f"config file '{config_path}' must hold a mapping of sections (data:, actor:, ...), "
                              f"not a {type(raw).__name__}")
        flat = _overrides(raw, f"in {config_path}")
        # a run's config.yaml read back: a value `_filled` wrote is dropped while it is still what its keys give, so
        # `config=<run>/config.yaml` with another model, prompt length or experiment name moves it along
        filled = _filled(lambda key: flat[key] if key in flat else OmegaConf.select(_defaults(), key))
        from_file = {k: v for k, v in flat.items() if k not in filled or v != filled[k]}
        _merge(cfg, from_file, f"in {config_path}")
        if not os.path.realpath(config_path).startswith(EXAMPLES + os.sep):  # a file of this repository's examples/
            said |= set(from_file)  # (RLLaVA's base config, a task's recipe) is not the user's choice
    # each value read as YAML (numbers, lists, null) or, where it is not YAML (a Jinja template such as
    # `data.expert_template='{{ thinking }} {{ answer }}'`), as the text itself
    cli = OmegaConf.create()
    for item in dotlist:
        try:
            cli = OmegaConf.merge(cli, OmegaConf.from_dotlist([item]))
        except yaml.YAMLError:
            key, value = item.split("=", 1)
            OmegaConf.update(cli, key, value, force_add=True)
        except OmegaConfBaseException as e:
            raise ConfigError(f"cannot parse the command-line override '{item}': {' '.join(str(e).split())}") from None
    from_cli = _overrides(cli, COMMAND_LINE)
    for key, other, unset in (("reward.reward_functions", "reward.reward_function", None),  # either reward form on
                              ("reward.reward_function", "reward.reward_functions", [])):  # the command line
        if key in from_cli and other not in from_cli:  # replaces a config file's other (README's reward_functions=[])
            OmegaConf.update(cfg, other, unset, merge=False)
    _merge(cfg, from_cli, COMMAND_LINE)
    token = USER_KEYS.set(said | set(from_cli))  # warnings about ignored keys: only for these
    try:
        return _validated(cfg)
    finally:
        USER_KEYS.reset(token)


def _validated(cfg: DictConfig) -> PPOConfig:
    try:
        return OmegaConf.to_object(cfg)  # runs PPOConfig.__post_init__, i.e. validation
    except OmegaConfBaseException as e:  # e.g. a ${...} interpolation that does not resolve
        raise ConfigError(f"cannot resolve config: {str(e).splitlines()[0]}") from None


def as_config(config: Any = None) -> PPOConfig:
    """The Python API's config (`rllava.api.RLVRPipeline`), checked as `load_config` checks the command line's: None
    (the defaults), a YAML path, argv-style args (`["config=FILE", "key=value"]`), a dict (nested sections and/or
    dotted keys, aliases accepted), or a PPOConfig (checked again: its fields may have changed since it was built)."""
    if config is None or isinstance(config, (list, tuple)):
        return load_config(list(config or []))
    if isinstance(config, (str, os.PathLike)):
        return load_config([f"config={os.fspath(config)}"])
    if isinstance(config, PPOConfig):
        config, source = dataclasses.asdict(config), "in the PPOConfig given"
    elif isinstance(config, Mapping):
        source = "in the config dict"
    else:
        raise ConfigError("config: expected a YAML path, a dict or a PPOConfig, got a value of type "
                          f"{type(config).__name__}")
    try:
        raw = OmegaConf.create(dict(config))
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(f"cannot read the config dict: {' '.join(str(e).split())}") from None
    cfg = copy.deepcopy(_defaults())
    _merge(cfg, _overrides(raw, source), source)
    return _validated(cfg)


def _filled(get) -> dict[str, Any]:
    """The values RLLaVA's config fills in from other keys (`get(key)` reads them), where rllava keeps None / -1 and
    reads those keys when it runs: what a run's config.yaml writes (`config_to_yaml(ran=True)`)."""
    run = run_dir(get("trainer.outputs_dir"), get("trainer.project_name"), get("trainer.experiment_name"))
    return {**{key: get(owner) for key, owner in DERIVED_KEYS.items()},
            "actor.model.tokenizer_path": get("actor.model.model_path"),
            "trainer.save_checkpoint_path": os.path.abspath(os.path.join(run, "checkpoints"))}


def config_to_yaml(cfg: PPOConfig, ran: bool = False) -> str:
    """The full resolved config as YAML; load_config(['config=<that file>']) gives the same config back. `ran`: a
    run's config.yaml, which writes the values that ran where RLLaVA's writes them (`_filled`), not None / -1."""
    tree = OmegaConf.structured(cfg)
    if ran:
        for key, value in _filled(lambda k: OmegaConf.select(tree, k)).items():
            if key in DERIVED_KEYS or OmegaConf.select(tree, key) is None:  # a copy of its key, or left to it
                OmegaConf.update(tree, key, value)
    return OmegaConf.to_yaml(tree)
