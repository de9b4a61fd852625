"""Terminal output: per-worker colours, event lines and tables (rich)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

WORKER_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
                  "bright_magenta")

console = Console(highlight=False)


def worker_colour(index: int) -> str:
    return WORKER_COLOURS[index % len(WORKER_COLOURS)]


def prefixed(index: int, name: str, line: str, width: int = 9) -> Text:
    text = Text(f"{name:<{width}}│ ", style=worker_colour(index))
    text.append(line)
    return text


def format_metrics(metrics: dict[str, float]) -> str:
    return "  ".join(f"{key} {value:.4f}" for key, value in sorted(metrics.items()))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def table(title: str, columns: list[str]) -> Table:
    result = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        result.add_column(column, overflow="fold")
    return result
