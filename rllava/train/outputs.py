"""A run's folder belongs to one run.

A run writes its folder, <trainer.outputs_dir>/<project_name>/<experiment_name> as in RLLaVA (config.yaml,
metrics.jsonl, samples.jsonl, val_generations.jsonl, tensorboard/, wandb/, final/) and its checkpoint root
(`trainer.save_checkpoint_path`, default <that folder>/checkpoints). A new run whose folder holds a run's outputs

- continues that run: it resumes from a checkpoint (`trainer.resume=auto` finds them) and names the same model,
  data, reward and algorithm (`IDENTITY` below; other keys, e.g. max_steps, may change), or
- starts it again, saying so in one line, when it is the same run stopped (Ctrl-C, a kill) before its first
  checkpoint and before final/: the same command always finishes a run, or
- starts over with `trainer.overwrite=true`: the old run's files are deleted first, or
- stops with one line before writing anything.

Nothing is written until the run has been built and its checkpoint loaded (`claim`), so a run that fails at
start-up leaves a finished run's files exactly as they were, and a fresh dir exactly empty.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import yaml

from rllava import distributed as D
from rllava.config import config_to_yaml
from rllava.errors import RllavaError
from rllava.train import checkpoint as C
from rllava.train.tracker import STEP_FILES
from rllava.utils.fs import write_text_atomic

RUN_FILES = ("config.yaml", *STEP_FILES, "final", "tensorboard", "wandb")
# What makes two configs the same run: resuming across a change of any of these would mix two runs' work.
IDENTITY = ("actor.model.model_path", "data.train_files", "data.prompt_key", "data.answer_key", "data.image_key",
            "data.seed", "data.train_batch_size", "rollout.n", "reward.reward_function", "reward.reward_functions",
            "algorithm.adv_estimator", "trainer.seed")
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


def identity_changes(previous: str, cfg) -> list[str]:
    """`key: old -> new` for each IDENTITY key that differs between the config.yaml at `previous` and `cfg`."""
    with open(previous) as f:
        old, new = _flat(yaml.safe_load(f.read())), _flat(yaml.safe_load(config_to_yaml(cfg)))
    old.setdefault("reward.reward_functions", [])  # a config.yaml written before that key existed
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in IDENTITY if old.get(k) != new.get(k)]


def check_outputs(cfg, outputs_dir: str, resume_from: str | None) -> bool:
    """Before anything is built: may this run write `outputs_dir` (module docstring)? True when `claim` is to delete
    the old run's files first: trainer.overwrite, or the same run started again."""
    t, held = cfg.trainer, held_outputs(cfg, outputs_dir)
    root = os.path.abspath(C.checkpoint_root(cfg, outputs_dir))
    if t.overwrite and resume_from and os.path.abspath(resume_from).startswith(root + os.sep):
        raise RllavaError(f"trainer.overwrite=true would delete {resume_from}, the checkpoint this run resumes "
                          "from: drop one of the two")
    previous, saved = os.path.join(outputs_dir, "config.yaml"), C.list_checkpoints(root)
    # the same run (its config.yaml names the same IDENTITY) stopped before its first checkpoint and final/:
    # starting it again loses nothing
    again = (bool(held) and not t.overwrite and resume_from is None and os.path.isfile(previous) and not saved
             and not os.path.exists(os.path.join(outputs_dir, "final")) and not identity_changes(previous, cfg))
    if again and D.is_main():
        print(f"{outputs_dir} holds this run, stopped before its first checkpoint: starting it again", flush=True)
    if held and not t.overwrite and not again:
        if resume_from is None:
            hint = " (its checkpoints: trainer.resume=auto continues it)" if saved else ""
            raise RllavaError(f"{outputs_dir} already holds another run's outputs ({', '.join(held)}){hint}: "
                              "choose another trainer.experiment_name (or outputs_dir), or set "
                              "trainer.overwrite=true to delete them and start over")
        previous = previous if os.path.isfile(previous) else os.path.join(resume_from, "config.yaml")
        changes = identity_changes(previous, cfg) if os.path.isfile(previous) else []
        if changes:
            raise RllavaError(f"{outputs_dir} holds a run this config does not continue ({'; '.join(changes)}): "
                              "choose another trainer.experiment_name (or outputs_dir), or set "
                              "trainer.overwrite=true to delete that run and start over")
    check_writable(outputs_dir)
    if root != os.path.abspath(os.path.join(outputs_dir, "checkpoints")) and t.save_freq > 0:
        check_writable(root, "trainer.save_checkpoint_path")
    return t.overwrite or again


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
