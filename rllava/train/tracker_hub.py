"""The outside experiment trackers `trainer.logger` can name beside console / jsonl / tensorboard / wandb: mlflow,
swanlab and trackio (RLLaVA's `trainer.logger` takes the first two, verl and TRL log to trackio). Each is an optional
extra (`pip install "rllava[mlflow]"`), imported only when named; a missing one stops the run before the model loads.
All three work offline, their stores local unless their own environment variables point elsewhere:

- mlflow: the store `MLFLOW_TRACKING_URI` names, else `sqlite:///<run folder>/mlflow.db` (artifacts in
  `<run folder>/mlartifacts`); experiment = trainer.project_name, run = trainer.experiment_name, the config as
  flattened params. Metric names: `@` becomes `_at_` and any other character mlflow refuses `_`. Telemetry off
  (MLFLOW_DISABLE_TELEMETRY=true unless set).
- swanlab: offline (`<run folder>/swanlog/run-*`, `swanlab sync` uploads it later) unless SWANLAB_API_KEY is set or
  `swanlab login` saved a key; SWANLAB_MODE and SWANLAB_LOG_DIR override.
- trackio: its local database, `<TRACKIO_DIR>/<project>.db` (default ~/.cache/huggingface/trackio; `trackio show`
  reads it), no Space unless TRACKIO_SPACE_ID / trackio's own settings say so.

Validation generations (trainer.val_generations_to_log) go to each one's table: mlflow `val_generations.json` (one
table, a row per generation, appended), swanlab an echarts Table and trackio a Table at key `val/generations` per
validation. Resuming from step s starts a new run on each tracker holding metrics.jsonl's and val_generations.jsonl's
rows up to s, logged again, and deletes the previous run (mlflow: its `deleted` state; swanlab: its local folder;
trackio: its rows): each step is there once, as in metrics.jsonl. `<run folder>/trackers.json` keeps each run's id."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import time

from rllava.errors import RllavaError

# What the backends write in the run's folder by default (a fresh start deletes them with the rest)
HUB_FILES = ("mlflow.db", "mlartifacts", "swanlog", "trackers.json")


def require(loggers: list[str]) -> dict:
    """Each named outside tracker's package, imported: {name: module} (this module's backends; wandb is checked
    too, rllava.train.tracker starts it). One not installed: a one-line error naming what to install."""
    modules = {}
    for name in loggers:
        if name not in BACKENDS and name != "wandb":
            continue
        if name == "mlflow":
            os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            package = "wandb" if name == "wandb" else f'"rllava[{name}]"'
            raise RllavaError(f"trainer.logger includes {name}, which is not installed: pip install {package} "
                              f"({e})") from e
        if name in BACKENDS:
            modules[name] = module
    return modules


def start(loggers: list[str], project: str, experiment: str, config: dict, outputs_dir: str) -> list:
    """A new run on each named outside tracker (in `loggers`' order)."""
    return [BACKENDS[name](module, project, experiment, config, outputs_dir)
            for name, module in require([n for n in loggers if n in BACKENDS]).items()]


def replay(backends: list, outputs_dir: str) -> None:
    """After a rewind: log metrics.jsonl's and val_generations.jsonl's rows (those up to the checkpoint's step) into
    each new run, then delete the run the stopped process wrote."""
    metrics = _read_rows(os.path.join(outputs_dir, "metrics.jsonl"))
    generations = _read_rows(os.path.join(outputs_dir, "val_generations.jsonl"))
    for backend in backends:
        for row in metrics:
            backend.log({k: v for k, v in row.items() if k not in ("step", "time/elapsed_s")}, row["step"])
        for step in sorted({row["step"] for row in generations}):
            backend.table([{k: v for k, v in r.items() if k != "step"} for r in generations if r["step"] == step],
                          step)
        backend.drop_previous()


def table_columns(rows: list[dict], step: int) -> tuple[list[str], list[list]]:
    """Generations as one table: `step`, then each field in order of first appearance (a generation without it: None);
    a field that is not a string or a number (images, reward_parts, turns) as its JSON text."""
    columns = ["step"]
    for row in rows:
        columns += [k for k in row if k not in columns]
    cells = [[step] + [_cell(row.get(k)) for k in columns[1:]] for row in rows]
    return columns, cells


def _cell(value):
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, default=str)


