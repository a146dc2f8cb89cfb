"""Records from `data.train_files` / `data.val_files`, as a lazy (memory-mapped) `datasets.Dataset`.

Accepted specs, each optionally with an `@split` suffix:
- a local `.jsonl`, `.json` (a list of objects, or `{"data": [...]}`) or `.parquet` file (one split, `train`);
- a directory written by `Dataset.save_to_disk`, or by `DatasetDict.save_to_disk` (`dir@test`);
- a hub-style dataset directory (`dir/data/train-00000-of-00001.parquet`, ...): `dir@train`;
- a hub name, `hiyouga/math12k@train`, loaded by `datasets.load_dataset` (needs the hub or its cache).
Without `@split`, a source with one split gives it and a source with several is an error listing them; a hub
name defaults to `train`, as in EasyR1. Image columns stay as stored (paths, bytes, or an `Image` feature read
as {"bytes", "path"}): nothing is decoded until `rllava.data.images.load_image` decodes one record's images.
"""

import json
import os
import pickle
from collections.abc import Mapping
from functools import partial

import datasets

from rllava.errors import RllavaError

FILE_TYPES = (".jsonl", ".json", ".parquet")


class DataError(RllavaError):
    """A data file, record or image that cannot be used; the message names it (file, line, record, key)."""


def split_spec(spec: str) -> tuple[str, str | None]:
    """`path@split` -> (path, split). A path that exists as written keeps any `@` in its name."""
    path, sep, split = spec.rpartition("@")
    if os.path.exists(os.path.expanduser(spec)) or not (sep and path and split):
        return os.path.expanduser(spec), None
    return os.path.expanduser(path), split


def check_local(spec: str, name: str) -> None:
    """A local-looking `spec` (a data file's suffix, `./` or `/`, or more than `org/name`) that does not exist: one
    DataError naming it (`name`: `key=spec`). Cheap: a run checks its data paths with it before the model loads."""
    path, _ = split_spec(spec)
    looks_local = path.endswith(FILE_TYPES) or path.startswith((".", "/")) or path.count("/") > 1
    if looks_local and not os.path.exists(path):
        raise DataError(f"{name}: no such file or directory")  # a hub name is `name` or `org/name`


def load_records(spec: str, *, max_samples: int = -1, given=None, key: str | None = None) -> datasets.Dataset:
    """The records named by `spec` (see the module docstring); only the first `max_samples` if >= 0. `given`: records in
    memory instead (`memory_records`; `spec` then only names them). `key`: the config key naming `spec`."""
    if given is None and not spec:
        raise DataError("no data given: set data.train_files (and data.val_files) to a file, directory or hub name")
    path, split = split_spec(spec)
    name = f"{key}={spec}" if key and given is None else spec
    if given is not None:
        ds = memory_records(given, spec)
    elif os.path.isfile(path):
        ds = _pick_split(_load_file(path), split, name)
    elif os.path.isdir(path):  # save_to_disk output, or a hub-style layout (data/<split>-*.parquet, ...)
        saved = any(os.path.exists(os.path.join(path, f)) for f in ("dataset_dict.json", "dataset_info.json"))
        try:
            loaded = datasets.load_from_disk(path) if saved else datasets.load_dataset(path)
        except Exception as e:
            raise DataError(f"{path}: cannot load it as a dataset directory ({_reason(e)}); expected a "
                            "save_to_disk directory or data files such as data/train-00000-of-00001.parquet") from e
        ds = _pick_split(loaded, split, name)
    else:
        check_local(spec, name)
        try:
            ds = datasets.load_dataset(path, split=split or "train")
        except Exception as e:  # offline: ConnectionError; unknown name: DatasetNotFoundError; bad split: ValueError
            raise DataError(f"{name}: not found locally (no such file or directory) and could not be loaded from the "
                            f"Hugging Face hub ({_reason(e)})") from e
    ds = _undecoded_images(ds)
    if max_samples >= 0:
        ds = ds.select(range(min(max_samples, len(ds))))
    if len(ds) == 0:
        raise DataError(f"{name}: no records" + (f" (data.max_samples={max_samples})" if max_samples == 0 else ""))
    return ds


