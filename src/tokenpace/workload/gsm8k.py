"""Prompt text from a GSM8K-style JSONL file (one object per line with a "question")."""

from __future__ import annotations

import json
from pathlib import Path


def load_prompts(path: Path) -> list[str]:
    """Questions in file order. Raises FileNotFoundError for a missing file and ValueError
    naming the line of the first record without a string "question"."""
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
    prompts: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({error.msg})") from None
            question = record.get("question") if isinstance(record, dict) else None
            if not isinstance(question, str) or not question:
                raise ValueError(f'{path}:{line_number}: no string "question" field')
            prompts.append(question)
    if not prompts:
        raise ValueError(f"{path}: no prompts found")
    return prompts
