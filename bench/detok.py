"""Streaming detokenisation: time per output token at a long output, before and after.

"Before" is the algorithm the server used until incremental decoding: every token re-decodes
all output ids and diffs the text (``FullDecodeText`` below, kept here as the reference).
"After" is ``tokenpace.server.detokenize.IncrementalText`` with the stream it picks for the
tokenizer (the ``tokenizers`` library's ``DecodeStream``), and with the generic window
decoder (``WindowTextStream``) for comparison. All three run on the embedded SmolLM2
tokenizer over the same ids (English, accented, CJK and emoji text, so characters split
across tokens), with two stop strings that never match (so the stop search runs on every
token), and must give the same text.

Prints one line per decoder, then (last line) one JSON object: microseconds per token for
each, averaged over the whole output and over its last 100 tokens (the cost of a token at
that output length), and the before/after ratios, measured in this run.

    python bench/detok.py [--tokens 2000] [--repeats 5]
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.engine.native.config import NativeEngineConfig
from tokenpace.engine.native.loading import ensure_checkpoint
from tokenpace.server.detokenize import IncrementalText
from tokenpace.server.engines import load_tokenizer
from tokenpace.server.text_stream import WindowTextStream

TEXT = (
    "The quick brown fox jumps over the lazy dog; naïve café owners déjà vu. "
    "東京の天気は晴れです。 Emoji: 🦊🐶👩‍👩‍👧‍👦 🇫🇷 ✓ ∑x² ≈ π. "
    "Numbers 1234567890 and code: def f(x): return x ** 2\n"
)
STOP = ("<<END>>", "\n\n\n")
_REPLACEMENT = "\ufffd"


class FullDecodeText:
    """The old algorithm: decode every id on every token, send what is safe."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._ids: list[int] = []
        self.text = ""
        self._emitted = 0
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self._ids.append(token_id)
        self.text = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        found = [i for i in (self.text.find(s, self._emitted) for s in self._stop) if i >= 0]
        if found:
            self.text = self.text[: min(found)]
            self.stopped = True
            return self._take(len(self.text))
        end = len(self.text)
        while end > self._emitted and self.text[end - 1] == _REPLACEMENT:
            end -= 1
        held = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, end), held, -1):
                if self.text[end - size : end] == stop[:size]:
                    held = size
                    break
        return self._take(end - held)

    def finish(self) -> str:
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta


class WindowText(IncrementalText):
    """``IncrementalText`` forced onto the generic window decoder."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        super().__init__(tokenizer, stop)
        self._stream = WindowTextStream(tokenizer)


def run(make: Any, ids: list[int], tail: int) -> tuple[float, float, str]:
    """Seconds to push ``ids`` and finish, seconds of the last ``tail`` pushes (the cost
    per token at the end of the output), and the text the deltas make."""
    start = time.perf_counter()
    decoder = make()
    deltas = [decoder.push(i) for i in ids[:-tail]]
    tail_start = time.perf_counter()
    deltas += [decoder.push(i) for i in ids[-tail:]]
    tail_s = time.perf_counter() - tail_start
    deltas.append(decoder.finish())
    return time.perf_counter() - start, tail_s, "".join(deltas)


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of ``bench/detok.py``."""

    tokens: int = option(2000, "Output tokens per request.")
    repeats: int = option(5, "Runs per decoder (best kept).")

    def __post_init__(self) -> None:
        require_positive(self, "tokens", "repeats")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run_command(Settings, measure, sys.argv[1:], prog="bench/detok.py", description=__doc__)


def measure(args: Settings) -> None:
    """Time every decoder over ``args.tokens`` tokens; print the JSON line."""
    directory, _ = ensure_checkpoint(NativeEngineConfig())
    tokenizer = load_tokenizer(directory)
    ids: list[int] = tokenizer.encode(TEXT * (args.tokens // 20 + 1), add_special_tokens=False)
    ids = ids[: args.tokens]
    want = tokenizer.decode(ids, skip_special_tokens=True)
    decoders = {
        "before": lambda: FullDecodeText(tokenizer, STOP),
        "after": lambda: IncrementalText(tokenizer, STOP),
        "after_window": lambda: WindowText(tokenizer, STOP),
    }
    tail = min(100, len(ids) // 2)
    mean_us: dict[str, float] = {}
    tail_us: dict[str, float] = {}
    for name, make in decoders.items():
        best = best_tail = float("inf")
        for _ in range(args.repeats):
            seconds, tail_s, text = run(make, ids, tail)
            if text != want:
                raise SystemExit(f"{name}: the streamed text differs from a full decode")
            best, best_tail = min(best, seconds), min(best_tail, tail_s)
        mean_us[name] = best / len(ids) * 1e6
        tail_us[name] = best_tail / tail * 1e6
        print(
            f"{name:>12}: {mean_us[name]:9.2f} us/token over {len(ids)} tokens, "
            f"{tail_us[name]:9.2f} us/token over the last {tail}"
        )
    result = {
        "num_tokens": len(ids),
        "tail_tokens": tail,
        "before_us_per_token": round(mean_us["before"], 3),
        "after_us_per_token": round(mean_us["after"], 3),
        "after_window_us_per_token": round(mean_us["after_window"], 3),
        "before_tail_us_per_token": round(tail_us["before"], 3),
        "after_tail_us_per_token": round(tail_us["after"], 3),
        "ratio_before_over_after": round(mean_us["before"] / mean_us["after"], 1),
        "tail_ratio_before_over_after": round(tail_us["before"] / tail_us["after"], 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
