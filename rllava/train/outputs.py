"""A run's folder belongs to one run.

A run writes its folder, <trainer.outputs_dir>/<project_name>/<experiment_name> as in RLLaVA (config.yaml,
metrics.jsonl, samples.jsonl, val_generations.jsonl, tensorboard/, wandb/, the outside trackers' files, final/) and
its checkpoint root (`trainer.save_checkpoint_path`, default <that folder>/checkpoints). A new run whose folder
holds a run's outputs

- continues that run: it resumes from a checkpoint (`trainer.resume=auto` finds them) and names the same model,
  data, reward and algorithm (`IDENTITY` below; other keys, e.g. max_steps, may change), or
- starts it again, saying so in one line, when it is the same run stopped (Ctrl-C, a kill) before its first
  checkpoint and before final/ (the same command always finishes a run), or any run that stopped before its first
  step (a reward failing at the validation before it: nothing of it is lost), or
- ends at once with exit status 0 (`RunFinished`: its step, its final/) when that run finished and the command
  asks nothing new of it; a larger trainer.max_steps / total_epochs goes on from its last checkpoint, or
- starts over with `trainer.overwrite=true`: the old run's files are deleted first, or
- stops with one line naming what differs, before writing anything.

Nothing is written until the run has been built and its checkpoint loaded (`claim`), so a run that fails at
start-up leaves a finished run's files exactly as they were, and a fresh dir exactly empty.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import yaml

from rllava import distributed as D
from rllava.config import config_to_yaml
from rllava.errors import RllavaError, RunFinished
from rllava.train import checkpoint as C
from rllava.train.tracker import STEP_FILES
from rllava.train.tracker_hub import HUB_FILES
from rllava.utils.fs import write_text_atomic

RUN_FILES = ("config.yaml", *STEP_FILES, "final", "tensorboard", "wandb", *HUB_FILES)
# What makes two configs the same run: resuming across a change of any of these would mix two runs' work.
IDENTITY = ("actor.model.model_path", "data.train_files", "data.prompt_key", "data.answer_key", "data.image_key",
            "data.seed", "data.train_batch_size", "rollout.n", "reward.reward_function", "reward.reward_functions",
            "algorithm.adv_estimator", "trainer.seed")
# What says how a run starts, not what it is: a finished run started again may differ in these.
HOW_TO_START = ("trainer.overwrite", "trainer.resume", "trainer.load_checkpoint_path", "trainer.find_last_checkpoint")
ELSEWHERE = "choose another trainer.experiment_name (or outputs_dir), or set trainer.overwrite=true"
STALE_PREFIXES = (".final.tmp-",)  # what a kill during the final save leaves (rllava.utils.fs.atomic_directory)


def keys_for(run_dir: str) -> list[str]:
    """The keys that make a run write exactly `run_dir`, for tools placing runs (rllava.commands.proof, benchmarks/)."""
    run_dir = os.path.abspath(run_dir)
    project = os.path.dirname(run_dir)
    return [f"trainer.outputs_dir={os.path.dirname(project)}", f"trainer.project_name={os.path.basename(project)}",
            f"trainer.experiment_name={os.path.basename(run_dir)}"]


def held_outputs(cfg, outputs_dir: str) -> list[str]:
    """The names of a run's outputs present in `outputs_dir` and its checkpoint root (`checkpoints/` if any)."""
    held = [name for name in RUN_FILES if os.path.exists(os.path.join(outputs_dir, name))]
    root = C.checkpoint_root(cfg, outputs_dir)
    if C.list_checkpoints(root) or os.path.isfile(os.path.join(root, C.TRACKER_FILE)):
        held.append(os.path.relpath(root, outputs_dir) if root.startswith(outputs_dir) else root)
    return held


def check_writable(path: str, key: str = "the run's folder (trainer.outputs_dir)") -> None:
    """Create `path` (an empty directory holds no run) and write a probe file there; else one line."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".rllava-write-test-"):
            pass
    except OSError as e:
        raise RllavaError(f"{key} {path} is not writable: {e.strerror or e}") from e


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (tree or {}).items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _config(path: str) -> dict | None:
    """The config.yaml at `path` as {dotted key: value}, or None when there is none."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return {"reward.reward_functions": [], **_flat(yaml.safe_load(f.read()))}  # one from before that key


