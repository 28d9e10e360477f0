from __future__ import annotations

import pytest

from tokenpace.core.lifecycle import ContainerLifecycle, ContainerPhase, ContainerState


def phase(life: ContainerLifecycle) -> ContainerPhase:
    return life.phase


def test_a_container_loads_serves_idles_and_goes_cold_when_keep_alive_is_due() -> None:
    life = ContainerLifecycle(keep_alive_s=5.0)
    assert phase(life) is ContainerPhase.COLD and not life.is_active
    assert life.startup_s(0.0, load_s=3.0) == 3.0
    assert life.start_load(1.0, ready_at_s=4.0)
    assert not life.start_load(2.0), "a second start while loading is a no-op"
    assert phase(life) is ContainerPhase.LOADING and life.is_active
    assert life.startup_s(2.5, load_s=99.0) == pytest.approx(1.5)
    assert life.loaded(4.0) == pytest.approx(3.0)
    assert phase(life) is ContainerPhase.SERVING and life.startup_s(4.0, 3.0) == 0.0
    epoch = life.arm_keep_alive(10.0)
    assert phase(life) is ContainerPhase.KEEP_ALIVE
    assert life.keep_alive_left(12.0) == pytest.approx(3.0)
    assert not life.keep_alive_due(14.9, epoch)
    assert life.keep_alive_due(15.0, epoch)
    life.go_cold(15.0)
    assert life.state is ContainerState.COLD
    assert life.container_seconds(100.0) == pytest.approx(14.0)


def test_activity_after_arming_makes_the_old_keep_alive_stale() -> None:
    life = ContainerLifecycle(keep_alive_s=1.0)
    life.start_warm(0.0)
    first = life.arm_keep_alive(0.0)
    life.disarm_keep_alive()
    assert not life.keep_alive_due(5.0, first) and life.keep_alive_left(5.0) is None
    second = life.arm_keep_alive(2.0)
    assert not life.keep_alive_due(3.0, first), "an older timer never retires the container"
    assert life.keep_alive_due(3.0, second) and life.keep_alive_due(3.0)


def test_draining_and_unknown_load_end_and_no_keep_alive() -> None:
    life = ContainerLifecycle(keep_alive_s=None)
    life.start_load(10.0)  # the end of a real engine's load is not known in advance
    assert life.startup_s(12.0, load_s=5.0) == pytest.approx(3.0)
    life.draining = True
    assert phase(life) is ContainerPhase.LOADING
    life.loaded(13.0)
    assert phase(life) is ContainerPhase.DRAINING
    life.arm_keep_alive(13.0)
    assert life.keep_alive_left(1e9) is None and not life.keep_alive_due(1e9)
    life.go_cold(20.0)  # the engine died
    assert not life.draining and life.container_seconds(30.0) == pytest.approx(10.0)


def test_keep_alive_must_be_positive() -> None:
    with pytest.raises(ValueError, match="keep_alive_s must be > 0"):
        ContainerLifecycle(keep_alive_s=0.0)