def _read_rows(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _swap_id(outputs_dir: str, name: str, new: str) -> str | None:
    """Record `new` as `name`'s run in <outputs_dir>/trackers.json; the one recorded before (None: none)."""
    path = os.path.join(outputs_dir, "trackers.json")
    ids = {}
    if os.path.isfile(path):
        with open(path) as f:
            ids = json.load(f)
    previous, ids[name] = ids.get(name), new
    with open(path, "w") as f:
        json.dump(ids, f)
    return previous


def _flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}: mlflow's params are flat strings."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


class MLflow:
    def __init__(self, mlflow, project: str, experiment: str, config: dict, outputs_dir: str):
        from mlflow.entities import Metric, Param

        self.Metric = Metric
        local = os.path.abspath(outputs_dir)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{local}/mlflow.db"
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(project)
        artifacts = None if os.environ.get("MLFLOW_TRACKING_URI") else os.path.join(local, "mlartifacts")
        experiment_id = found.experiment_id if found else self.client.create_experiment(project, artifacts)
        self.run_id = self.client.create_run(experiment_id, run_name=experiment).info.run_id
        self.previous = _swap_id(outputs_dir, "mlflow", self.run_id)
        params = [Param(k, v[:6000]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # mlflow takes 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.Metric(metric_name(k), float(v), now, step)
                                                    for k, v in metrics.items()])

    def table(self, rows: list[dict], step: int) -> None:
        columns, cells = table_columns(rows, step)
        self.client.log_table(self.run_id, {c: [row[i] for row in cells] for i, c in enumerate(columns)},
                              artifact_file="val_generations.json")

    def drop_previous(self) -> None:
        if self.previous is not None:
            self.client.delete_run(self.previous)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def metric_name(key: str) -> str:
    """The name mlflow stores `key` under: letters, digits and `_-. :/` only (val/pass@4 -> val/pass_at_4)."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


class SwanLab:
    def __init__(self, swanlab, project: str, experiment: str, config: dict, outputs_dir: str):
        self.swanlab = swanlab
        root = os.path.expanduser(os.environ.get("SWANLAB_ROOT") or os.environ.get("SWANLAB_SAVE_DIR") or "~/.swanlab")
        saved = [os.path.join(root, ".netrc"), os.path.join(".swanlab", ".netrc")]  # `swanlab login`: user, project
        logged_in = os.environ.get("SWANLAB_API_KEY") or any(os.path.isfile(p) for p in saved)
        mode = os.environ.get("SWANLAB_MODE") or ("online" if logged_in else "offline")
        log_dir = os.environ.get("SWANLAB_LOG_DIR") or os.path.join(outputs_dir, "swanlog")
        self.run = swanlab.init(project=project, experiment_name=experiment, config=config, log_dir=log_dir,
                                mode=mode, reinit=True)
        self.previous = _swap_id(outputs_dir, "swanlab", str(self.run.dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def table(self, rows: list[dict], step: int) -> None:
        columns, cells = table_columns(rows, step)
        table = self.swanlab.echarts.Table()
        table.add(headers=columns, rows=cells)
        self.run.log({"val/generations": table}, step=step)

    def drop_previous(self) -> None:
        if self.previous is not None and os.path.isdir(self.previous):
            shutil.rmtree(self.previous)

    def close(self) -> None:
        self.run.finish()


class Trackio:
    def __init__(self, trackio, project: str, experiment: str, config: dict, outputs_dir: str):
        self.trackio, self.project, self.name = trackio, project, experiment
        self.run = trackio.init(project=project, name=experiment, config=config, resume="never")
        self.previous = _swap_id(outputs_dir, "trackio", self.run.id)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def table(self, rows: list[dict], step: int) -> None:
        columns, cells = table_columns(rows, step)
        self.run.log({"val/generations": self.trackio.Table(columns=columns, data=cells)}, step=step)

    def drop_previous(self) -> None:
        if self.previous is not None:
            from trackio.api import Run

            Run(self.project, self.name, run_id=self.previous).delete()

    def close(self) -> None:
        self.run.finish()


# trainer.logger name -> its backend (the package of the same name; pyproject's extra of the same name installs it)
BACKENDS = {"mlflow": MLflow, "swanlab": SwanLab, "trackio": Trackio}
