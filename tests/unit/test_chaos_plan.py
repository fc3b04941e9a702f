"""The chaos test's schedule is the seed's: the same seed draws the same schedule, and every schedule has what the
test claims (at least 50 SIGKILLs, at least 10 machines, deletions mid-create, libvirtd and kube-apiserver dying
while a burst of creates is in flight)."""

from __future__ import annotations

import pytest

from devenv import chaos_plan
from devenv.chaos_plan import Plan

pytestmark = pytest.mark.unit


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    assert Plan.draw(1234) == Plan.draw(1234)
    assert Plan.draw(1234) != Plan.draw(1235)


def test_the_seed_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(chaos_plan.SEED_ENV, "42")
    assert chaos_plan.chaos_seed() == 42


@pytest.mark.parametrize("seed", range(20))
def test_every_schedule_has_what_the_test_claims(seed: int) -> None:
    plan = Plan.draw(seed)
    assert len(plan.lives) == len(plan.gaps) >= 50
    assert sum(len(stage.create_at) for stage in plan.stages) >= 10
    names = [name for stage in plan.stages for name in stage.create_at]
    assert len(names) == len(set(names))
    for stage in plan.stages:
        assert stage.mid_create and stage.mid_create <= set(stage.delete_at) <= set(stage.create_at)
        for name, deleted in stage.delete_at.items():
            assert deleted >= stage.create_at[name]
            if name in stage.mid_create:
                assert deleted - stage.create_at[name] <= 2.0
    # libvirtd and kube-apiserver die within seconds after some creates were posted
    storm = plan.storm
    for moment in (storm.libvirtd_at, storm.apiserver_at):
        assert any(0 < moment - created <= 2.5 for created in storm.create_at.values())
