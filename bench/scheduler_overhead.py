"""Time TWP's per-step decision with 10,000 waiting and 256 running requests.

Prints one JSON object on its last line: waiting, running, decision_us_p50, l_min_ms and
ratio = decision time / l_min (the share of a decode step the decision costs).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request, RequestStatus
from tokenpace.core.step import StepState
from tokenpace.engine.profile import load_profile
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.policy import TwpPolicy


def build_state(num_waiting: int, num_running: int, rng: np.random.Generator) -> StepState:
    queue = WaitingQueue()
    for i in range(num_waiting):
        r = Request(i, int(rng.integers(30, 513)), int(rng.choice([20, 50, 200])), i * 1e-3)
        r.enqueued_step = 0
        queue.append(r)
    active = []
    for j in range(num_running):
        r = Request(num_waiting + j, int(rng.integers(30, 513)), 200, 0.0)
        r.status = RequestStatus.RUNNING
        r.token_times_s = [0.0] * int(rng.integers(1, 150))
        r.output_token_ids = [0] * len(r.token_times_s)
        r.num_computed_tokens = r.num_tokens - 1
        active.append(r)
    # Late enough that waits are long, early enough that nobody hits T_max (the common case).
    return StepState(
        now_s=20.0, step_index=50, last_step_latency_s=0.09, waiting=queue,
        running=tuple(active), num_free_blocks=5000, num_total_blocks=11100, block_size=16,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--profile", default="v100-llama-3.2-3b")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    state = build_state(args.waiting, args.running, np.random.default_rng(0))
    policy = TwpPolicy(TwpConfig.from_profile(profile))
    samples = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        policy.plan(state)
        samples.append(time.perf_counter() - start)
    p50_us = float(np.percentile(samples, 50)) * 1e6
    print(f"TWP decision: p50 {p50_us:.0f} us, p99 {np.percentile(samples, 99) * 1e6:.0f} us")
    result = {
        "waiting": args.waiting,
        "running": args.running,
        "decision_us_p50": round(p50_us, 1),
        "decision_us_p99": round(float(np.percentile(samples, 99)) * 1e6, 1),
        "l_min_ms": profile.l_min_ms,
        "ratio": round(p50_us / 1000 / profile.l_min_ms, 5),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
