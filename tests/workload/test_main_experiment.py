from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokenpace.workload.gsm8k import load_prompts
from tokenpace.workload.main_experiment import PoissonWorkload


def test_paper_main_workload_shape() -> None:
    specs = PoissonWorkload().generate(np.random.default_rng(0))
    assert len(specs) == 250  # 18 req/s x 60 s > 250: the cap binds
    gaps = np.diff([s.arrival_s for s in specs])
    assert np.all(gaps >= 0) and 1 / 18 * 0.8 < gaps.mean() < 1 / 18 * 1.2
    many = PoissonWorkload(max_requests=100_000).generate(np.random.default_rng(1))
    prompts = np.array([s.num_prompt_tokens for s in many])
    outputs = np.array([s.true_output_tokens for s in many])
    assert prompts.min() >= 30 and prompts.max() <= 512
    short, medium = np.mean(prompts <= 80), np.mean((prompts >= 120) & (prompts <= 250))
    assert abs(short - 0.6) < 0.03 and abs(medium - 0.3) < 0.03
    assert set(outputs.tolist()) == {20, 50, 200}
    assert abs(np.mean(outputs == 20) - 0.5) < 0.03
    # The client cap is loose: every request asks for the mixture's largest length.
    assert {s.max_tokens for s in many} == {200}


def test_same_seed_same_workload() -> None:
    a = PoissonWorkload().generate(np.random.default_rng(7))
    b = PoissonWorkload().generate(np.random.default_rng(7))
    assert a == b


def test_gsm8k_prompts_attach_text(shared_data: Path) -> None:
    prompts = load_prompts(shared_data / "gsm8k_test.jsonl")
    assert len(prompts) == 1319 and prompts[0].startswith("Janet")
    specs = PoissonWorkload(max_requests=5).generate(np.random.default_rng(0), prompts)
    assert all(s.prompt in prompts for s in specs)


def test_bad_prompt_files_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok"}\n{"answer": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_prompts(bad)
