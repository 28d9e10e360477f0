"""Incremental detokenisation on the embedded SmolLM2 tokenizer: the same text as the old
full re-decode on every token, with stop strings, special tokens, characters split across
tokens and random ids; and a cost per token that does not grow with the output."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tokenpace.server.detokenize import IncrementalText
from tokenpace.server.text_stream import FastTextStream, WindowTextStream, text_stream

BENCH = Path(__file__).resolve().parents[2] / "bench" / "detok.py"
PROMPTS = (
    "Hello, world! Plain ASCII with  double  spaces and a tab\there.",
    "naïve café, déjà vu, Ærøskøbing, Straße, ñandú",
    "東京の天気は晴れです。北京欢迎你。서울은 맑아요.",
    "Emoji 🦊🐶 and families 👩‍👩‍👧‍👦, flags 🇫🇷🇯🇵, math ∑x² ≈ π ✓",
    "stop here END and not after",
    "line one\n\nline two\n\n\nline three",
)
STOPS: tuple[tuple[str, ...], ...] = ((), ("END",), ("🐶",), ("\n\n\n", "é"), ("晴れ", "zzz"))


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    """bench/detok.py, which keeps the old algorithm (``FullDecodeText``) as its baseline."""
    spec = importlib.util.spec_from_file_location("bench_detok", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their module while defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tokenpace.engine.native.config import NativeEngineConfig
    from tokenpace.engine.native.loading import ensure_checkpoint
    from tokenpace.server.engines import load_tokenizer

    try:
        directory, _ = ensure_checkpoint(NativeEngineConfig())
    except (FileNotFoundError, ImportError) as error:
        pytest.skip(f"the embedded model is unavailable: {error}")
    return load_tokenizer(directory)


def id_cases(tokenizer: Any) -> list[list[int]]:
    """Each prompt's ids, one with special tokens mixed in, and seeded random ids (which
    include byte tokens that never form a valid character)."""
    cases = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    eos = tokenizer.eos_token_id
    cases.append([eos, *cases[3][:5], eos, *cases[2], eos])
    rng = random.Random(7)
    cases += [[rng.randrange(len(tokenizer)) for _ in range(40)] for _ in range(20)]
    return cases


def stream_of(old: Any, new: Any, ids: list[int]) -> None:
    """Pushes ``ids`` into both; the text sent so far by ``new`` is always a prefix of what
    ``old`` sent (it may wait one token longer at a split character), and in the end the
    two texts are identical."""
    sent_old = sent_new = ""
    for token_id in ids:
        sent_old += old.push(token_id)
        sent_new += new.push(token_id)
        assert sent_old.startswith(sent_new)
        assert new.stopped == old.stopped
    sent_old += old.finish()
    sent_new += new.finish()
    assert sent_new == sent_old == old.text == new.text


@pytest.mark.parametrize("stop", STOPS)
def test_streamed_text_equals_the_full_re_decode(
    tokenizer: Any, reference: ModuleType, stop: tuple[str, ...]
) -> None:
    assert isinstance(text_stream(tokenizer), FastTextStream)
    for ids in id_cases(tokenizer):
        stream_of(reference.FullDecodeText(tokenizer, stop), IncrementalText(tokenizer, stop), ids)
        stream_of(
            reference.FullDecodeText(tokenizer, stop), reference.WindowText(tokenizer, stop), ids
        )


def test_a_stop_string_cuts_the_real_text(tokenizer: Any) -> None:
    ids = tokenizer.encode(PROMPTS[4], add_special_tokens=False)
    text = IncrementalText(tokenizer, ("END",))
    sent = "".join(text.push(i) for i in ids) + text.finish()
    assert text.stopped and sent == "stop here "


class CountingTokenizer:
    """Wraps a tokenizer and counts the ids it decodes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.num_decoded_ids = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.num_decoded_ids += len(ids)
        text: str = self.inner.decode(ids, skip_special_tokens=skip_special_tokens)
        return text


def test_window_stream_decodes_a_bounded_number_of_ids_per_token(tokenizer: Any) -> None:
    ids = tokenizer.encode(PROMPTS[3] * 60, add_special_tokens=False)
    counting = CountingTokenizer(tokenizer)
    stream = WindowTextStream(counting)
    text = "".join(filter(None, (stream.step(i) for i in ids))) + stream.flush()
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    # A full re-decode would read len(ids) ** 2 / 2 ids; the window reads a few per token.
    assert len(ids) > 1000
    assert counting.num_decoded_ids < 20 * len(ids)


def test_a_tokenizer_without_backend_gets_the_window_stream() -> None:
    class Plain:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(chr(i) for i in ids)

    assert isinstance(text_stream(Plain()), WindowTextStream)
