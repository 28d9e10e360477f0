"""The served checkpoint run directly by transformers, to check what a server reports."""

from __future__ import annotations

from typing import Any

import httpx

from tests.server.conftest import RunningServer

# How far a served logprob may sit from the direct forward pass, by served dtype:
# absolute, plus a share of the value (unlikely tokens carry bfloat16's relative error).
TOLERANCE = {"float32": (2e-3, 1e-4), "bfloat16": (0.15, 0.03), "float16": (0.03, 0.005)}


def close(got: float, want: float, dtype: str) -> bool:
    """True when a served logprob ``got`` matches the reference ``want`` in ``dtype``."""
    absolute, relative = TOLERANCE[dtype]
    return abs(got - want) <= absolute + relative * abs(want)


def served_dtype(url: str) -> str:
    """The dtype the server's engine runs in, from its /metrics."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("tokenpace:engine_dtype_info{") and line.endswith(" 1.0"):
            return line.split('dtype="')[1].split('"')[0]
    raise AssertionError("the server exports no tokenpace:engine_dtype_info")


class Reference:
    """The checkpoint in ``dtype``: next-token log-probabilities and greedy continuations."""

    def __init__(self, directory: Any, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from tokenpace.server.engines import load_tokenizer

        self.dtype = dtype
        self.tokenizer = load_tokenizer(directory)
        self.model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=getattr(torch, dtype), local_files_only=True
        )
        self.torch = torch

    @classmethod
    def of(cls, server: RunningServer) -> Reference:
        """The reference for the checkpoint and dtype ``server`` serves."""
        from tokenpace.server.engines import prepare_checkpoint
        from tokenpace.server.main import Server

        built = server.server
        assert isinstance(built, Server)
        return cls(prepare_checkpoint(built.options), served_dtype(server.url))

    def logprobs(self, ids: list[int]) -> Any:
        """``[len(ids), vocab]`` log-probabilities of the next token at each position."""
        torch = self.torch
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    def greedy(self, ids: list[int], n: int) -> list[int]:
        out: list[int] = []
        for _ in range(n):
            out.append(int(self.logprobs([*ids, *out])[-1].argmax()))
        return out

    def text(self, token_id: int) -> str:
        text: str = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text
