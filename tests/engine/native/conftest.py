"""One loaded model per test session; the greedy references come from transformers' generate."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# Threads that sleep at barriers instead of spinning: under a competing busy process a
# spinning two-thread step can run many times slower. Read when torch loads its OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
torch = pytest.importorskip("torch", reason="the native engine needs torch (native extra)")
pytest.importorskip("transformers", reason="the native engine needs transformers (native extra)")
pytest.importorskip("gguf", reason="converting the embedded model needs gguf (native extra)")

from tokenpace.core.request import Request  # noqa: E402
from tokenpace.core.sampling import SamplingParams  # noqa: E402
from tokenpace.core.step import ScheduledChunk  # noqa: E402
from tokenpace.engine.native import LoadedModel, NativeEngine, NativeEngineConfig  # noqa: E402
from tokenpace.engine.native.compiled import Kernel, KernelBuild  # noqa: E402
from tokenpace.engine.native.elementwise import ElementwiseBuild  # noqa: E402
from tokenpace.engine.native.loading import embedded_gguf_path, load_model  # noqa: E402
from tokenpace.engine.native.ragged_attention import RaggedBuild  # noqa: E402

CACHE_DIR = Path(__file__).resolve().parents[3] / "build" / "native-cache"


def kernel_or_skip(build: KernelBuild[Kernel]) -> Kernel:
    """The built kernel; the test is skipped, with the reason, where there is none."""
    if build.kernel is None:
        pytest.skip(build.reason)
    return build.kernel


PROMPTS = (
    "Hi",
    "What is 2+2?",
    "Name three primary colors.",
    "Write a haiku about autumn leaves falling in a quiet forest at dusk.",
    "Explain gravity to a child in three sentences, using simple words and one example.",
    "List five fruits that are red, and for each one say in a few words where it usually "
    "grows and what it tastes like when it is ripe.",
    "You are planning a weekend trip to the mountains with two friends. Describe what you "
    "would pack, how you would travel there, where you would stay, what you would eat, and "
    "which two hikes you would choose, giving one reason for each choice.",
    "Summarise the following text in one sentence: The city council met on Tuesday to "
    "discuss the new bicycle lanes. Residents argued about parking, safety and the cost of "
    "construction. After three hours of debate, the council voted to build the lanes on two "
    "main streets first and to review the results after one year before extending them to "
    "the rest of the city. Several shop owners asked for loading zones, which were approved.",
)
MAX_TOKENS = 12
# One thread: these tests check outputs, not speed, and stay quick on a busy machine.
NUM_THREADS = 1


@pytest.fixture(scope="session")
def loaded() -> LoadedModel:
    try:
        embedded_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    config = NativeEngineConfig(
        cache_dir=CACHE_DIR, dtype="float32", device="cpu", num_threads=NUM_THREADS
    )
    return load_model(config, time.perf_counter)


@pytest.fixture(scope="session")
def prompt_ids(loaded: LoadedModel) -> list[list[int]]:
    tokenizer = loaded.tokenizer
    ids = []
    for prompt in PROMPTS:
        encoded: Any = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True
        )
        ids.append(list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded))
    return ids


@pytest.fixture(scope="session")
def references(loaded: LoadedModel, prompt_ids: list[list[int]]) -> list[list[int]]:
    """Greedy single-request ``generate`` output of every prompt (EOS included)."""
    model = loaded.model
    model.set_attn_implementation("sdpa")
    outputs = []
    with torch.inference_mode():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                pad_token_id=loaded.tokenizer.pad_token_id,
            )
            outputs.append(out[0, len(ids) :].tolist())
    return outputs


@pytest.fixture
def make_engine(loaded: LoadedModel) -> Iterator[Callable[..., NativeEngine]]:
    """Build engines on the shared model; ``kv_cache_tokens`` etc. as keyword overrides,
    ``ragged`` the ragged decode kernel's build and ``elementwise_build`` the elementwise
    kernel's to hand them."""

    def make(
        ragged: RaggedBuild | None = None,
        elementwise_build: ElementwiseBuild | None = None,
        **overrides: Any,
    ) -> NativeEngine:
        overrides.setdefault("dtype", "float32")
        config = NativeEngineConfig(
            cache_dir=CACHE_DIR, device="cpu", num_threads=NUM_THREADS, **overrides
        )
        return NativeEngine(
            loaded, config, time.perf_counter, np.random.default_rng(0), ragged, elementwise_build
        )

    yield make


def make_request(
    request_id: int, ids: list[int], max_tokens: int = MAX_TOKENS, **sampling: Any
) -> Request:
    return Request(
        request_id=request_id,
        num_prompt_tokens=len(ids),
        max_tokens=max_tokens,
        arrival_s=0.0,
        prompt_token_ids=list(ids),
        sampling=SamplingParams(**sampling),
    )


def scripted_clock(candidate_s: list[float], repeats: int = 3) -> Callable[[], float]:
    """A clock for ``interleaved.beats`` probes: per probe, ``repeats`` repeats of start,
    middle and end readings, the baseline taking 1 s and the candidate the given time."""
    times: list[float] = []
    for seconds in candidate_s:
        for _ in range(repeats):
            start = 10.0 * len(times)
            times += [start, start + 1.0, start + 1.0 + seconds]
    return iter(times).__next__


def greedy_outputs(
    engine: NativeEngine, prompt_lengths: Sequence[int] = (5, 9, 40, 23), max_tokens: int = 6
) -> list[list[int]]:
    """The greedy outputs of one request per prompt length (synthetic prompts, EOS
    ignored), stepped by hand: prompts of up to 16 tokens prefilled whole, longer ones in
    16-token chunks beside the others' decodes."""
    params = SamplingParams(ignore_eos=True)
    ids = count(1)
    requests = [Request(next(ids), n, max_tokens, 0.0, sampling=params) for n in prompt_lengths]
    while any(r.num_output_tokens < r.max_tokens for r in requests):
        chunks = [
            ScheduledChunk(r, min(16, r.num_uncomputed_tokens))
            for r in requests
            if r.num_output_tokens < r.max_tokens
        ]
        result = engine.execute(chunks)
        for request_id, token in result.sampled_token_ids.items():
            request = next(r for r in requests if r.request_id == request_id)
            request.output_token_ids.append(token)
            request.token_times_s.append(0.0)
    for request in requests:
        engine.free(request.request_id)
    return [r.output_token_ids for r in requests]
