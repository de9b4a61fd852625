"""The documentation says what the code does: a short README whose test command is CI's, a command
table that `invoke --list` and `invoke --help TASK` agree with, a troubleshooting entry for every
`error:` line, and terraform/README.md's variables table generated from variables.tf.

The site itself (`mkdocs build --strict`, every internal link and anchor) is built by .ci/run's
docs phase, in its own venv.

    python -m tests.test_docs --write-terraform-table   regenerate terraform/README.md's table
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hcl2

from tests import docs_messages

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_LIMIT = 250
TERRAFORM_README = REPO / "terraform" / "README.md"
TABLE_START = "<!-- variables: generated from variables.tf by `python -m tests.test_docs --write-terraform-table` -->"
TABLE_END = "<!-- end of variables -->"


def section(markdown: str, heading: str) -> str:
    """The text under a `## heading`, up to the next heading of the same level."""
    match = re.search(rf"(?ms)^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown)
    assert match, f"README.md has no '## {heading}' section"
    return match[1]


def test_readme_is_read_in_ten_minutes():
    lines = len(README.read_text().splitlines())
    assert lines <= README_LIMIT, f"README.md has {lines} lines (at most {README_LIMIT}): move detail to docs/"


def readme_test_command(markdown: str) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", section(markdown, "Run the tests"), re.S)
    assert block, "README.md's 'Run the tests' section has no ```bash block"
    return [line.strip() for line in block[1].strip().splitlines()]


def ci_runs_it(command: list[str], ci_script: str) -> list[str]:
    """The README's lines that .ci/run does not run as they are (the venv line may be split in two)."""
    ci_lines = {line.strip() for line in ci_script.splitlines()}
    missing = []
    for line in command:
        parts = [part.strip() for part in line.split("&&")] if line.startswith("python3 -m venv") else [line]
        missing += [line for part in parts if part not in ci_lines][:1]
    return missing


def test_the_readme_test_command_is_the_one_ci_runs():
    command = readme_test_command(README.read_text())
    differs = ci_runs_it(command, (REPO / ".ci" / "run").read_text())
    assert differs == [], f"README.md's test command differs from what .ci/run runs: {differs}"
    assert "python -m pytest" in command[-1]
    # Seen failing: a changed README line is named.
    assert ci_runs_it([*command[:-1], command[-1] + " -x"], (REPO / ".ci" / "run").read_text()) == [command[-1] + " -x"]


def command_table(markdown: str) -> dict[str, set[str]]:
    """task -> the --flags its row of the README's command table names."""
    rows = {}
    for line in section(markdown, "Commands").splitlines():
        match = re.match(r"\| `invoke ([a-z]+)([^`]*)`", line)
        if match:
            rows[match[1]] = set(re.findall(r"--[a-z][a-z-]*", match[2]))
    return rows