def memory_records(given, name: str) -> datasets.Dataset:
    """Records built in Python (the Python API, `rllava.api.RLVRPipeline`): a `datasets.Dataset` as it is, a
    torch DataLoader's dataset, or any iterable of dicts with a data file's fields, typed as a JSON file's
    records are (`_typed_dataset`); values no JSON file holds (PIL images, bytes) reach the dataset as given."""
    if isinstance(given, datasets.Dataset):
        return given
    if type(given).__name__ == "DataLoader" and hasattr(given, "dataset"):  # batches come from data.train_batch_size
        given = given.dataset
    if isinstance(given, (str, bytes, Mapping)) or not hasattr(given, "__iter__") and not hasattr(given, "__getitem__"):
        raise DataError(f"{name}: expected records (a list or iterable of dicts, a datasets.Dataset or a "
                        f"PromptDataset), got a {type(given).__name__}")
    records = []
    for i, record in enumerate(given):
        if not isinstance(record, Mapping):
            raise DataError(f"{name}: item {i} is a {type(record).__name__}, expected a dict (a record with the "
                            "fields data.prompt_key, data.answer_key, ...)")
        records.append(dict(record))
    return _typed_dataset(name, lambda: iter(records), in_memory=True)


def _undecoded_images(ds: datasets.Dataset) -> datasets.Dataset:
    """Image-feature columns (parquet, save_to_disk, hub sets) read as {"bytes", "path"} dicts, not PIL images:
    `load_image` then decodes them with rllava's rules (a large JPEG at a reduced scale, a decompression bomb
    as one line naming the record), and reading a record to count its images decodes nothing."""
    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Image) and feature.decode:
            ds = ds.cast_column(name, datasets.Image(decode=False))
        elif isinstance(getattr(feature, "feature", None), datasets.Image) and feature.feature.decode:
            ds = ds.cast_column(name, type(feature)(datasets.Image(decode=False)))
    return ds


def check_keys(ds: datasets.Dataset, spec: str, required: list[str]) -> None:
    """Every `required` field is a column, or one error naming the missing ones and the columns there are."""
    missing = [k for k in required if k not in ds.column_names]
    if missing:
        raise DataError(f"{spec}: records have no field {', '.join(map(repr, missing))} (fields: "
                        f"{', '.join(ds.column_names)}); set data.prompt_key / data.answer_key / data.image_key")


def check_values(ds: datasets.Dataset, spec: str, keys: dict[str, str]) -> None:
    """Every record has a value (not missing, not null) in each field of `keys` ({config key: field}), else one error
    naming the first record without one and its fields (not scoring an answer against None, nor sending "None")."""
    table = ds.with_format("arrow")  # whole columns without decoding a value (select()'s indices respected)
    for config_key, name in keys.items():
        nulls = table[name].is_null().to_pylist()
        if True in nulls:
            i = nulls.index(True)
            fields = [k for k, v in ds[i].items() if v is not None]
            raise DataError(f"{spec} record {i} has no {name!r} ({config_key}; its fields: {', '.join(fields)}): "
                            "every record needs one")


def base_dir(spec: str, image_dir: str | None = None) -> str | None:
    """The directory relative image paths resolve against: `image_dir` (data.train_image_dir / data.val_image_dir) when
    given, else the data file's folder or the dataset directory; None for a hub dataset (the working directory)."""
    if image_dir:
        return os.path.abspath(os.path.expanduser(image_dir))
    path, _ = split_spec(spec)
    if os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return os.path.abspath(path)
    return None


def _load_file(path: str) -> datasets.Dataset:
    if path.endswith(".jsonl"):
        return _typed_dataset(path, lambda: (record for _, record in json_lines(path)))
    if path.endswith(".json"):  # parsed here for the shape and clear errors, then typed as a memory-mapped table
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from e
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise DataError(f'{path}: expected a list of objects or {{"data": [...]}}, got a {type(data).__name__}')
        for i, record in enumerate(data):
            if not isinstance(record, dict):
                raise DataError(f"{path}: item {i} is a {type(record).__name__}, expected a JSON object")
        return _typed_dataset(path, lambda: iter(data))
    if path.endswith(".parquet"):
        try:
            return datasets.Dataset.from_parquet(path)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
            raise DataError(f"{path}: cannot read it as parquet ({_reason(e)})") from e
    raise DataError(f"{path}: unsupported file type {os.path.splitext(path)[1]!r}; use .jsonl, .json, "
                    ".parquet, a save_to_disk directory or a hub-style dataset directory")


