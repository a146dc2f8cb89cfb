"""The single-device train engine: plain step, CPU optimizer, parameter / optimizer-state offload between phases."""

import pytest
import torch

from rllava.engine.train.single import SingleDeviceEngine

CPU = torch.device("cpu")


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(dtype)


def _engine(model, **kw):
    engine = SingleDeviceEngine(CPU, max_grad_norm=1.0, **kw)
    engine.prepare(model, lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
                   lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)))
    return engine


def _train(engine, steps=3, g=None):
    g = g or torch.Generator().manual_seed(1)
    for _ in range(steps):
        with engine.update_phase():
            x = torch.randn(5, 6, generator=g).to(next(engine.model.parameters()).dtype)
            engine.backward(engine.model(x).float().pow(2).mean())
            engine.optimizer_step()
    return [p.detach().clone() for p in engine.model.parameters()]


@pytest.mark.parametrize("switch", ["cpu_optimizer", "offload_optimizer"])
def test_offloaded_optimizer_steps_exactly_like_the_plain_one(switch):
    plain = _train(_engine(_model()))
    engine = _engine(_model(), **{switch: True})
    offloaded = _train(engine)
    for a, b in zip(plain, offloaded):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    state = [t for s in engine.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert state and all(t.device.type == "cpu" for t in state)
    assert all(p.grad is None for p in engine.model.parameters())  # device grads are freed after the step


def test_cpu_optimizer_keeps_fp32_masters_for_a_bf16_model():
    engine = _engine(_model(torch.bfloat16), cpu_optimizer=True)
    _train(engine, steps=2)
    for p, master in engine.masters.items():
        assert p.dtype == torch.bfloat16 and master.dtype == torch.float32
        torch.testing.assert_close(p, master.to(torch.bfloat16), rtol=0, atol=0)
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in engine.masters.values())


@pytest.mark.parametrize("cpu_optimizer", [False, True])
def test_parameter_offload_between_phases_changes_nothing(cpu_optimizer):
    reference = _train(_engine(_model(), cpu_optimizer=cpu_optimizer), steps=4)
    engine = _engine(_model(), offload_params=True, offload_optimizer=True, cpu_optimizer=cpu_optimizer)
    g = torch.Generator().manual_seed(1)
    _train(engine, steps=2, g=g)
    with engine.rollout_phase(shares_model=True):  # HF generate samples with the training model: stays put
        pass
    with engine.rollout_phase(shares_model=False):
        assert all(p.device == CPU for p in engine.model.parameters())
    for a, b in zip(reference, _train(engine, steps=2, g=g)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_skip_grad_norm_skips_the_update_but_advances_the_schedule():
    engine = _engine(_model(), skip_grad_norm=1e-9)
    before = [p.detach().clone() for p in engine.model.parameters()]
    after = _train(engine, steps=1)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert engine.scheduler.last_epoch == 1
