"""Context lengths as the bench and the environments write them: '8k', '1m', '5000'."""

from __future__ import annotations

import re


def parse_length(text: str) -> int:
    """'8k' -> 8192, '1m' -> 1048576 (binary, as the paper's 2^13..2^20), '5000' -> 5000."""
    t = text.strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([km]?)", t)
    if not m:
        raise ValueError(f"bad length {text!r}: use e.g. 2048, 8k, 1m")
    mult = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2)]
    return int(float(m.group(1)) * mult)


def format_length(n: int) -> str:
    if n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)}m"
    if n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)
