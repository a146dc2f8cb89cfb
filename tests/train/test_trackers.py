"""The outside trackers of rllava.train.tracker_hub (mlflow, swanlab, trackio), offline, each read back from its own
store: a 3-step tiny run that stops after step 3 is logged but before its checkpoint, then resumes from step 2's,
holds every step's metrics exactly once, equal to metrics.jsonl's, and validation's generations in its table; a
tracker that is not installed stops the run before the model loads with one line naming the extra.

The packages are optional extras, in `.[test]` too: a missing one fails here, it is not skipped. mlflow's and
swanlab's cases are slow (`make test-slow`)."""

import glob
import json
import os
import sqlite3
import sys

import pytest

from rllava.train import builders as B
from rllava.train import checkpoint as C
from rllava.train.outputs import keys_for
from rllava.train.pipeline import rlvr
from rllava.train.tracker_hub import metric_name

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROJECT = "trk"


def _args(model, data, out, reward, logger):
    """16 prompts, 4 per step, 2 samples each; validation (2 generations logged) at steps 2 and 3, a checkpoint at 2."""
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", "data.max_samples=16",
            "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2", "data.val_batch_size=16",
            *keys_for(out), f"trainer.logger=[jsonl,{logger}]", f"reward.reward_function={reward}",
            "trainer.val_before_train=false", "trainer.max_steps=3", "trainer.val_freq=2", "trainer.save_freq=2",
            "trainer.val_generations_to_log=2"]


def _jsonl(out: str, name: str) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, name))]


def _expected(out: str) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as {key: [(step, value), ...]} in logging order (time/elapsed_s is jsonl's own)."""
    history = {}
    for row in _jsonl(out, "metrics.jsonl"):
        for key, value in row.items():
            if key not in ("step", "time/elapsed_s"):
                history.setdefault(key, []).append((row["step"], value))
    return history


def _mlflow(out: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])  # active runs only
    assert len(runs) == 1 and runs[0].info.run_name == os.path.basename(out)
    run_id = runs[0].info.run_id
    history = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key),
                                                       key=lambda m: (m.step, m.timestamp))]
               for key in runs[0].data.metrics}
    table = json.load(open(client.download_artifacts(run_id, "val_generations.json", out)))
    rows = [dict(zip(table["columns"], cells)) for cells in table["data"]]
    return history, rows


def _swanlab(out: str):
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    runs = glob.glob(os.path.join(out, "swanlog", "run-*"))
    assert len(runs) == 1  # the stopped process's run was deleted
    reader, history, rows = DataStoreReader(), {}, []
    reader.open(glob.glob(os.path.join(runs[0], "*.swanlab"))[0])
    record = reader.scan()
    while record is not None:
        r = Record()
        r.ParseFromString(record)
        if r.HasField("scalar"):
            history.setdefault(r.scalar.key, []).append((r.scalar.step, r.scalar.value.number))
        if r.HasField("media") and r.media.key == "val/generations":
            for item in r.media.value.items:
                rows += json.load(open(os.path.join(runs[0], "media", "echarts", item.filename)))["rowData"]
        record = reader.scan()
    return {k: sorted(v, key=lambda sv: sv[0]) for k, v in history.items()}, rows


def _trackio(out: str):
    from trackio.sqlite_storage import SQLiteStorage

    db = sqlite3.connect(SQLiteStorage.get_project_db_path(PROJECT))
    logged = db.execute("SELECT run_id, run_name, step, metrics FROM metrics ORDER BY id").fetchall()
    assert len({run_id for run_id, *_ in logged}) == 1 and {name for _, name, *_ in logged} == {os.path.basename(out)}
    history, rows = {}, []
    for _, _, step, metrics in sorted(logged, key=lambda r: r[2]):
        for key, value in json.loads(metrics).items():
            if isinstance(value, dict) and value.get("_type") == "trackio.table":
                rows += value["_value"]
            else:
                history.setdefault(key, []).append((step, value))
    return history, rows