def invoke(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def listed_tasks(listing: str) -> set[str]:
    return set(re.findall(r"(?m)^  ([a-z][a-z-]*)\s", listing))


def help_options(text: str) -> set[str]:
    return set(re.findall(r"--([a-z][a-z-]*)", text.split("Options:", 1)[1]))


def table_disagreements(rows: dict[str, set[str]], tasks: set[str], options: dict[str, set[str]]) -> list[str]:
    found = [f"`invoke {name}` is in `invoke --list` but not in the README's command table"
             for name in sorted(tasks - set(rows))]
    found += [f"`invoke {name}` is in the README's command table but not in `invoke --list`"
              for name in sorted(set(rows) - tasks)]
    found += [f"`invoke {name}`: the README names {flag}, which `invoke --help {name}` does not list"
              for name in sorted(set(rows) & tasks) for flag in sorted(rows[name] - {f"--{o}" for o in options[name]})]
    return found


def test_the_command_table_is_what_invoke_lists():
    rows = command_table(README.read_text())
    tasks = listed_tasks(invoke("--list"))
    assert {"up", "train", "down"} <= tasks
    with ThreadPoolExecutor(max_workers=4) as pool:
        options = dict(zip(sorted(tasks), pool.map(lambda name: help_options(invoke("--help", name)), sorted(tasks))))
    assert "backend" in options["up"] and "gcp" in invoke("--help", "up")
    disagreements = table_disagreements(rows, tasks, options)
    assert disagreements == [], "README.md's command table:\n" + "\n".join(disagreements)
    # Seen failing: a task missing from the table, one that does not exist, a flag it does not have.
    broken = {**{k: v for k, v in rows.items() if k != "stop"}, "launch": set(), "up": rows["up"] | {"--gpus"}}
    assert table_disagreements(broken, tasks, options) == [
        "`invoke stop` is in `invoke --list` but not in the README's command table",
        "`invoke launch` is in the README's command table but not in `invoke --list`",
        "`invoke up`: the README names --gpus, which `invoke --help up` does not list",
    ]


def test_troubleshooting_has_an_entry_for_every_error_line():
    found = docs_messages.messages()
    assert len(found) > 100 and any(m.where.startswith("startup/") for m in found)
    lacking = docs_messages.missing(docs_messages.TROUBLESHOOTING.read_text(), found)
    assert not lacking, (
        f"docs/troubleshooting.md has no entry for {len(lacking)} error line(s); add each (`…` where a value is "
        "filled in) with its fix, or list them with `python -m tests.docs_messages --missing`:\n"
        + "\n".join(f"  {m.where}: error: {m.template}" for m in lacking))


def test_the_message_collector_sees_each_kind_of_message(tmp_path):
    """f-strings, concatenations, the wrapping classes and the boot script's fail lines."""
    (tmp_path / "m.py").write_text(
        'raise ConfigError(f"workers must be at most {n} (got {w})")\n'
        'raise ClusterError("no cluster; " + f"run {cmd}")\n'
        'raise HostErrors("VM start-up", errors)\n'
        'raise HostUnreachable(host, f"cannot connect to port {port}: {e}")\n'
        'raise ValueError("internal")\n')
    (tmp_path / "s.sh").write_text('fail "pip install tensorflow==$TF failed: $(tail -n 1 "$LOG")"\n')
    docs_messages.REPO, saved = tmp_path, docs_messages.REPO
    try:
        python = [m.template for m in docs_messages.python_messages(tmp_path / "m.py")]
        shell = [m.template for m in docs_messages.boot_script_messages(tmp_path / "s.sh")]
    finally:
        docs_messages.REPO = saved
    assert python == ["workers must be at most … (got …)", "no cluster; run …",
                      "VM start-up failed on … host(s): …", "… is unreachable: cannot connect to port …: …"]
    assert shell == ["pip install tensorflow==… failed: …"]
    assert [m.template for m in docs_messages.missing("error: no cluster;\n run …", [
        docs_messages.Message("no cluster; run …", "m.py:2"), docs_messages.Message("other", "m.py:9")])] == ["other"]


def test_readme_links_point_at_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local and [link for link in local if not (REPO / link).exists()] == []


def ci_docs_build(ci_script: str) -> list[str]:
    """.ci/run's mkdocs command lines (comments dropped)."""
    return [line.split("#", 1)[0].split() for line in ci_script.splitlines() if "mkdocs build" in line.split("#", 1)[0]]


def test_ci_builds_the_site_strictly_and_any_new_page_joins_it():
    builds = ci_docs_build((REPO / ".ci" / "run").read_text())
    # --quiet would hide the warnings --strict counts: a broken link would then pass (seen: it did).
    assert builds and all("--strict" in b and "--quiet" not in b and "-q" not in b for b in builds), builds
    config = (REPO / "mkdocs.yml").read_text()
    # A reading order (nav:) that lists every page once; the strict build fails on a page left out of it.
    from invoke.util import yaml

    pages = [next(iter(item.values())) for item in yaml.safe_load(config)["nav"]]
    assert sorted(pages) == sorted(path.name for path in (REPO / "docs").glob("*.md")) and pages[0] == "index.md"
    for check in ("not_found: warn", "anchors: warn", "omitted_files: warn"):
        assert check in config


def undocumented_settings(keys, markdown: str) -> list[str]:
    table = {key for line in markdown.splitlines() if line.startswith("| `")
             for key in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    return [key for key in keys if key not in table]


def test_every_setting_is_in_the_configuration_guide():
    from tfcluster import config

    markdown = (REPO / "docs" / "configuration.md").read_text()
    assert undocumented_settings(config.DEFAULTS, markdown) == []
    assert undocumented_settings([*config.DEFAULTS, "new_key"], markdown) == ["new_key"]  # seen failing


def _hcl_string(value) -> str:
    return str(value)[1:-1].replace('\\"', '"') if str(value).startswith('"') else str(value)


def terraform_variables_table(variables_tf: Path) -> str:
    """The README table of every variable: name, type, default (or required), description."""
    rows = ["| variable | type | default | description |", "|---|---|---|---|"]
    for block in hcl2.load(variables_tf.open())["variable"]:
        ((quoted, body),) = block.items()
        if "default" not in body:
            default = "(required)"
        elif isinstance(body["default"], bool):
            default = str(body["default"]).lower()
        elif body["default"] == '""':
            default = '`""`'
        else:
            default = f"`{_hcl_string(body['default'])}`"
        kind = str(body["type"]).removeprefix("${").removesuffix("}")
        description = _hcl_string(body["description"]).replace("|", "\\|")
        rows.append(f"| `{quoted.strip(chr(34))}` | {kind} | {default} | {description} |")
    return "\n".join(rows)


def written_table(readme: str) -> str:
    start, end = readme.find(TABLE_START), readme.find(TABLE_END)
    assert 0 <= start < end, f"terraform/README.md lacks the markers {TABLE_START!r} ... {TABLE_END!r}"
    return readme[start + len(TABLE_START):end].strip()


def test_the_terraform_variables_table_is_variables_tf():
    generated = terraform_variables_table(REPO / "terraform" / "variables.tf")
    assert generated.count("\n| `") >= 20 and "| `project` | string | (required) |" in generated
    assert written_table(TERRAFORM_README.read_text()) == generated, \
        "terraform/README.md's variables table is stale: run python -m tests.test_docs --write-terraform-table"


def write_terraform_table() -> None:
    readme = TERRAFORM_README.read_text()
    old = written_table(readme)
    generated = terraform_variables_table(REPO / "terraform" / "variables.tf")
    TERRAFORM_README.write_text(readme.replace(old, generated, 1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-terraform-table"]:
        write_terraform_table()
    else:
        sys.exit(f"usage: python -m tests.test_docs --write-terraform-table ({shlex.join(sys.argv[1:])}?)")
