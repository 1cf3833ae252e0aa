"""The four RL registries (stages/rl/registry.py, stages/rl/sources/): every declared entry has its implementation,
every reward source's module imports no torch and its scorer builds, an undeclared name is refused, and what a run
needs (stages/rl/needs.py) follows the specs."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from stages.rl import registry
from stages.rl.advantages import ADVANTAGE_ESTIMATORS
from stages.rl.corrections import CORRECTIONS
from stages.rl.losses import POLICY_LOSSES
from stages.rl.needs import check_run, run_needs
from stages.rl.registry import RewardSourceSpec
from stages.rl.sources import REWARD_SOURCES, SourceInputs

from .test_grpo_stage import tiny_params

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("reg", [registry.ALGORITHMS, ADVANTAGE_ESTIMATORS, POLICY_LOSSES, CORRECTIONS],
                         ids=lambda r: r.kind)
def test_every_declared_entry_has_its_implementation(reg: registry.Registry) -> None:
    for name in reg.names():
        impl = reg.get(name)  # imports the implementing module
        assert impl is not None and reg.impls[name] is impl
    assert set(reg.impls) == set(reg.names())  # and nothing is implemented without a spec


def test_an_undeclared_name_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"algorithm 'made_up' has no spec: declare it in stages/rl/registry.py"):
        registry.ALGORITHMS.register("made_up")(lambda *a: None)
    with pytest.raises(ValueError, match=r"policy loss 'cispo' is declared twice"):
        POLICY_LOSSES.declare(POLICY_LOSSES.spec("cispo"))(lambda *a: None)
    with pytest.raises(ValueError, match=r"unknown reward source 'nope'; registered: .*rule"):
        REWARD_SOURCES.spec("nope")


def test_entry_modules_import_no_torch() -> None:
    """The params check reads every entry's declaration (its spec and settings class): the sources' modules, the
    losses, estimators and corrections import no torch until they compute (a build function imports the rest)."""
    code = ("import sys; from stages.rl.sources import REWARD_SOURCES; names = REWARD_SOURCES.names(); "
            "from stages.rl import advantages, corrections, losses; "
            "assert losses.POLICY_LOSSES.names() and advantages.ADVANTAGE_ESTIMATORS.names() and "
            "corrections.CORRECTIONS.names(); "
            "assert 'torch' not in sys.modules, names; print(','.join(names))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    assert {"rule", "outcome_rm", "process_rm", "process_rule"} <= set(out.stdout.strip().split(","))


def test_every_reward_source_builds(project) -> None:
    """Each source's build path resolves; the ones without a model build on the tiny project."""
    from stages.core import paths
    from stages.core.modeling import load_tokenizer
    from stages.rl.loop import build_scorer
    from stages.rl.rewards import RewardSet

    tok = load_tokenizer(paths.SFT_MODEL)
    for name in REWARD_SOURCES.names():
        spec = REWARD_SOURCES.spec(name)
        assert isinstance(spec, RewardSourceSpec) and spec.summary
        if spec.build is not None:
            module, _, attr = spec.build.partition(":")
            assert callable(getattr(importlib.import_module(module), attr)), spec.build
        if not spec.reward_model:
            p = tiny_params(reward__source=name)
            rs = RewardSet.from_params(1.0, 0.0, [], [])
            scorer = build_scorer(name, SourceInputs(p, tok, rs))
            assert callable(getattr(scorer, "rewards", None)), name
            assert (scorer is rs) == (name == "rule")


def test_run_needs_follow_the_specs() -> None:
    n = run_needs(tiny_params())
    assert (n.reference, n.reward_model, n.critic, n.row_fields) == (True, False, False, ())
    assert not run_needs(tiny_params(kl__beta=0.0)).reference
    n = run_needs(tiny_params(reward__source="process_rm"))
    assert n.reward_model and n.scoring_model
    assert run_needs(tiny_params(reward__source="process_rule")).row_fields == ("values",)
    n = run_needs(tiny_params(algorithm="ppo", advantage__estimator="gae",
                              ppo=dict(value_init="reward_model", value_lr=1e-3, gamma=1.0, lam=0.95, value_clip=0.2,
                                       whiten=True)))
    assert n.critic and n.reward_model and not n.scoring_model  # the value model starts from the RM
    assert run_needs(tiny_params(algorithm="online_rft")).reference is False  # no KL in the paradigm's methods
    assert check_run(tiny_params()) is None
