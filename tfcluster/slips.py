"""A command line invoke's parser refuses, said as one `error:` line with the fix (exit 2).

invoke answers a slip with "No idea what '--epochs' is!" and exit 1. The commonest slip on the main
path is a trainer or script flag before `--` (`train --epochs 5`), then a typo (`--wrokers`, `trian`).
``explain`` names the fix: the command as it should have been typed, or the close name meant.
tfcluster/program.py installs it on invoke's Program (the `tfcluster` command, and `invoke` in a clone
through tasks.py).

May import: tfcluster.spoken (the program's name) and invoke's parser types.
"""

from __future__ import annotations

import difflib
import re
import shlex

from invoke.exceptions import ParseError
from invoke.parser import ParserContext

from tfcluster import spoken

# Tasks whose words after `--` go to a program of the user's (the trainer, a script, the tuner).
PASSES_ARGS = ("train", "tune")

_UNKNOWN = re.compile(r"No idea what '(.*)' is!")
_NEEDS_VALUE = re.compile(r"Flag '?(?:<Argument: )?([\w-]+).* needed value and was not given one!")


# A task's positional argument that may be left out, and what it then is (invoke requires every
# positional): `ssh` alone is a shell on the chief.
DEFAULT_POSITIONALS = {"ssh": "worker-0"}


def default_positionals(unparsed: list[str]) -> list[str]:
    """``unparsed`` with each left-out positional of DEFAULT_POSITIONALS filled in (before `-h` too, so
    that it stays help)."""
    words = list(unparsed)
    for index in range(len(words) - 1, -1, -1):
        default = DEFAULT_POSITIONALS.get(words[index])
        as_task = index == 0 or not words[index - 1].startswith("-")  # Not a flag's value (--backend ssh).
        if default is not None and as_task and (index + 1 == len(words) or words[index + 1].startswith("-")):
            words.insert(index + 1, default)
    return words


def _long_flags(context: ParserContext) -> list[str]:
    return sorted(flag for flag in context.flags if flag.startswith("--"))


def _close(word: str, choices: list[str]) -> str | None:
    """The one choice ``word`` is a slip of: a prefix of it, or close in spelling."""
    prefixed = [choice for choice in choices if choice.startswith(word) and len(word) > 3]
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return close[0] if close else None


def _split_for_trainer(context: ParserContext, tokens: list[str]) -> tuple[list[str], list[str]]:
    """The task's own flags (with their values), and what goes after `--` (everything else)."""
    own: list[str] = []
    passed: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        name = token.split("=", 1)[0]
        flag = context.flags.get(name) if name.startswith("-") else None
        if flag is not None:
            own.append(token)
            if flag.takes_value and "=" not in token and index + 1 < len(tokens):
                own.append(tokens[index + 1])
                index += 1
        else:
            passed.append(token)
        index += 1
    return own, passed


def _task_tokens(name: str, unparsed: list[str]) -> list[str]:
    """The words given to task ``name`` (after its name, up to the next task's)."""
    if name not in unparsed:
        return []
    return unparsed[unparsed.index(name) + 1:]


def explain(error: ParseError, contexts: dict[str, ParserContext], unparsed: list[str],
            remainder: str = "") -> str:
    """One line for ``error``; ``contexts``: the tasks' parser contexts, ``unparsed``: the words after
    invoke's core options, ``remainder``: what came after `--`."""
    program = spoken.PROGRAM
    context = error.context
    message = str(error)
    tasks = sorted(name for name in contexts if not name.startswith("-"))
    unknown = _UNKNOWN.fullmatch(message)
    if unknown is None:
        needs = _NEEDS_VALUE.match(message)
        if needs:
            flag = needs.group(1)
            flag = flag if flag.startswith("-") else "--" + flag.replace("_", "-")
            where = f" {context.name}" if context is not None and context.name else ""
            return f"{flag} needs a value; see `{program} --help{where}`"
        return f"{message.rstrip('!')}; see `{program} --help`"
    word = unknown.group(1)
    if context is None or not context.name or not word.startswith("-"):
        meant = _close(word, tasks)
        hint = f"did you mean {meant}? " if meant else ""
        if context is not None and context.name in PASSES_ARGS and meant is None:
            return (f"{context.name} takes no word {word!r} before `--`; arguments for the trainer or script go "
                    f"after it: {program} {context.name} -- {shlex.quote(word)}")
        return f"no task {word!r}; {hint}`{program} --list` lists them"
    name = context.name
    flag = word.split("=", 1)[0]
    meant = _close(flag, _long_flags(context))
    if meant:
        return f"{name} has no {flag}; did you mean {meant}? (`{program} --help {name}` lists its options)"
    if name in PASSES_ARGS:
        own, passed = _split_for_trainer(context, _task_tokens(name, unparsed))
        fixed = shlex.join([program, name, *own, "--", *passed]) + (f" {remainder}" if remainder else "")
        whose = "trainer and script flags" if name == "train" else "the search's and script's flags"
        return f"{whose} go after `--`: {fixed}"
    options = _long_flags(context)
    if not options:
        return f"{name} takes no options (it covers every cluster); see `{program} --help {name}`"
    return f"{name} has no {flag} (its options: {', '.join(options)}); see `{program} --help {name}`"
