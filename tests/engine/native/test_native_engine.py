"""The native engine on the embedded SmolLM2: exactness, KV bookkeeping, stops, sampling."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from tokenpace.core.cache import default_cache_dir
from tokenpace.core.request import FinishReason, Request
from tokenpace.engine.native import NativeEngine
from tokenpace.engine.native.elementwise import build_elementwise
from tokenpace.engine.native.linear_kernels import packing_supported
from tokenpace.engine.native.ragged_attention import build_ragged_decode
from tokenpace.engine.profile import load_profile
from tokenpace.policy import build_policy
from tokenpace.policy.base import Policy
from tokenpace.policy.vllm_default import VllmDefaultConfig, VllmDefaultPolicy
from tokenpace.runtime.step_loop import StepLoop

from .conftest import kernel_or_skip, make_request

pytestmark = [pytest.mark.native, pytest.mark.slow]

EngineFactory = Callable[..., NativeEngine]


def run(
    loop: StepLoop, requests: Sequence[Request], abort_at: dict[int, int] | None = None
) -> None:
    """Queue every request at once and step until all are done; ``abort_at`` maps a step
    index to a request id aborted before that step."""
    for request in requests:
        loop.add_request(request, 0.0)
    step = 0
    while loop.has_work:
        if abort_at and step in abort_at:
            loop.abort(abort_at[step], float(step))
        in_flight = loop.begin_step(float(step))
        assert in_flight is not None, "the loop stalled with work left"
        step += 1
        loop.complete_step(in_flight, float(step))


def twp() -> Policy:
    return build_policy("twp", load_profile("v100-llama-3.2-3b"))


@pytest.mark.parametrize(
    "policy",
    [twp, lambda: VllmDefaultPolicy(VllmDefaultConfig(max_num_batched_tokens=48))],
    ids=["twp", "vllm_default-48"],
)
def test_batched_greedy_equals_generate(
    make_engine: EngineFactory,
    prompt_ids: list[list[int]],
    references: list[list[int]],
    policy: Callable[[], Policy],
) -> None:
    engine = make_engine(dtype="float32")
    loop = StepLoop(policy(), engine)
    requests = [make_request(i, ids) for i, ids in enumerate(prompt_ids)]
    run(loop, requests)
    assert len({len(ids) for ids in prompt_ids}) == len(prompt_ids)
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in loop.steps), "no mixed step"
    assert sum(1 for s in loop.steps if s.num_prefill_tokens) >= 2, "prefill was not chunked"
    for request, reference in zip(requests, references, strict=True):
        assert request.output_token_ids == reference, f"request {request.request_id}"
    assert engine.num_free_blocks == engine.num_total_blocks
    assert engine.num_active_slots == 0
    assert engine.forward_path == "fused"


@pytest.mark.parametrize(
    ("pack_weights", "decode_attention"), [("on", "products"), ("off", "sdpa")]
)
def test_float32_greedy_equals_generate_with_each_kernel_choice(
    make_engine: EngineFactory,
    prompt_ids: list[list[int]],
    references: list[list[int]],
    pack_weights: str,
    decode_attention: str,
) -> None:
    # Packed float32 products sum in oneDNN's order, not torch's, and decode attention by
    # batched products is SDPA's to rounding: the trained model's greedy choices must not
    # move.
    if pack_weights == "on" and packing_supported(torch.float32) is not None:
        pytest.skip("this machine cannot pack float32 weights")
    engine = make_engine(
        dtype="float32", pack_weights=pack_weights, decode_attention=decode_attention
    )
    assert engine.linear_kernel == ("packed" if pack_weights == "on" else "plain")
    expected = "sdpa" if decode_attention == "sdpa" else f"products<={engine.config.max_model_len}"
    assert engine.decode_attention == expected
    loop = StepLoop(twp(), engine)
    requests = [make_request(i, ids) for i, ids in enumerate(prompt_ids)]
    run(loop, requests)
    for request, reference in zip(requests, references, strict=True):
        assert request.output_token_ids == reference, f"request {request.request_id}"


def _with_ragged_attention(make_engine: EngineFactory, kernels: Path) -> NativeEngine:
    build = build_ragged_decode(kernels, torch.device("cpu"), torch.float32)
    kernel_or_skip(build)
    engine = make_engine(dtype="float32", decode_attention="ragged", ragged=build)
    assert engine.decode_attention == "ragged"
    return engine


def _with_compiled_elementwise(make_engine: EngineFactory, kernels: Path) -> NativeEngine:
    build = build_elementwise(kernels, torch.device("cpu"), torch.float32)
    kernel_or_skip(build)
    engine = make_engine(dtype="float32", elementwise="compiled", elementwise_build=build)
    assert engine.elementwise == "compiled"
    return engine


@pytest.mark.parametrize(
    "with_kernel",
    [_with_ragged_attention, _with_compiled_elementwise],
    ids=["ragged_attention", "compiled_elementwise"],
)
def test_greedy_equals_generate_with_a_compiled_kernel(
    make_engine: EngineFactory,
    prompt_ids: list[list[int]],
    references: list[list[int]],
    with_kernel: Callable[[EngineFactory, Path], NativeEngine],
) -> None:
    # Each request attended over its own keys, or the elementwise work done in one pass per
    # piece, by a compiled kernel: torch's values to float32 rounding, so the trained
    # model's greedy choices must not move.
    engine = with_kernel(make_engine, default_cache_dir() / "kernels")
    loop = StepLoop(twp(), engine)
    requests = [make_request(i, ids) for i, ids in enumerate(prompt_ids)]
    run(loop, requests)
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in loop.steps), "no mixed step"
    for request, reference in zip(requests, references, strict=True):
        assert request.output_token_ids == reference, f"request {request.request_id}"


def test_greedy_equals_generate_with_the_longest_decodes_attended_on_their_own(
    make_engine: EngineFactory,
    prompt_ids: list[list[int]],
    references: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A free call: every step whose decodes differ in length peels its longest.
    from tokenpace.engine.native import engine as engine_module

    monkeypatch.setattr(engine_module, "PEEL_CALL_TOKENS", 0)
    peels = []
    layout = engine_module.NativeEngine._layout

    def recording(self: NativeEngine, *args: Any) -> Any:
        result = layout(self, *args)
        peels.append(len(result.decode_peeled))
        return result

    monkeypatch.setattr(engine_module.NativeEngine, "_layout", recording)
    engine = make_engine(dtype="float32")
    loop = StepLoop(twp(), engine)
    requests = [make_request(i, ids) for i, ids in enumerate(prompt_ids)]
    run(loop, requests)
    assert max(peels) >= 2, "no step attended its longest decodes on their own"
    for request, reference in zip(requests, references, strict=True):
        assert request.output_token_ids == reference, f"request {request.request_id}"


def test_transformers_forward_path_equals_generate(
    make_engine: EngineFactory, prompt_ids: list[list[int]], references: list[list[int]]
) -> None:
    engine = make_engine(dtype="float32", fused_forward=False)
    assert engine.forward_path == "transformers"
    loop = StepLoop(VllmDefaultPolicy(VllmDefaultConfig(max_num_batched_tokens=48)), engine)
    requests = [make_request(i, ids) for i, ids in enumerate(prompt_ids)]
    run(loop, requests)
    for request, reference in zip(requests, references, strict=True):
        assert request.output_token_ids == reference, f"request {request.request_id}"


def test_preemption_recomputes_exactly(
    make_engine: EngineFactory, prompt_ids: list[list[int]], references: list[list[int]]
) -> None:
    engine = make_engine(kv_cache_tokens=160, block_size=16)
    loop = StepLoop(VllmDefaultPolicy(VllmDefaultConfig(max_num_batched_tokens=64)), engine)
    requests = [make_request(i, ids) for i, ids in enumerate(prompt_ids[:4])]
    run(loop, requests)
    assert any(r.num_preemptions for r in requests), "the small cache forced no preemption"
    for request, reference in zip(requests, references[:4], strict=True):
        assert request.output_token_ids == reference, f"request {request.request_id}"
    assert engine.num_free_blocks == engine.num_total_blocks


def test_abort_returns_blocks(make_engine: EngineFactory, prompt_ids: list[list[int]]) -> None:
    engine = make_engine()
    loop = StepLoop(VllmDefaultPolicy(VllmDefaultConfig(max_num_batched_tokens=64)), engine)
    requests = [make_request(i, ids, ignore_eos=True) for i, ids in enumerate(prompt_ids[:4])]
    run(loop, requests, abort_at={3: 1, 5: 3})
    assert requests[1].finish_reason is FinishReason.ABORT
    assert requests[3].finish_reason is FinishReason.ABORT
    assert requests[0].num_output_tokens == requests[0].max_tokens
    assert engine.num_free_blocks == engine.num_total_blocks
    assert engine.num_active_slots == 0


def test_stop_string_ends_request(
    make_engine: EngineFactory, prompt_ids: list[list[int]], references: list[list[int]]
) -> None:
    engine = make_engine()
    tokenizer = engine.tokenizer
    full = references[3]
    # A word from the middle of the greedy output, so the stop must cut it short.
    word = tokenizer.decode(full[4:6]).strip()
    assert word
    request = make_request(0, prompt_ids[3], stop=(word,))
    run(StepLoop(twp(), engine), [request])
    assert request.finish_reason is FinishReason.STOP
    out = request.output_token_ids
    assert out == full[: len(out)]
    assert len(out) < len(full)
    assert word in tokenizer.decode(out) and word not in tokenizer.decode(out[:-1])


def test_seeded_sampling_is_reproducible(
    make_engine: EngineFactory, prompt_ids: list[list[int]]
) -> None:
    def sampled(seed: int, companions: int) -> list[int]:
        engine = make_engine()
        params: dict[str, Any] = {"temperature": 1.0, "top_p": 0.9, "ignore_eos": True}
        target = make_request(0, prompt_ids[4], seed=seed, **params)
        others = [make_request(i + 1, prompt_ids[i], **params) for i in range(companions)]
        run(StepLoop(twp(), engine), [target, *others])
        return target.output_token_ids

    alone = sampled(seed=7, companions=0)
    assert sampled(seed=7, companions=3) == alone
    assert sampled(seed=8, companions=0) != alone


def test_a_resumed_seeded_request_continues_its_random_stream(
    make_engine: EngineFactory, prompt_ids: list[list[int]]
) -> None:
    params: dict[str, Any] = {"temperature": 1.0, "top_p": 0.9, "ignore_eos": True, "seed": 11}
    whole = make_request(0, prompt_ids[2], max_tokens=24, **params)
    run(StepLoop(twp(), make_engine()), [whole])
    done = whole.output_token_ids[:10]

    def resumed(first_output_index: int) -> list[int]:
        request = make_request(
            1,
            [*prompt_ids[2], *done],
            max_tokens=14,
            first_output_index=first_output_index,
            **params,
        )
        run(StepLoop(twp(), make_engine()), [request])
        return request.output_token_ids

    # Moved after 10 tokens, with them in its prompt: the same 14 tokens follow.
    assert resumed(first_output_index=10) == whole.output_token_ids[10:]
    assert resumed(first_output_index=0) != whole.output_token_ids[10:]


def test_step_latency_is_measured(make_engine: EngineFactory, prompt_ids: list[list[int]]) -> None:
    engine = make_engine()
    loop = StepLoop(twp(), engine)
    start = time.perf_counter()
    run(loop, [make_request(0, prompt_ids[0], max_tokens=4)])
    elapsed = time.perf_counter() - start
    latencies = [s.latency_s for s in loop.steps]
    assert all(lat > 0 for lat in latencies)
    assert sum(latencies) <= elapsed


def test_fresh_prompts_of_one_length_share_a_call_and_keep_their_outputs(
    make_engine: EngineFactory, prompt_ids: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three fresh prompts of one length, a longer one queued between them: the engine
    puts the three side by side and attends them in one batched call, and every request's
    greedy output is what it gets alone."""
    from tokenpace.engine.native import attention

    calls: list[tuple[Any, ...]] = []
    grouped = attention.prefill_calls

    def recording(spans: tuple[Any, ...]) -> tuple[Any, ...]:
        calls.append(grouped(spans))
        return calls[-1]

    length = len(prompt_ids[3])
    prompts = [
        prompt_ids[4][:length],
        prompt_ids[7],
        prompt_ids[5][:length],
        prompt_ids[6][:length],
    ]
    monkeypatch.setattr(attention, "prefill_calls", recording)
    together = [make_request(i, ids) for i, ids in enumerate(prompts)]
    run(StepLoop(VllmDefaultPolicy(VllmDefaultConfig()), make_engine()), together)
    runs = [c for step in calls for c in step if isinstance(c, attention.FreshRun)]
    assert [(r.count, r.num_tokens) for r in runs] == [(3, length)]
    for request, ids in zip(together, prompts, strict=True):
        alone = make_request(request.request_id, ids)
        run(StepLoop(VllmDefaultPolicy(VllmDefaultConfig()), make_engine()), [alone])
        assert request.output_token_ids == alone.output_token_ids, f"request {request.request_id}"