READERS = {"mlflow": _mlflow, "swanlab": _swanlab, "trackio": _trackio}


def _check(name: str, out: str) -> tuple[int, int, int]:
    """The tracker's store equals metrics.jsonl (steps and values) and val_generations.jsonl (its table's rows):
    (steps, metrics, table rows)."""
    history, rows = READERS[name](out)
    expected = _expected(out)
    if name == "mlflow":  # its names: val/pass@2 -> val/pass_at_2
        expected = {metric_name(k): v for k, v in expected.items()}
    assert history == expected
    generations = _jsonl(out, "val_generations.jsonl")
    assert [(r["step"], r["index"], r["response"]) for r in rows] == \
        [(g["step"], g["index"], g["response"]) for g in generations]
    # mlflow writes its table with pandas' JSON: 10 digits after the point
    assert [r["reward"] for r in rows] == pytest.approx([g["reward"] for g in generations], abs=1e-10)
    steps = sorted({s for values in history.values() for s, _ in values})
    return len(steps), len(history), len(rows)


def _case(name: str, slow: bool):
    """`name`'s test case, marked slow where it takes > 20 s on 2 busy cores."""
    return pytest.param(name, marks=[pytest.mark.slow] * slow)


# mlflow ~30 s (its sqlite store's tables are made at the first run: ~12 s), swanlab ~25 s, trackio ~17 s
@pytest.mark.parametrize("name", [_case("mlflow", True), _case("swanlab", True), _case("trackio", False)])
def test_tracker_holds_each_step_once_across_a_resume(name, tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                      monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))  # no saved login: offline
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read when trackio is first imported
    monkeypatch.chdir(REPO)
    for var in ("MLFLOW_TRACKING_URI", "SWANLAB_API_KEY", "SWANLAB_MODE", "SWANLAB_LOG_DIR"):
        monkeypatch.delenv(var, raising=False)
    if name == "trackio":
        from trackio.sqlite_storage import SQLiteStorage

        SQLiteStorage.delete_run(PROJECT, "run")  # the project's database may outlive a test (TRACKIO_DIR)
    out = str(tmp_path / PROJECT / "run")  # keys_for: project_name trk, experiment_name run
    save = C.save_checkpoint

    def stop_before_step_3s_checkpoint(run, step):  # step 3 and its validation are logged, its checkpoint is not
        if step == 3:
            raise KeyboardInterrupt
        return save(run, step)

    monkeypatch.setattr(C, "save_checkpoint", stop_before_step_3s_checkpoint)
    with pytest.raises(SystemExit) as stop:
        rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, name))
    assert stop.value.code == 130
    first = _check(name, out)
    assert first[0] == 3 and first[2] == 4  # steps 1-3; 2 generations at steps 2 and 3
    monkeypatch.setattr(C, "save_checkpoint", save)
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, name))  # resumes from step 2's checkpoint
    assert [r["step"] for r in _jsonl(out, "metrics.jsonl") if "reward/mean" in r] == [1, 2, 3]
    resumed = _check(name, out)
    assert resumed == first  # 3 steps, as many metrics, 4 table rows: nothing twice, nothing missing
    print(f"{name}: {resumed[0]} steps, {resumed[1]} metrics, {resumed[2]} table rows", file=sys.__stdout__)


@pytest.mark.parametrize("name, package", [("mlflow", '"rllava[mlflow]"'), ("swanlab", '"rllava[swanlab]"'),
                                           ("trackio", '"rllava[trackio]"'), ("wandb", "wandb")])
def test_a_tracker_not_installed_stops_before_the_model_loads(package, name, tmp_path, tiny_model_dir, counting_dir,
                                                              distinct_reward, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setitem(sys.modules, name, None)  # not installed: its import fails
    monkeypatch.setattr(B, "build_policy", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as e:
        rlvr.main(_args(tiny_model_dir, counting_dir, str(tmp_path / "run"), distinct_reward,
                             f"console,{name}"))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f'rllava: error: trainer.logger includes {name}, which is not installed: '
                          f'pip install {package}')
