"""``dtype="auto"`` by the hardware rule: bfloat16 only where the CPU computes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpace.engine.dtype import cpu_has_native_bf16, resolve_dtype


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\n")
    return path


def test_bf16_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    assert not cpu_has_native_bf16(cpuinfo(tmp_path, "avx2 fma"))
    assert cpu_has_native_bf16(cpuinfo(tmp_path, "avx2 avx512f avx512_bf16"))
    assert cpu_has_native_bf16(cpuinfo(tmp_path, "amx_bf16 amx_tile"))
    assert not cpu_has_native_bf16(tmp_path / "missing")


def test_explicit_dtypes_pass_through_and_bad_names_are_named() -> None:
    assert resolve_dtype("float16", "cpu") == "float16"
    assert resolve_dtype("auto", "cpu") in ("float32", "bfloat16")
    with pytest.raises(ValueError, match="int8"):
        resolve_dtype("int8", "cpu")
