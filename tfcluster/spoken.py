"""The name the user runs tfcluster by, and every hint said with it.

Messages across tfcluster are written with `invoke TASK` ("run: invoke up"), which is right in a clone,
where `invoke` loads tasks.py. The installed command is `tfcluster`, and outside a clone `invoke` finds
no tasks at all. ``PROGRAM`` is set once by the entry point that runs (tfcluster/program.py for
`tfcluster`; `invoke` leaves the default), and ``respell`` says a message's hints with it; the tasks'
error lines (tfcluster/cli.py) and the console (``respell_console``) pass through it, so no message
needs to know which command runs it.

May import: rich only (no tfcluster module).
"""

from __future__ import annotations

import re

from rich.console import Console, ConsoleRenderable
from rich.text import Text

# "invoke" (tasks.py in a clone) or "tfcluster" (the installed console script).
PROGRAM = "invoke"

# The task names a hint may name after the program (tfcluster/cli.py's ns; "--list", "--help" too).
_TASKS = ("check", "offers", "up", "train", "tune", "status", "costs", "logs", "stop", "down", "data", "idle",
          "pull", "tensorboard", "image", "ssh", "exec", "--list", "--help", "-l")
_HINT = re.compile(r"\binvoke (?=(?:%s)(?![\w-]))" % "|".join(re.escape(task) for task in _TASKS))


def set_program(name: str) -> None:
    """Called once by the entry point: the name hints use from then on."""
    global PROGRAM
    PROGRAM = name


def respell(message: str) -> str:
    """``message`` with each `invoke TASK` hint said as the user runs tfcluster."""
    if PROGRAM == "invoke":
        return message
    return _HINT.sub(f"{PROGRAM} ", message)


def _respelled_text(text: Text) -> Text:
    matches = list(_HINT.finditer(text.plain)) if PROGRAM != "invoke" else []
    if not matches:
        return text
    out = text.blank_copy()
    last = 0
    for match in matches:
        out.append_text(text[last:match.start()])
        out.append(f"{PROGRAM} ", style=text.get_style_at_offset(Console(), match.start()))
        last = match.end()
    out.append_text(text[last:])
    return out


class _RespellHook:
    """A rich render hook: every Text the console prints has its hints respelled (tables and live
    displays pass through unchanged)."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_respelled_text(item) if isinstance(item, Text) else item for item in renderables]


def respell_console(console: Console) -> None:
    """Install the hook on ``console`` (once)."""
    if id(console) not in _HOOKED:
        _HOOKED.add(id(console))
        console.push_render_hook(_RespellHook())


_HOOKED: set[int] = set()
