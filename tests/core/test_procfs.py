"""Reading fields of /proc text files."""

from __future__ import annotations

from pathlib import Path

from tokenpace.core.procfs import proc_field


def test_a_field_is_the_first_matching_lines_value(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nflags\t\t: x\n")
    assert proc_field(cpuinfo, "flags") == "fpu avx2"
    assert proc_field(cpuinfo, "model name") is None
    assert proc_field(tmp_path / "missing", "flags") is None
