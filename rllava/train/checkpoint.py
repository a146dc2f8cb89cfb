"""Trainer checkpoints: everything a run needs to go on exactly where it stopped, one directory per step.

    <trainer.save_checkpoint_path, default outputs_dir/checkpoints>/
        global_step_N/
            actor/                 weights, optimizer, LR schedule (torch.distributed.checkpoint, keyed by name)
            actor/huggingface/     config + processor; + the weights with actor.checkpoint.save_contents: [.., hf_model]
            critic/                the same for the critic, when there is one
            ref/                   the reference's weights, when algorithm.ref_reset_freq moves them
            rng/rank_R.pt          rank R's python / numpy / torch (/ cuda) RNG states
            trainer_state.json     step, sampler (data.sampler and its state), world size, KL controller, what was saved
            config.yaml            the run's resolved config (`python -m rllava.commands.export` reads it)
        latest_checkpointed_iteration.txt   the newest step (verl's tracker file)

- Exact: the sampler's state (the epoch sampler's position, epoch e shuffled with data.seed + e; a curriculum's pass
  rates), optimizer, LR schedule, KL coefficient and every RNG state come back: N steps, stop, resume, M steps
  gives bitwise the weights of N + M steps straight. A resume under another data.sampler is one line.
- Crash-safe: written under `global_step_N.tmp` (every rank) and renamed by rank 0 when whole, so `global_step_N`
  is always complete; `resume=auto` takes the highest N. The next save deletes leftovers.
- Asynchronous (actor.checkpoint.async_save): the engines' state is staged to host memory, then written, renamed
  and pruned by one background thread; the next save and the end of the run wait for it.
- Any world size: the engines' state is keyed by parameter name and resharded by DCP on load; only the per-rank
  RNG states need the same world size (else sampling goes on from fresh seeds, with a warning).

What is saved follows RLLaVA/verl's `actor.checkpoint.save_contents` (model, optimizer, extra = LR schedule +
RNG states, hf_model = a `save_pretrained` copy); `trainer.save_model_only=true` means `[model]`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from rllava import distributed as D
from rllava.config import config_to_yaml
from rllava.engine.train.checkpoint import engine_state, load_engine, save_engine, write_state
from rllava.errors import RllavaError, first_failure
from rllava.model.loader import save_model
from rllava.utils.fs import replace_directory, write_text_atomic

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^global_step_(\d+)$")
STATE_FILE = "trainer_state.json"
TRACKER_FILE = "latest_checkpointed_iteration.txt"


def checkpoint_root(cfg, outputs_dir: str) -> str:
    return cfg.trainer.save_checkpoint_path or os.path.join(outputs_dir, "checkpoints")


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    if not os.path.isdir(root):
        return []
    found = [(int(m.group(1)), os.path.join(root, name)) for name in os.listdir(root) if (m := STEP_DIR.match(name))]
    return sorted(s for s in found if os.path.isfile(os.path.join(s[1], STATE_FILE)))


def resolve_checkpoint(path: str, key: str) -> str:
    """`path` itself if it is a checkpoint (a `global_step_N` directory), else the newest checkpoint in it."""
    if os.path.isfile(os.path.join(path, STATE_FILE)):
        return path
    found = list_checkpoints(path)
    if not found:
        raise RllavaError(f"{key}={path}: no checkpoint there (expected a global_step_N directory holding "
                          f"{STATE_FILE}, or a directory of them)")
    return found[-1][1]


def find_resume(cfg, outputs_dir: str) -> str | None:
    """The checkpoint this run resumes from, or None to start fresh (`trainer.resume`, see its comment)."""
    t = cfg.trainer
    if t.resume not in ("auto", "none"):
        return resolve_checkpoint(t.resume, "trainer.resume")
    if t.load_checkpoint_path:
        return resolve_checkpoint(t.load_checkpoint_path, "trainer.load_checkpoint_path")
    found = list_checkpoints(checkpoint_root(cfg, outputs_dir))
    # trainer.overwrite deletes them before the first step; else, not resumed, they stop the run (train.outputs)
    return found[-1][1] if t.resume == "auto" and t.find_last_checkpoint and found and not t.overwrite else None


def read_state(path: str) -> dict:
    """`trainer_state.json` of the checkpoint at `path`; empty, truncated or not ours -> one line."""
    file = os.path.join(path, STATE_FILE)
    try:
        with open(file) as f:
            state = json.load(f)
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RllavaError(f"{file} is unreadable ({type(e).__name__}: {e}): a corrupt checkpoint; delete "
                          f"{path} to resume from an earlier one") from e
    missing = [k for k in ("global_step", "sampler", "world_size", "contents", "engines") if k not in state] \
        if isinstance(state, dict) else ["everything"]
    if missing:
        raise RllavaError(f"{file} lacks {', '.join(missing)}: not an rllava checkpoint, or a corrupt one; delete "
                          f"{path} to resume from an earlier one")
    return state


def engine_parts(contents: list[str]) -> tuple[str, ...]:
    """RLLaVA's content names -> the parts of an engine's state (`extra` carries the LR schedule)."""
    return tuple(p for p, c in (("model", "model"), ("optimizer", "optimizer"), ("scheduler", "extra"))
                 if c in contents)


def rng_state() -> dict:
    """Every RNG's state as tensors and numbers only: `torch.load(weights_only=True)` reads it (data, never code)."""
    version, keys, gauss = random.getstate()
    name, np_keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": version, "keys": torch.tensor(keys, dtype=torch.int64), "gauss": gauss},
             "numpy": {"name": name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py, n = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["keys"].tolist()), py["gauss"]))
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_rng_file(path: str) -> dict:
    """`rng/rank_R.pt` loaded as data only: an object that would run code when unpickled is refused."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001  UnpicklingError for objects, RuntimeError/EOFError when truncated
        raise RllavaError(f"{path}: refused: it holds more than tensors and numbers (weights_only load failed: "
                          f"{str(e).splitlines()[0][:200]}); a checkpoint is data, not code: delete the file to "
                          "resume without its RNG states") from e


def save_checkpoint(run, step: int) -> str:
    """Write `global_step_{step}` (every rank takes part; see the module docstring), then prune to save_limit."""
    wait_for_save()  # one save in flight at most: pruning never races a newer save
    cfg, root = run.cfg, checkpoint_root(run.cfg, run.outputs_dir)
    contents = ["model"] if cfg.trainer.save_model_only else list(cfg.actor.checkpoint.save_contents)
    path = os.path.join(root, f"global_step_{step}")
    background, tmp = cfg.actor.checkpoint.async_save, f"{path}.tmp"
    engines, states = run.held()
    if D.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    D.barrier()
    weights = run.actor.engine.full_state_dict() if "hf_model" in contents else None  # a gather: every rank
    if "extra" in contents:
        os.makedirs(os.path.join(tmp, "rng"), exist_ok=True)
        torch.save(rng_state(), os.path.join(tmp, "rng", f"rank_{D.rank()}.pt"))
        if run.partial is not None:  # rollout.partial_rollout: this rank's paused responses
            torch.save(run.partial.state_dict(), os.path.join(tmp, "rng", f"partial_rank_{D.rank()}.pt"))
        for r, state in enumerate((run.rollout_rng or []) if D.is_main() else []):  # rllava.train.async_rl
            torch.save(state["rng"], os.path.join(tmp, "rng", f"rollout_rank_{r}.pt"))
            if state["partial"] is not None:
                torch.save(state["partial"], os.path.join(tmp, "rng", f"rollout_partial_rank_{r}.pt"))
    if D.is_main():
        save_model(run.model, run.processor, os.path.join(tmp, "actor", "huggingface"), weights,
                   weights=weights is not None, merge_lora=cfg.trainer.hf_merge_lora,
                   pixels=(cfg.data.min_pixels, cfg.data.max_pixels))
        write_text_atomic(os.path.join(tmp, "config.yaml"), config_to_yaml(cfg, ran=True))
        state = {"global_step": step, "sampler": run.sampler.state_dict(), "sampler_name": cfg.data.sampler,
                 "world_size": D.world_size(), "contents": contents, "engines": sorted(engines),
                 "stateful": {k: v.state_dict() for k, v in states.items()}}
        write_text_atomic(os.path.join(tmp, STATE_FILE), json.dumps(state, indent=1))
    del weights
    parts = engine_parts(contents)
    if background and not _writer:  # one writer thread, made once by every rank (a collective); under torchrun its
        # collectives get a gloo group of their own, never interleaved with the training thread's on the default group
        _writer.update(pool=ThreadPoolExecutor(1, thread_name_prefix="rllava-checkpoint"),
                       group=dist.new_group(backend="gloo") if dist.is_initialized() else None)
    pool, group = (_writer["pool"], _writer["group"]) if background else (None, None)
    staged = {name: _stage(engine, parts) for name, engine in engines.items()} if background else None

    def commit() -> None:  # in the background, the engines' state goes last: the rest of `tmp` is written
        for name, engine in engines.items():
            if staged is None:
                save_engine(engine, os.path.join(tmp, name), parts)
            else:
                write_state(staged.pop(name), os.path.join(tmp, name), group)
        D.barrier(group)  # rank 0 renames once every rank has written
        if D.is_main():
            replace_directory(tmp, path)
            write_text_atomic(os.path.join(root, TRACKER_FILE), str(step))
            prune(root, cfg.trainer.save_limit)
        D.barrier(group)

    if background:
        _pending.append(pool.submit(commit))
    else:
        commit()
    return path


_pending: list = []  # the background save in flight (actor.checkpoint.async_save): at most one
_writer: dict = {}  # its thread and process group, made at the first asynchronous save


def _stage(engine, parts) -> dict:
    """The engine's state copied to host memory (DCP's stager), so training can change the original."""
    stager = DefaultStager(StagingOptions(False, False, False, False))
    try:
        return stager.stage(engine_state(engine, parts))
    finally:
        stager.close()


def wait_for_save() -> None:
    """Block until the background save (if any) is written and renamed; its failure stops the run in one line."""
    while _pending:
        try:
            _pending.pop().result()
        except BaseException as e:  # noqa: BLE001  DCP's CheckpointException is a BaseException
            raise RllavaError(f"the background checkpoint save failed ({_cause(e)}); the checkpoints before it are "
                              "whole: the same command resumes from the newest") from e


def prune(root: str, limit: int) -> None:
    """Keep the newest `limit` checkpoints (-1: all); delete what killed saves left behind."""
    for name in os.listdir(root):
        if name.startswith("global_step_") and ".tmp" in name:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    if limit > 0:
        for _, path in list_checkpoints(root)[:-limit]:
            shutil.rmtree(path)


def load_checkpoint(run, path: str) -> int:
    """Restore `run` from the checkpoint at `path` as actor.checkpoint.load_contents says; returns its step."""
    state, wanted = read_state(path), list(run.cfg.actor.checkpoint.load_contents)
    saved = state.get("sampler_name", "epoch")  # checkpoints from before data.sampler: the epoch sampler's
    if saved != run.cfg.data.sampler:
        raise RllavaError(f"{path}: saved by a run with data.sampler={saved}, this run has data.sampler="
                          f"{run.cfg.data.sampler}; resume with data.sampler={saved} (a sampler's state does not "
                          "carry over to another), or start a fresh run")
    engines, states = run.held()
    for name, engine in engines.items():
        if name not in state["engines"]:
            raise RllavaError(f"{path}: holds no {name} state (the run that wrote it had no {name})")
        part = os.path.join(path, name)
        try:  # a file that cannot be read (truncated, corrupt) -> one line naming it
            loaded = load_engine(engine, part, engine_parts(wanted))
        except RllavaError:
            raise
        except BaseException as e:  # noqa: BLE001  DCP wraps a rank's failure in CheckpointException (a BaseException)
            raise RllavaError(f"{part}: the checkpoint cannot be read ({_cause(e)}): a corrupt checkpoint; delete "
                              f"{os.path.dirname(part)} to resume from an earlier one") from e
        if "optimizer" not in loaded and hasattr(engine, "optimizer"):  # the reference ("ref") has none
            log.warning("%s: no %s optimizer state loaded (saved: %s; actor.checkpoint.load_contents=%s): the "
                        "optimizer starts fresh, so the run does not continue exactly", path, name,
                        state["contents"], wanted)
    run.sampler.load_state_dict(state["sampler"])
    for name, obj in states.items():
        if name in state["stateful"]:
            obj.load_state_dict(state["stateful"][name])
    partial = os.path.join(path, "rng", f"partial_rank_{D.rank()}.pt")
    if run.partial is not None and os.path.isfile(partial):
        run.partial.load_state_dict(load_rng_file(partial))
    rng = os.path.join(path, "rng", f"rank_{D.rank()}.pt")
    if "extra" in wanted and state["world_size"] == D.world_size() and os.path.isfile(rng):
        set_rng_state(load_rng_file(rng))
    else:
        log.warning("%s: RNG states not restored (saved by %d ranks, running on %d; saved: %s): sampling goes on "
                    "from the seeds set at start", path, state["world_size"], D.world_size(), state["contents"])
    return int(state["global_step"])


def _cause(e: BaseException) -> str:
    """`Type: first line` of the failure `e` wraps (DCP wraps each rank's); Ctrl-C and exits are raised on."""
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        raise e
    cause = first_failure(e)
    return f"{type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}"
