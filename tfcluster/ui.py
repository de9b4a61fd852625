"""Terminal output: per-worker colours, event lines and tables (rich)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.measure import Measurement
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


class WordTable(Table):
    """A table that never breaks a word across lines (a path, a run id, a URL stay whole, to copy): when
    the console is narrower than its longest words, it is drawn wider, and the terminal wraps its lines
    as they are. Text with spaces still wraps at the spaces. Print it with ``show``."""

    def __rich_console__(self, console, options):
        least = Measurement.get(console, options.update(max_width=UNBOUNDED), self).minimum
        if least > options.max_width:
            options = options.update(width=least, max_width=least)
        yield from super().__rich_console__(console, options)


# A width no table reaches: what "as wide as its words need" is measured against.
UNBOUNDED = 10_000


def table(title: str, columns: list[str]) -> WordTable:
    result = WordTable(title=title, title_justify="left", header_style="bold")
    for column in columns:
        result.add_column(column, overflow="fold")
    return result


def show(rendered: Table) -> None:
    """Print a table: soft-wrapped, so a table wider than the console is not cropped to it."""
    console.print(rendered, soft_wrap=True)
