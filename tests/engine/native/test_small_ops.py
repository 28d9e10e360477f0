"""Small elementwise work on one thread: the switch, the measured limit, the same values."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native.linear_kernels import packing_supported
from tokenpace.engine.native.small_ops import (
    SMALL_OPS_PROBE_ELEMENTS,
    TORCH_PARALLEL_MIN_ELEMENTS,
    SmallOps,
    measure_small_ops_max_elements,
)

from .conftest import scripted_clock

pytestmark = pytest.mark.native

TINY = "random:tiny-llama"


@pytest.fixture(autouse=True)
def thread_count_settable(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's own ``set_num_threads``: a vLLM engine loaded earlier in this test process
    replaces it with a no-op (see ``OneThread``)."""
    monkeypatch.setattr(torch, "set_num_threads", torch._C.set_num_threads)


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
def test_nothing_changes_where_the_thread_count_cannot_be_set() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "set_num_threads", lambda threads: None)
        with SmallOps(max_elements=1 << 20).one_thread(1 << 19):
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_small_work_runs_on_one_thread_and_the_count_comes_back() -> None:
    small_ops = SmallOps(max_elements=1 << 20)
    with small_ops.one_thread(TORCH_PARALLEL_MIN_ELEMENTS + 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    # torch runs it on one thread anyway; too large; nothing ever.
    for ops, size in [
        (small_ops, TORCH_PARALLEL_MIN_ELEMENTS),
        (small_ops, (1 << 20) + 1),
        (SmallOps(), TORCH_PARALLEL_MIN_ELEMENTS + 1),
    ]:
        with ops.one_thread(size):
            assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), small_ops.one_thread(1 << 19):
        raise RuntimeError("the count comes back after an error too")
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_the_limit_is_the_largest_size_before_one_thread_first_loses() -> None:
    first, second = SMALL_OPS_PROBE_ELEMENTS[:2]
    wins_twice = scripted_clock([0.5, 0.5, 2.0, 0.5])
    assert measure_small_ops_max_elements(wins_twice, repeats=3) == second
    assert measure_small_ops_max_elements(scripted_clock([0.5, 2.0]), repeats=3) == first
    assert measure_small_ops_max_elements(scripted_clock([2.0]), repeats=3) == 0
    everywhere = scripted_clock([0.5] * len(SMALL_OPS_PROBE_ELEMENTS))
    assert measure_small_ops_max_elements(everywhere, repeats=3) == SMALL_OPS_PROBE_ELEMENTS[-1]


def test_one_torch_thread_needs_no_measurement() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert measure_small_ops_max_elements(scripted_clock([])) == 0
    finally:
        torch.set_num_threads(before)


def test_a_negative_limit_other_than_measure_is_refused() -> None:
    with pytest.raises(ValueError, match="small_ops_max_elements must be -1"):
        NativeEngineConfig(small_ops_max_elements=-2)


def _prompt_logprobs(engine: NativeEngine) -> dict[str, Any]:
    """One step prefilling 104 tokens of two prompts whole (104 x the tiny model's 512
    intermediate values per layer: past torch's split), with every prompt token's
    log-probability."""
    params = SamplingParams(ignore_eos=True, prompt_logprobs=2, logprobs=2)
    requests = [Request(i, n, 4, 0.0, sampling=params) for i, n in ((1, 40), (2, 64))]
    result = engine.execute([ScheduledChunk(r, r.num_prompt_tokens) for r in requests])
    for request in requests:
        engine.free(request.request_id)
    return {
        "sampled": result.sampled_token_ids,
        "prompt": engine.step_prompt_logprobs,
        "step": engine.step_logprobs,
    }


# Float values may differ by this much, relative, and no more: a float32 product whose
# threads sum in another order (a busy machine can leave its library fewer of them) moved one
# log-probability by one unit in the last place (-9.3497486 against -9.3497477) in a suite
# run on two cores. Token ids and every other value must be equal.
SAME_VALUE_REL = 1e-6


def assert_same_values(got: Any, expected: Any, path: str = "") -> None:
    """``got`` equals ``expected`` (dicts, sequences and dataclasses compared member by
    member), floats within ``SAME_VALUE_REL``."""
    if isinstance(expected, float):
        assert isinstance(got, float), path
        assert math.isclose(got, expected, rel_tol=SAME_VALUE_REL, abs_tol=SAME_VALUE_REL), path
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), path
        for key, value in expected.items():
            assert_same_values(got[key], value, f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected) and len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_same_values(a, b, f"{path}[{i}]")
    elif dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        assert type(got) is type(expected), path
        for field in dataclasses.fields(expected):
            name = field.name
            assert_same_values(getattr(got, name), getattr(expected, name), f"{path}.{name}")
    else:
        assert got == expected, path


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_small_work_on_one_thread_gives_the_same_values(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bfloat16 with float32 products on packed copies converts each product's input and
    # output, as such a step does on a CPU without bfloat16 instructions.
    upcast = dtype == "bfloat16" and packing_supported(torch.float32) is None
    settings: dict[str, Any] = {"upcast_min_tokens": 1} if upcast else {}

    def config(limit: int) -> NativeEngineConfig:
        # Decode attention by SDPA and elementwise work by torch on both sides: the split is
        # compared, not the attention or the elementwise kernel.
        return NativeEngineConfig(
            model=TINY, device="cpu", num_threads=2, dtype=dtype, small_ops_max_elements=limit,
            decode_attention="sdpa", elementwise="torch", **settings,
        )  # fmt: skip

    split = NativeEngine.load(config(0), rng=np.random.default_rng(0))
    alone = NativeEngine(split.loaded, config(1 << 20), time.perf_counter, np.random.default_rng(0))
    before = torch.get_num_threads()
    try:
        assert (split.small_ops, alone.small_ops) == (SmallOps(0), SmallOps(1 << 20))
        reference = _prompt_logprobs(split)
        switches: list[int] = []
        set_num_threads = torch._C.set_num_threads

        def counted(threads: int) -> None:
            switches.append(threads)
            set_num_threads(threads)

        monkeypatch.setattr(torch, "set_num_threads", counted)
        assert_same_values(_prompt_logprobs(alone), reference)
        assert switches.count(1) >= 4 * 5  # every elementwise stretch of every layer
    finally:
        torch.set_num_threads(before)
