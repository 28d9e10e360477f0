"""The async scheduler variant as vLLM's own engine-core process builds it: class given by
its dotted path, policy and step log chosen through the environment, as with
``--scheduler-cls`` on the OpenAI server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.vllm.model import BUILD, DTYPE, KV_CACHE_BYTES, MAX_MODEL_LEN, embedded_model
from tokenpace.engine.vllm.config import ASYNC_SCHEDULER_CLS, local_environment

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(**json.loads(sys.argv[1]))
params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
outputs = llm.generate(["Hello there", "One two three", "Why is the sky blue?"], params,
                       use_tqdm=False)
print("LENGTHS", json.dumps([len(o.outputs[0].token_ids) for o in outputs]))
"""


def test_async_scheduler_in_engine_core_process(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    from tokenpace.engine.vllm.config import VllmEngineConfig

    model = embedded_model()
    log = tmp_path / "steps.jsonl"
    env = {**os.environ, **local_environment(BUILD)}
    # vLLM expects its cache and IPC folders to exist (a fresh checkout has no build/).
    for name in ("VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR"):
        Path(env[name]).mkdir(parents=True, exist_ok=True)
    env.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        TOKENPACE_POLICY="fcfs",
        TOKENPACE_STEP_LOG=str(log),
    )
    config = VllmEngineConfig(
        model=str(model),
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        dtype=DTYPE,
        async_scheduling=True,
    )
    kwargs = config.llm_kwargs()
    assert kwargs["scheduler_cls"] == ASYNC_SCHEDULER_CLS
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(kwargs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lengths = next(line for line in done.stdout.splitlines() if line.startswith("LENGTHS"))
    assert json.loads(lengths.split(" ", 1)[1]) == [10, 10, 10]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # Requests reach the engine-core process one by one; FCFS admits all that wait.
    admitted = [i for r in records for i in r["admitted_ids"]]
    assert sorted(admitted) == [0, 1, 2]
    assert all(len(r["planned_ids"]) == r["num_waiting"] for r in records)
    assert all(r["token_window"] is None for r in records)
    # Empty steps happen only with nothing left to run (vLLM's last call that tells the
    # workers which requests finished), never while requests wait.
    assert all(r["num_scheduled_tokens"] > 0 or r["num_waiting"] == 0 for r in records)
