"""build_policy's memory switches (gradient checkpointing changes memory, never the gradients), and the export's
standard processor (plain transformers loads it; rllava loads it without torchvision)."""

import os

import pytest
import torch
from omegaconf import OmegaConf

from rllava.config.schema import ModelConfig
from rllava.model.loader import build_policy

IDS = torch.tensor([[1, 20, 30, 40, 50, 60, 70, 80], [1, 21, 31, 41, 51, 61, 71, 81]])


def _grads(model_dir, **kw):
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                              dict(model_path=model_dir, torch_dtype="float32", **kw)))
    model, _ = build_policy(cfg, torch.device("cpu"))
    model.train()
    model(input_ids=IDS, labels=IDS).loss.backward()
    return model, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("offload", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir, offload):
    plain_model, plain = _grads(tiny_model_dir)
    ckpt_model, ckpt = _grads(tiny_model_dir, enable_gradient_checkpointing=True, enable_activation_offload=offload)
    assert ckpt_model.is_activation_checkpointing and not plain_model.is_activation_checkpointing
    assert plain.keys() == ckpt.keys() and len(plain) > 10
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)


# ---- the export names the model's standard processor ----

FAKE_TORCHVISION = '''"""A stand-in torchvision: importable (any submodule), version-stamped, every name a
placeholder. transformers then picks its torchvision-backed classes, as where torchvision is installed, without
running them on pixels."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.99.0"


class _Anything:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        return _Anything(f"{self._name}()")

    def __getitem__(self, key):
        return _Anything(f"{self._name}[]")

    def __hash__(self):
        return hash(self._name)

    def __eq__(self, other):
        return isinstance(other, _Anything) and other._name == self._name


def _module_getattr(prefix):
    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{prefix}.{name}")
    return getattr_


__getattr__ = _module_getattr("torchvision")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.startswith("torchvision.") else None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__, module.__getattr__ = [], _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
'''

# Run with the fake torchvision first on the path: what plain transformers loads from an export.
LOAD_WITH_TORCHVISION = '''
import json, sys
from transformers import AutoModelForImageTextToText, AutoProcessor
from transformers.utils import is_torchvision_available
assert is_torchvision_available()
p = AutoProcessor.from_pretrained(sys.argv[1])
model = AutoModelForImageTextToText.from_pretrained(sys.argv[1])
messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
print(json.dumps({"processor": type(p).__name__, "image": type(p.image_processor).__name__,
                  "video": type(p.video_processor).__name__, "model": type(model).__name__,
                  "video_patch": [p.video_processor.patch_size, p.video_processor.temporal_patch_size,
                                  p.video_processor.merge_size],
                  "text": p.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                  "ids": p.tokenizer("How many?")["input_ids"]}))
'''


@pytest.fixture(scope="module")
def fake_torchvision(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake_torchvision")
    (root / "torchvision").mkdir()
    (root / "torchvision" / "__init__.py").write_text(FAKE_TORCHVISION)
    (root / "torchvision-0.99.0.dist-info").mkdir()
    (root / "torchvision-0.99.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\n"
                                                                    "Version: 0.99.0\n")
    return str(root)


STANDARD = {"qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
            "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor")}