def changes(old: dict, cfg, keys=None) -> list[str]:
    """`key: old -> new` for each of `keys` (default: every key both hold but HOW_TO_START) that differs between a
    run's config.yaml (`old`, from `_config`) and `cfg`."""
    new = _flat(yaml.safe_load(config_to_yaml(cfg, ran=True)))
    keys = keys or [k for k in new if k in old and k not in HOW_TO_START]
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def last_step(outputs_dir: str) -> int:
    """The last step metrics.jsonl holds (`Tracker.log`'s rows begin `{"step": N`; a row a kill cut short too): the
    last one finished; 0: none, or only the validation before the first."""
    path = os.path.join(outputs_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        return max([int(m.group(1)) for m in map(re.compile(r'\{"step": (\d+)').match, f) if m], default=0)


def _say(line: str) -> None:
    if D.is_main():
        print(line, flush=True)


def check_outputs(cfg, outputs_dir: str, resume_from: str | None) -> bool:
    """Before anything is built: may this run write `outputs_dir` (module docstring)? True when `claim` is to delete
    the old run's files first (trainer.overwrite, or the run started again); RunFinished when nothing is left to do."""
    t, held = cfg.trainer, held_outputs(cfg, outputs_dir)
    root = os.path.abspath(C.checkpoint_root(cfg, outputs_dir))
    if t.overwrite and resume_from and os.path.abspath(resume_from).startswith(root + os.sep):
        raise RllavaError(f"trainer.overwrite=true would delete {resume_from}, the checkpoint this run resumes "
                          "from: drop one of the two")
    fresh = t.overwrite or (bool(held) and _starts_again(cfg, outputs_dir, held, resume_from))
    check_writable(outputs_dir)
    if root != os.path.abspath(os.path.join(outputs_dir, "checkpoints")) and t.save_freq > 0:
        check_writable(root, "trainer.save_checkpoint_path")
    return fresh


def _starts_again(cfg, outputs_dir: str, held: list[str], resume_from: str | None) -> bool:
    """`outputs_dir` holds a run's outputs (`held`) and trainer.overwrite is unset: True to start that run again (its
    files deleted first), False to go on from `resume_from`; else one line, or RunFinished (`_finished`)."""
    t, final = cfg.trainer, os.path.join(outputs_dir, "final")
    saved, step = C.list_checkpoints(C.checkpoint_root(cfg, outputs_dir)), last_step(outputs_dir)
    old = _config(os.path.join(outputs_dir, "config.yaml"))
    if old is not None and resume_from is None and not (saved or step or old.get("trainer.val_only")
                                                          or os.path.exists(final)):
        _say(f"{outputs_dir} holds a run stopped before its first step: starting over there")
        return True  # e.g. a reward failing at the validation before it: nothing of that run is lost
    if old is None and resume_from is not None:  # a run resumed from another folder's checkpoint
        old = _config(os.path.join(resume_from, "config.yaml"))
    changed = changes(old, cfg, IDENTITY) if old is not None else []
    if changed:
        raise RllavaError(f"{outputs_dir} holds a run this config does not continue ({'; '.join(changed)}): "
                          f"{ELSEWHERE} to delete that run and start over")
    explicit = resume_from is not None and (t.resume not in ("auto", "none") or t.load_checkpoint_path)
    if old is not None and os.path.isdir(final) and not t.val_only and not explicit:
        return _finished(cfg, outputs_dir, old, step, saved, resume_from)
    if resume_from is not None:
        return False
    if old is not None and not saved:  # the same run, stopped before its first checkpoint: nothing is lost
        _say(f"{outputs_dir} holds this run, stopped before its first checkpoint: starting it again")
        return True
    hint = " (its checkpoints: trainer.resume=auto continues it)" if saved else ""
    raise RllavaError(f"{outputs_dir} already holds another run's outputs ({', '.join(held)}){hint}: {ELSEWHERE} "
                      "to delete them and start over")


def _finished(cfg, outputs_dir: str, old: dict, step: int, saved: list, resume_from: str | None) -> bool:
    """The same run finished at `step`: False to go on from its checkpoint to a larger trainer.max_steps or
    total_epochs; else RunFinished when this command asks nothing new of it, or one line naming what differs."""
    t, where = cfg.trainer, f"{outputs_dir} holds this run, finished at step {step} (its model: {outputs_dir}/final)"
    longer = t.max_steps > step if t.max_steps else (old.get("trainer.max_steps") is not None
                                                     or t.total_epochs > (old.get("trainer.total_epochs") or 0))
    if longer and resume_from is not None:
        return False
    last = f"its checkpoint at step {saved[-1][0]}" if saved else None
    if longer:
        go_on = f"trainer.resume=auto goes on from {last}" if saved else "it kept no checkpoint to go on from"
        raise RllavaError(f"{where}; to the new length {go_on} (trainer.save_freq keeps them): {ELSEWHERE} to run "
                          "it again")
    changed = changes(old, cfg)
    if changed:
        raise RllavaError(f"{where}; this command changes {'; '.join(changed)}: {ELSEWHERE} to start this one over")
    go_on = f"goes on from {last}" if saved else "would, but it kept no checkpoint"
    raise RunFinished(f"{where}: nothing left to do. trainer.overwrite=true starts it over; a larger "
                      f"trainer.max_steps or trainer.total_epochs {go_on}")


def claim(cfg, outputs_dir: str, resuming: bool, fresh: bool) -> None:
    """Right before the first step, rank 0 deletes the old run's files (if `fresh` and not `resuming`) and a killed
    final save's leftovers, then writes this run's config.yaml; every rank waits."""
    if D.is_main():
        if fresh and not resuming:
            for name in RUN_FILES:
                _remove(os.path.join(outputs_dir, name))
            root = C.checkpoint_root(cfg, outputs_dir)
            if os.path.isdir(root):
                for name in os.listdir(root):
                    if name.startswith("global_step_") or name == C.TRACKER_FILE:
                        _remove(os.path.join(root, name))
        for name in os.listdir(outputs_dir):
            if name.startswith(STALE_PREFIXES) or any(name.startswith(f"{f}.tmp-") for f in RUN_FILES):
                _remove(os.path.join(outputs_dir, name))
        write_text_atomic(os.path.join(outputs_dir, "config.yaml"), config_to_yaml(cfg, ran=True))
    D.barrier()


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