def json_lines(path: str):
    """(line number, record) for every non-blank line; the first line that is not one JSON object is an error
    naming it (datasets' own reader says only "an error occurred")."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} line {n}: not valid JSON ({e.msg} at column {e.colno})") from e
            if not isinstance(record, dict):
                raise DataError(f"{path} line {n}: expected a JSON object, got {type(record).__name__}")
            yield n, record


# ---- JSON records keep their types ----
# `datasets`/pyarrow give a column one type: a JSON column mixing 3 and 3.5 reads back 3.0, one mixing "007" and 3
# reads back 7, and objects with different keys gain each other's keys as None. So a column whose values are all
# strings, all bools, all ints (int64) or all floats keeps its arrow type, and any other (lists, objects, mixed
# types) is stored as JSON text, decoded when read (`with_encoded_columns`): every value reaches the dataset, and
# the reward, exactly as written. Records given in memory keep such columns pickled (PIL images, bytes, tuples come
# back as given). Parquet and save_to_disk data carry their own schema: their values come back as stored.

_NATIVE = {str: "string", bool: "bool", int: "int64", float: "float64"}


def _kind(value) -> str:
    return "json" if type(value) is int and not -2**63 <= value < 2**63 else _NATIVE.get(type(value), "json")


def _typed_dataset(path: str, records, in_memory: bool = False) -> datasets.Dataset:
    """Records from `records()` (called twice: to type each column, then to write) as a memory-mapped Dataset whose
    values read back as written (see above); `in_memory`: a table in memory (no cache file; `path` names it)."""
    kinds: dict[str, set[str]] = {}
    count = 0
    for count, record in enumerate(records(), 1):
        for key, value in record.items():
            kinds.setdefault(key, set()).update([] if value is None else [_kind(value)])
    if count == 0:
        raise DataError(f"{path}: no records")
    native = {k: next(iter(v)) for k, v in kinds.items() if len(v) == 1 and "json" not in v}
    encoded = [k for k in kinds if k not in native]
    encode, stored = (pickle.dumps, "binary") if in_memory else (json.dumps, "string")
    features = datasets.Features({k: datasets.Value(native.get(k, stored)) for k in kinds})

    def rows(path=None, stamp=None):  # path and stamp (size, mtime) make the cache key: an edited file is read again
        for record in records():
            yield {k: (encode(record[k]) if k in encoded and record.get(k) is not None else record.get(k))
                   for k in kinds}

    if in_memory:
        try:
            return with_encoded_columns(datasets.Dataset.from_list(list(rows()), features=features), encoded, True)
        except Exception as e:  # a value pickle or arrow cannot hold
            raise DataError(f"{path}: cannot hold the records as a table ({_reason(e)})") from e
    stat = os.stat(path)
    try:
        ds = datasets.Dataset.from_generator(rows, features=features, gen_kwargs={
            "path": os.path.abspath(path), "stamp": (stat.st_size, stat.st_mtime_ns)})
    except Exception as e:
        raise DataError(f"{path}: cannot load it as a table ({_reason(e)})") from e
    return with_encoded_columns(ds, encoded)


def with_encoded_columns(ds: datasets.Dataset, columns: list[str], pickled: bool = False) -> datasets.Dataset:
    """`ds` reading its JSON-text (or `pickled`) `columns` back as their values (a format transform `select` keeps)."""
    if not columns:
        return ds
    ds.set_transform(partial(_decode_columns, columns, pickled))  # datasets fingerprints it: no closure (unhashable)
    return ds


def _decode_columns(columns: list[str], pickled: bool, batch: dict) -> dict:
    decode = pickle.loads if pickled else json.loads
    return {k: ([None if v is None else decode(v) for v in vs] if k in columns else vs) for k, vs in batch.items()}


def _pick_split(loaded, split: str | None, spec: str) -> datasets.Dataset:
    if isinstance(loaded, datasets.DatasetDict):
        names = ", ".join(loaded)
        if split is None:
            if len(loaded) == 1:
                return next(iter(loaded.values()))
            raise DataError(f"{spec} has splits {names}: choose one with {spec}@<split>")
        if split not in loaded:
            raise DataError(f"{spec}: no split {split!r} (splits: {names})")
        return loaded[split]
    own = str(loaded.split) if loaded.split else "train"
    if split is not None and split != own:
        raise DataError(f"{spec}: a single-split source (split {own!r}) has no split {split!r}; drop '@{split}'")
    return loaded


def _reason(e: Exception) -> str:
    """The first line of an exception (and of its cause, which `datasets` often wraps), for a one-line error."""
    cause = e.__cause__ if e.__cause__ is not None and str(e).startswith("An error occurred") else e
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__
