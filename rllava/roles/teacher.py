"""The Teacher of on-policy distillation (`algorithm.distill`, `rllava.algorithms.distill`): frozen models that score
the student's own samples, one per route. Each is a `rllava.roles.reference.Reference` (its micro-batching, log-prob
pass and hidden states for the exact KL, FSDP2-sharded like the policy under torchrun) or, for the sampled losses, a
vLLM / SGLang engine's log-probs of the sampled tokens (`EngineTeacher`). With `algorithm.distill.teachers` each row
goes to the teacher its record's `route_field` names (verl's mixed text / VL teachers), else to `teacher_path`. Only
the trained tokens (loss_mask: the model's turns, never an agent's observations) are scored.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rllava import distributed as D
from rllava.data.protocol import Batch, Sample, Segment, Trajectory, collate
from rllava.errors import RllavaError
from rllava.roles.reference import Reference, _zero3
from rllava.roles.rollout import continuation_request

DEFAULT = ""  # the route of algorithm.distill.teacher_path


@dataclass
class EngineTeacher:
    """A vLLM / SGLang teacher (`algorithm.distill.engine`): log q(x_t | x_<t) of each sampled token from the
    engine's prompt log-probs (`score`), at temperature 1 (a start-up check holds the rollout there)."""

    engine: object
    processor: object

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        scores = self.engine.score([continuation_request(self.processor, t) for t in batch.trajectories])
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for i, (lp, t) in enumerate(zip(scores, batch.trajectories)):
            length = int(batch.attention_mask[i].sum())
            if len(lp) != length:  # the engine expanded the images to another number of tokens
                raise RllavaError(f"algorithm.distill.engine: the teacher engine scored {len(lp)} tokens of "
                                  f"{t.sample.where} where the student's processor made {length}: the teacher needs "
                                  "the student's image processor (same patch and merge sizes)")
            out[i, :length] = torch.tensor(lp, dtype=torch.float32)
        return out * batch.loss_mask


