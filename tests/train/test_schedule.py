"""The LR schedules: the paper's multi-step pretraining schedule and the constant SFT one."""

from __future__ import annotations

import pytest
import torch

from stages.train.loop import make_optimizer, make_scheduler
from stages.train.schedule import lr_factor
from tests.train.conftest import loop_params


def test_multistep_matches_the_paper() -> None:
    total, warm = 1000, 100
    f = [lr_factor(s, total, warm, "multistep") for s in range(total)]
    assert f[0] == pytest.approx(1 / warm) and f[warm - 1] == 1.0  # linear warm-up reaches the peak
    assert f[warm] == 1.0 and f[799] == 1.0
    assert f[800] == pytest.approx(0.316) and f[899] == pytest.approx(0.316)
    assert f[900] == pytest.approx(0.1) and f[999] == pytest.approx(0.1)


def test_constant_after_warmup() -> None:
    assert [lr_factor(s, 10, 2, "constant") for s in range(10)] == [0.5] + [1.0] * 9
    assert lr_factor(0, 10, 0, "constant") == 1.0


def test_scheduler_drives_the_optimizer() -> None:
    p = loop_params(steps=10, warmup_steps=0, schedule="multistep", lr=1e-3)
    opt = make_optimizer(torch.nn.Linear(2, 2), p)
    sched = make_scheduler(opt, p)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1e-3] * 8 + [3.16e-4] + [1e-4])


def test_adamw_settings() -> None:
    p = loop_params(weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95)
    lin = torch.nn.Linear(3, 3)
    opt = make_optimizer(lin, p)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]  # bias (1-D) is not decayed
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    assert opt.param_groups[0]["params"][0] is lin.weight
