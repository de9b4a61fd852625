"""Amounts of US dollars as the user gives them (`--budget`, tfcluster.budget) and as lines show them."""

from __future__ import annotations

import re
from typing import Any

from tfcluster.errors import ConfigError


def parse_usd(key: str, value: Any) -> float:
    """US dollars >= 0 (0: none) from a flag, YAML or env value, or a ConfigError naming the key."""
    text = "x" if isinstance(value, bool) else str(value if value not in (None, "") else 0).strip().lstrip("$")
    if not re.fullmatch(r"\d{1,6}(\.\d*)?|\.\d+", text):
        raise ConfigError(f"{key} must be an amount of US dollars such as 25 or 7.50, 0 for none (got {value!r})")
    return float(text)


def usd(amount: float) -> str:
    """Dollars to the cent, or to a hundredth of a cent below ten cents (a short run's cost)."""
    return f"${amount:.2f}" if amount >= 0.1 else f"${amount:.4f}"