class Teachers:
    """Route -> teacher (a `Reference` over the teacher's model, or an `EngineTeacher`); `route_field` picks a row's."""

    def __init__(self, by_route: dict[str, Reference | EngineTeacher], route_field: str | None = None,
                 device: torch.device | None = None, offload: bool = False):
        self.by_route, self.route_field = by_route, route_field
        self.device, self.offload = device, offload  # offload: plain models wait in host memory between passes

    def route(self, batch: Batch, rows: list[int] | None = None) -> dict[str, list[int]]:
        """Teacher route -> its rows of `batch` (all rows, or `rows`), in a fixed order of routes."""
        out: dict[str, list[int]] = {}
        for i in range(len(batch)) if rows is None else rows:
            sample = batch.trajectories[i].sample
            key = str(sample.extra.get(self.route_field, "")) if self.route_field else DEFAULT
            key = key if key in self.by_route else DEFAULT
            if key not in self.by_route:
                raise RllavaError(f"{sample.where}: its {self.route_field}={sample.extra.get(self.route_field)!r} "
                                  f"has no teacher in algorithm.distill.teachers ({', '.join(sorted(self.by_route))}) "
                                  "and algorithm.distill.teacher_path is not set")
            teacher = self.by_route[key]
            if isinstance(teacher, Reference) and (sample.images or sample.videos) and \
                    getattr(teacher.model.config, "image_token_id", None) is None:
                raise RllavaError(f"{sample.where} has images or videos, and its teacher ({key or 'teacher_path'}) is "
                                  "a text-only model: route it to a VLM teacher")
            out.setdefault(key, []).append(i)
        return dict(sorted(out.items()))

    @contextmanager
    def resident(self):
        """The teachers' weights on the device inside the block (with algorithm.distill.offload: in host memory
        outside it; FSDP2-sharded teachers offload through FSDP2's own CPU offload instead)."""
        models = [t.model for t in self.by_route.values() if isinstance(t, Reference) and self.offload
                  and not _sharded(t.model)]
        for m in models:
            m.to(self.device)
        try:
            yield
        finally:
            for m in models:
                m.to("cpu")

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """log q(x_t | x_<t) [B, T] at every trained position, each row from its own teacher. A teacher's pass is
        collective (ranks that went their own way would hang, or on gloo crash), so every rank runs every route any
        rank's rows hit, in one order, a rank without rows scoring `_stand_in()` (see `rllava.algorithms.distill`)."""
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        routes, keys = self.route(batch), sorted(self.by_route)
        hit = D.all_sum([len(routes.get(k, [])) for k in keys])  # routes no rank hit: no pass at all
        with self.resident():
            for key in [k for k, n in zip(keys, hit) if n]:
                rows = routes.get(key, [])
                part = self.by_route[key].compute_logprobs(batch.select(rows) if rows else _stand_in())
                out[rows, :part.shape[1]] = part[:len(rows)]
        return out

    def hidden(self, micro: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch's teacher's (hidden states at its trained positions, LM head weight), as Reference.hidden."""
        routes = list(self.route(micro))
        if len(routes) != 1:
            raise RllavaError(f"a micro-batch spans teachers {routes}: Teachers.route splits the rows first")
        teacher = self.by_route[routes[0]]
        if not isinstance(teacher, Reference):
            raise RllavaError("algorithm.distill.loss=full needs the teacher in the trainer "
                              "(algorithm.distill.engine=hf)")
        return teacher.hidden(micro)


def _stand_in() -> Batch:
    """One 2-token text row (id 0, the second token trained): a pass that any teacher, text-only or VLM, runs at
    almost no cost, with the code path of a real row (a forward of zero rows is not one the model code supports)."""
    return collate([Trajectory(Sample(-1, [], [], None), -1, [Segment([0], False), Segment([0], True)], {})], 0)


def _sharded(model: torch.nn.Module) -> bool:
    """FSDP2's parameters are DTensors; DeepSpeed ZeRO-3 partitions them in place: both offload their own."""
    params = list(model.parameters())
    return any(hasattr(p, "device_mesh") for p in params) or _zero3(params)


def tokenizer_mismatch(student, teacher, student_path: str, teacher_path: str, key: str) -> str | None:
    """Why `teacher`'s tokenizer cannot score the student's ids (each token needs the same id in both), or None."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if a == b:
        return None
    diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[0][0]
    return (f"{key}={teacher_path}: its tokenizer ({type(teacher).__name__}, {len(b)} tokens) differs from the "
            f"student's, actor.model.model_path={student_path} ({type(student).__name__}, {len(a)} tokens): token "
            f"{diff!r} is {a.get(diff, 'absent')} in the student's and {b.get(diff, 'absent')} in the teacher's. The "
            "teacher scores the student's token ids, so both need one vocabulary (e.g. models of one family)")


def layout_mismatch(student_config, teacher_config, teacher_path: str, key: str) -> str | None:
    """Why a VLM teacher would not see the student's pixels as the student does (another image placeholder id, patch
    or merge size: the image tokens of the student's sequence would not match its features), or None."""
    differ = [k for k in ("image_token_id", "video_token_id") if None not in (
        getattr(student_config, k, None), getattr(teacher_config, k, None))
        and getattr(student_config, k) != getattr(teacher_config, k)]
    sv, tv = getattr(student_config, "vision_config", None), getattr(teacher_config, "vision_config", None)
    if sv is not None and tv is not None:
        differ += [f"vision_config.{k}" for k in ("patch_size", "spatial_merge_size", "temporal_patch_size")
                   if getattr(sv, k, None) != getattr(tv, k, None)]
    if not differ:
        return None
    return (f"{key}={teacher_path}: the teacher lays images out differently from the student ({', '.join(differ)} "
            "differ), so it cannot read the student's image tokens; use a teacher of the student's VLM family")