@pytest.mark.parametrize("arch", list(STANDARD))
def test_export_names_the_standard_processor(tmp_path, arch, fake_torchvision):
    """`save_model` (final/, every hf_model save, rllava.commands.export) writes the model's standard processor class:
    plain transformers with torchvision loads that processor (not a bare tokenizer) and the model; rllava
    without torchvision loads it as its image-only processor, encoding exactly as before the save."""
    import json
    import subprocess
    import sys

    from PIL import Image

    from rllava.data.dataset import encode_prompt
    from rllava.data.protocol import Sample
    from rllava.model.loader import load_model, save_model
    from rllava.model.processor import IMAGE_ONLY_CLASSES, load_processor
    from rllava.model.tiny import build_tiny

    src = build_tiny(arch, str(tmp_path / "src"), size="small")
    processor = load_processor(src)
    out = save_model(load_model(src, dtype=torch.float32), processor, str(tmp_path / "final"))
    processor_class, video_class = STANDARD[arch]
    saved = {name: json.load(open(f"{out}/{name}"))
             for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")}
    assert {name: c["processor_class"] for name, c in saved.items()} == dict.fromkeys(saved, processor_class)
    assert saved["processor_config.json"]["video_processor"]["video_processor_type"] == video_class
    assert saved["preprocessor_config.json"]["patch_size"] == processor.image_processor.patch_size

    import importlib.util
    assert importlib.util.find_spec("torchvision") is None  # this machine: rllava's path
    reloaded = load_processor(out)
    assert type(reloaded).__name__ in IMAGE_ONLY_CLASSES
    content = [{"type": "image"}, {"type": "text", "text": "Hi"}]
    sample = Sample(index=0, messages=[{"role": "user", "content": content}],
                    images=[Image.new("RGB", (64, 64), (200, 10, 10))], ground_truth="1")
    ids, mm = encode_prompt(reloaded, sample)
    ids0, mm0 = encode_prompt(processor, sample)
    assert ids == ids0 and torch.equal(mm["pixel_values"], mm0["pixel_values"])
    resaved = load_processor(save_model(load_model(out, dtype=torch.float32), reloaded, str(tmp_path / "again")))
    assert resaved.video_processor_dict() == saved["processor_config.json"]["video_processor"]  # kept, not rebuilt

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([fake_torchvision, os.getcwd()])}
    run = subprocess.run([sys.executable, "-c", LOAD_WITH_TORCHVISION, out], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    image = processor.image_processor
    assert got["processor"] == processor_class and got["video"] == video_class
    assert got["image"].endswith("ImageProcessor") and got["model"].endswith("ForConditionalGeneration")
    assert got["video_patch"] == [image.patch_size, image.temporal_patch_size, image.merge_size]
    assert got["text"] == processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    assert got["ids"] == processor.tokenizer("How many?")["input_ids"]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3_vl"])
def test_the_export_keeps_the_trainings_pixel_bounds(tmp_path, arch):
    """final/ (and a checkpoint's hf_model) resizes images as training did: data.min_pixels / max_pixels are the
    saved image processor's bounds, so inference on the export sees images of the trained sizes; the live
    processor is untouched."""
    from PIL import Image

    from rllava.model.loader import load_model, save_model
    from rllava.model.processor import load_processor
    from rllava.model.tiny import build_tiny

    src = build_tiny(arch, str(tmp_path / "src"), size="small")
    processor = load_processor(src)
    before = dict(processor.image_processor.size)
    out = save_model(load_model(src, dtype=torch.float32), processor, str(tmp_path / "final"), pixels=(3136, 12544))
    reloaded = load_processor(out)
    assert (reloaded.image_processor.size["shortest_edge"], reloaded.image_processor.size["longest_edge"]) == \
        (3136, 12544) and dict(processor.image_processor.size) == before
    pixels = reloaded.image_processor(images=[Image.new("RGB", (640, 480))], return_tensors="pt")["image_grid_thw"]
    patch = reloaded.image_processor.patch_size
    assert int(pixels.prod()) * patch * patch <= 12544  # a 640 x 480 image comes out within the trained bound


@pytest.fixture
def no_network(monkeypatch):
    """The hub out of reach (no HF_HUB_OFFLINE: no connection can be made), and any hub request a test failure.
    huggingface_hub's client (utils/_http.py `http_backoff`: max_retries=5, base_wait_time=1, max_wait_time=8)
    would otherwise retry each file 1 + 2 + 4 + 8 + 8 s, printing a line each time, before it fails."""
    import socket

    import huggingface_hub.constants
    import huggingface_hub.utils._http

    from rllava.model import hub

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    def asked_the_hub(*args, **kwargs):
        raise AssertionError("a request went to the hub")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(huggingface_hub.utils._http, "_http_backoff_base", asked_the_hub)
    for k in hub.PROXIES:
        monkeypatch.delenv(k, raising=False)
    hub.hub_reachable.cache_clear()
    yield
    hub.hub_reachable.cache_clear()


def test_hub_looking_paths_fail_at_once_and_a_cached_hub_id_loads_offline(tmp_path, monkeypatch, tiny_model_dir,
                                                                          no_network):
    """Issue 62 item 7: `outputs/nomodel` (an `outputs/` folder here) is a missing local directory, and a hub id not
    in the cache while the hub is out of reach cannot be downloaded: both one line, with no request to the hub. A
    hub id in the local hub cache loads from it, model and processor, without the hub."""
    import shutil

    import huggingface_hub.constants

    from rllava.model.loader import ModelLoadError, load_model
    from rllava.model.processor import load_processor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    with pytest.raises(ModelLoadError, match=r"^actor.model.model_path='outputs/nomodel': no such local directory"):
        load_model("outputs/nomodel", dtype=torch.float32)
    with pytest.raises(ModelLoadError, match=r"^actor.model.model_path='Qwen/Qwen2.5-VL-3B-Instruct': no such local "
                                             r"directory, and the hub could not be reached to download it"):
        load_model("Qwen/Qwen2.5-VL-3B-Instruct", dtype=torch.float32)
    with pytest.raises(OSError, match="not in the local hub cache, and the hub cannot be reached"):
        load_processor("Qwen/Qwen2.5-VL-3B-Instruct")
    repo = tmp_path / "hub" / "models--rllava-tests--tiny"  # the hub cache's layout: refs/main -> snapshots/<rev>
    shutil.copytree(tiny_model_dir, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    model = load_model("rllava-tests/tiny", dtype=torch.float32)
    assert model.config.model_type == "qwen2_vl" and load_processor("rllava-tests/tiny").tokenizer is not None
