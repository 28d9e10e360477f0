"""Server parts that need no running server: text deltas, admission bounds, error bodies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenpace.server.admission import AdmissionQueue, QueueBounds
from tokenpace.server.errors import describe_validation


class CharTokenizer:
    """One token per character: token id = code point."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def push_all(text: str, stop: tuple[str, ...]) -> tuple[list[str], str]:
    from tokenpace.server.detokenize import IncrementalText

    inc = IncrementalText(CharTokenizer(), stop)
    deltas = [inc.push(ord(c)) for c in text]
    deltas.append(inc.finish())
    return deltas, inc.text


def test_deltas_concatenate_to_the_final_text() -> None:
    deltas, text = push_all("hello world", ())
    assert "".join(deltas) == text == "hello world"


def test_stop_string_is_cut_and_its_prefix_held_back() -> None:
    deltas, text = push_all("abc END tail", ("END",))
    assert text == "abc "
    assert "".join(deltas) == "abc "
    # "E" and "EN" could start the stop string: nothing after "abc " leaves early.
    assert all("E" not in d for d in deltas)


def test_a_false_stop_prefix_is_released() -> None:
    deltas, text = push_all("EXIT", ("END",))
    assert text == "EXIT" and "".join(deltas) == "EXIT"


def test_admission_bounds_requests_and_tokens() -> None:
    queue = AdmissionQueue(QueueBounds(max_requests=2, max_tokens=100))
    assert queue.try_reserve(1, 60)
    assert not queue.try_reserve(2, 50)  # tokens
    assert queue.try_reserve(3, 40)
    assert not queue.try_reserve(4, 1)  # requests
    queue.release(1)
    queue.release(1)  # idempotent
    assert queue.num_requests == 1 and queue.num_tokens == 40
    assert queue.try_reserve(5, 60)


@pytest.mark.parametrize(
    ("errors", "param"),
    [
        ([{"type": "json_invalid", "loc": ("body", 3), "msg": "x"}], None),
        ([{"type": "missing", "loc": ("body", "prompt"), "msg": "Field required"}], "prompt"),
        ([{"type": "int_type", "loc": ("body", "max_tokens"), "msg": "bad"}], "max_tokens"),
        ([{"type": "string_type", "loc": ("body", "stream", "bool"), "msg": "bad"}], "stream"),
        ([{"type": "missing", "loc": ("body",), "msg": "Field required"}], None),
    ],
)
def test_validation_errors_name_the_top_level_field(
    errors: list[dict[str, Any]], param: str | None
) -> None:
    message, got = describe_validation(errors)
    assert got == param
    assert message


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--engine", "tgi"], "--engine 'tgi' is not a valid choice; valid choices: native, vllm"),
        (["--containers", "2", "--warm-containers", "3"], "--warm-containers must be in"),
        (["--keep-alive", "0"], "--keep-alive must be > 0, got 0.0"),
        (["--ray-address", "auto", "--ray-cpus-per-engine", "0"], "--ray-cpus-per-engine"),
        (["--ray-gpus-per-engine", "1"], "--ray-cpus-per-engine and --ray-gpus-per-engine need"),
        (["--router", "random"], "--router 'random' is not a valid choice; valid choices: "),
        (["--log-level", "debug"], "unrecognized arguments: --log-level"),
        (["--profile", "missing.json"], "--profile: profile file 'missing.json' does not exist"),
    ],
)
def test_bad_serve_flags_exit_2_naming_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenpace.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tokenpace serve: error: {named}")
    assert err.count("\n") == 1


def test_serve_flags_follow_vllm_names_and_read_a_config_file(tmp_path: Path) -> None:
    from tokenpace.cli.command import dump_config, parse_config
    from tokenpace.server.options import ServeOptions

    argv = ["--host", "0.0.0.0", "--port", "9000", "--max-num-seqs", "8", "--dtype", "float32",
            "--max-model-len", "512", "--served-model-name", "m", "--uvicorn-log-level", "debug",
            "--keep-alive", "5", "--containers", "2", "--block-size", "64",
            "--max-num-batched-tokens", "4096", "--seed", "7",
            "--tokenizer", str(tmp_path)]  # fmt: skip
    options = parse_config(ServeOptions, argv, prog="t").config
    assert options == ServeOptions(
        host="0.0.0.0", port=9000, max_num_seqs=8, dtype="float32", max_model_len=512,
        served_model_name="m", log_level="debug", keep_alive_s=5.0, containers=2,
        block_size=64, max_num_batched_tokens=4096, seed=7, tokenizer=tmp_path,
    )  # fmt: skip
    path = tmp_path / "serve.yaml"
    path.write_text(dump_config(options))
    assert "uvicorn-log-level: debug" in path.read_text()
    assert parse_config(ServeOptions, ["--config", str(path)], prog="t").config == options


def test_engine_configs_take_the_vllm_named_settings(tmp_path: Path) -> None:
    from tokenpace.server.engines import ENGINE_CONFIGS
    from tokenpace.server.options import ServeOptions

    config = {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 30}))
    options = ServeOptions(block_size=64, max_num_batched_tokens=4096, seed=7)
    native: Any = ENGINE_CONFIGS.get("native")(options, tmp_path)
    assert native.block_size == 64
    vllm: Any = ENGINE_CONFIGS.get("vllm")(options, tmp_path)
    assert (vllm.block_size, vllm.max_num_batched_tokens, vllm.seed) == (64, 4096, 7)
    defaults: Any = ENGINE_CONFIGS.get("vllm")(ServeOptions(), tmp_path)
    assert (defaults.block_size, defaults.max_num_batched_tokens, defaults.seed) == (32, 2048, 0)


