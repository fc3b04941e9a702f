"""The chaos test's schedule (tests/e2e/test_chaos.py), drawn from one seed: which machines are created and deleted
when, when each operator run gets its SIGKILL, when libvirtd and kube-apiserver die. The same seed gives the same
schedule (tests/unit/test_chaos_plan.py); the system's own timing is not the seed's to fix.
"""

from __future__ import annotations

import dataclasses
import os
import random

SEED_ENV = "CHAOS_SEED"
# The storm: STORM machines created in bursts and some deleted (mid-create or later) while the operator is SIGKILLed
# KILLS times, libvirtd once and kube-apiserver once. Then the survivor: one operator run that must live through a
# second libvirtd and kube-apiserver death while a last wave of SURVIVOR machines is created and one deleted
# mid-create, and converge without a restart (a fresh process after every fault would hide an operator that never
# reconnects).
STORM, BURSTS, DELETED_MID_CREATE, DELETED_LATER = 12, 3, 3, 3
SURVIVOR, SURVIVOR_DELETED = 3, 1
KILLS = 50
# When each operator run gets its SIGKILL: a fifth of them while it starts (LIFE_S from its start); the rest once it
# works (it logged that it reached the libvirt host, which it does right after reading the API), WORKING_S after that.
STARTING_SHARE, LIFE_S, WORKING_S = 0.2, (0.0, 2.0), (0.0, 1.5)
STARTUP_ESTIMATE_S = 2.5  # from start to working, on the 2-core development machine: only to spread the schedule


@dataclasses.dataclass
class Stage:
    """Machines created and deleted, libvirtd and kube-apiserver killed: seconds from the stage's start."""

    create_at: dict[str, float]
    delete_at: dict[str, float]  # the machines that get deleted
    mid_create: set[str]
    libvirtd_at: float
    apiserver_at: float


@dataclasses.dataclass
class Plan:
    """Everything drawn from the seed."""

    seed: int
    lives: list[tuple[bool, float]]  # each operator run's SIGKILL: (after it works?, seconds after start or that)
    gaps: list[float]  # the pause after each SIGKILL before the next start
    storm: Stage
    survivor: Stage

    @property
    def stages(self) -> tuple[Stage, Stage]:
        return self.storm, self.survivor

    @classmethod
    def draw(cls, seed: int) -> Plan:
        rng = random.Random(seed)
        lives = [(False, rng.uniform(*LIFE_S)) if rng.random() < STARTING_SHARE else (True, rng.uniform(*WORKING_S))
                 for _ in range(KILLS)]
        gaps = [rng.uniform(0.0, 0.3) for _ in range(KILLS)]
        span = sum(life for _, life in lives) + sum(gaps) + STARTUP_ESTIMATE_S * KILLS
        names = [f"chaos-{i:02d}" for i in range(STORM)]
        bursts = sorted(rng.uniform(0.0, 0.6 * span) for _ in range(BURSTS))
        create_at = {name: bursts[i % BURSTS] + rng.uniform(0.0, 3.0) for i, name in enumerate(names)}
        doomed = rng.sample(names, DELETED_MID_CREATE + DELETED_LATER)
        mid_create = set(doomed[:DELETED_MID_CREATE])
        delete_at = {name: create_at[name] + (rng.uniform(0.0, 2.0) if name in mid_create else
                                              rng.uniform(5.0, 0.3 * span)) for name in doomed}
        # libvirtd dies in the first burst, kube-apiserver in the second, soon after the burst's first create was
        # posted: machines are in flight.
        first = [min(create_at[name] for i, name in enumerate(names) if i % BURSTS == burst) for burst in range(2)]
        storm = Stage(create_at, delete_at, mid_create, libvirtd_at=first[0] + rng.uniform(0.3, 2.5),
                      apiserver_at=first[1] + rng.uniform(0.3, 2.5))
        wave = [f"chaos-{i:02d}" for i in range(STORM, STORM + SURVIVOR)]
        wave_at = {name: rng.uniform(0.0, 2.0) for name in wave}
        gone = set(rng.sample(wave, SURVIVOR_DELETED))
        survivor = Stage(wave_at, {name: wave_at[name] + rng.uniform(0.0, 2.0) for name in gone}, gone,
                         libvirtd_at=rng.uniform(0.5, 2.5), apiserver_at=rng.uniform(3.0, 6.0))
        return cls(seed, lives, gaps, storm, survivor)


def chaos_seed() -> int:
    """$CHAOS_SEED, or a fresh random one (always printed by the test, so any run can be replayed)."""
    return int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**32))