def test_vllm_kv_budget_follows_the_model_shape(tmp_path: Path) -> None:
    from tokenpace.server.engines import kv_bytes_per_token

    config = {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 30}))
    # keys and values x 30 layers x 3 KV heads x 64 dims x 2 bytes
    assert kv_bytes_per_token(tmp_path, "bfloat16") == 2 * 30 * 3 * 64 * 2


def test_min_tokens_ignores_stop_strings_that_end_before_it() -> None:
    from tokenpace.server.detokenize import IncrementalText

    inc = IncrementalText(CharTokenizer(), ("X",), min_tokens=4)
    deltas = [inc.push(ord(c)) for c in "aXbcXd"]
    deltas.append(inc.finish())
    # The first X is token 2 (< 4): kept. The second ends at token 5: it stops.
    assert inc.text == "aXbc" and inc.stopped
    assert "".join(deltas) == "aXbc"


def test_should_stop_waits_for_min_tokens() -> None:
    from tokenpace.core.sampling import SamplingParams
    from tokenpace.engine.native.stopping import should_stop

    eos = frozenset({0})
    early = SamplingParams(min_tokens=3)
    assert not should_stop(CharTokenizer(), eos, early, [ord("a")], 0)
    assert should_stop(CharTokenizer(), eos, early, [ord("a"), ord("b")], 0)
    resumed = SamplingParams(min_tokens=3, first_output_index=2)
    assert should_stop(CharTokenizer(), eos, resumed, [], 0)


def test_stop_token_ids_end_generation_even_with_ignore_eos_but_not_before_min_tokens() -> None:
    from tokenpace.core.sampling import SamplingParams
    from tokenpace.engine.native.stopping import should_stop

    eos = frozenset({0})
    params = SamplingParams(stop_token_ids=(ord(","),), ignore_eos=True)
    assert should_stop(CharTokenizer(), eos, params, [ord("a")], ord(","))
    assert not should_stop(CharTokenizer(), eos, params, [ord("a")], 0)  # EOS ignored
    assert not should_stop(CharTokenizer(), eos, params, [ord("a")], ord("b"))
    early = SamplingParams(stop_token_ids=(ord(","),), min_tokens=3)
    assert not should_stop(CharTokenizer(), eos, early, [ord("a")], ord(","))


def test_logprob_formatter_shapes() -> None:
    from tokenpace.core.logprobs import TokenLogprob
    from tokenpace.server.logprob_format import LogprobFormatter, LogprobItem

    items = [
        LogprobItem(ord("h"), None),
        LogprobItem(ord("i"), TokenLogprob(ord("i"), -0.5, ((ord("o"), -0.3),))),
    ]
    completion = LogprobFormatter(CharTokenizer(), chat=False).format(items)
    assert completion == {
        "tokens": ["h", "i"],
        "token_logprobs": [None, -0.5],
        "top_logprobs": [None, {"o": -0.3, "i": -0.5}],
        "text_offset": [0, 1],
    }
    chat = LogprobFormatter(CharTokenizer(), chat=True).format(items[1:])
    assert chat == {
        "content": [
            {
                "token": "i",
                "logprob": -0.5,
                "bytes": [105],
                "top_logprobs": [{"token": "o", "logprob": -0.3, "bytes": [111]}],
            }
        ]
    }


def test_online_calibration_is_on_by_default_and_a_flag_turns_it_off(tmp_path: Path) -> None:
    from tokenpace.cli.command import parse_config
    from tokenpace.profiling.online import OnlineCalibrationConfig
    from tokenpace.server.main import worker_spec
    from tokenpace.server.options import ServeOptions

    (tmp_path / "config.json").write_text("{}")
    on = parse_config(ServeOptions, [], prog="t").config
    assert worker_spec(on, tmp_path).online_calibration == OnlineCalibrationConfig()
    off = parse_config(ServeOptions, ["--no-online-calibration"], prog="t").config
    assert worker_spec(off, tmp_path).online_calibration is None


def test_a_given_profile_replaces_calibration_and_must_match_the_precision(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from tokenpace.engine.profile import load_profile
    from tokenpace.server.main import worker_spec
    from tokenpace.server.options import ServeOptions

    (tmp_path / "config.json").write_text("{}")
    assert worker_spec(ServeOptions(), tmp_path).profile is None
    shipped = load_profile("v100-llama-3.2-3b")
    spec = worker_spec(ServeOptions(profile="v100-llama-3.2-3b"), tmp_path)
    assert spec.profile == shipped
    measured = tmp_path / "measured.json"
    measured.write_text(replace(shipped, dtype="bfloat16").to_json())
    for dtype in ("bfloat16", "auto"):
        given = worker_spec(ServeOptions(profile=str(measured), dtype=dtype), tmp_path).profile
        assert given is not None and given.dtype == "bfloat16"
    with pytest.raises(ValueError, match="measured in bfloat16, but --dtype is float32"):
        worker_spec(ServeOptions(profile=str(measured), dtype="float32"), tmp_path)
    with pytest.raises(ValueError, match=r"--profile: profile file .*missing.json' does not exist"):
        worker_spec(ServeOptions(profile=str(tmp_path / "missing.json")), tmp_path)
    with pytest.raises(ValueError, match="--profile: no profile named 'nosuch'; shipped: v100"):
        worker_spec(ServeOptions(profile="nosuch"), tmp_path)
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x"}')
    with pytest.raises(ValueError, match="--profile: profile is missing keys: "):
        worker_spec(ServeOptions(profile=str(broken)), tmp_path)
