"""Every ``ctrlrun …`` command the project tells a user to run names a real command and real options.

Where the commands are found:

- Markdown (README.md, docs/*.md, examples/*/README.md, adapters/*/README.md): the command lines
  of shell-like fenced blocks (``$ ctrlrun …`` in ``console``, ``ctrlrun …`` in ``bash`` and
  ``text``, the output lines a CLI prints there too), and in prose every code span that starts
  with ``ctrlrun``, every ``(ctrlrun …)`` and every ``…:  ctrlrun …`` (a command after a colon).
- The examples' YAML and Python files: the same in their comments, docstrings and strings, and
  literal command lines indented four spaces.
- The CLI's own messages (string literals under ``src/ctrlrun/``): the same three shapes.

Each command is walked against the real ``ctrlrun`` click group: every subcommand and every
option it names must exist (synopses such as ``[--limit N | --all]`` and ``--committed|--failed``
are read as alternatives; placeholders such as ``<id>`` and ``apr_…`` are positional values and
need no substitute). The demo's hints go further: they are run, as printed, by ``sh`` in the
directory the demo ran in, and must exit 0. Every example's script answers ``--help`` without
acting and refuses an unknown option with exit 2.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

import ctrlrun
from ctrlrun.cli import cli

from ._cli_helpers import tree
from .vectors import ROOT

SRC = Path(ctrlrun.__file__).resolve().parents[1]  # the ctrlrun under test, for subprocesses
EXAMPLES = ROOT / "examples"
MARKDOWN = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *EXAMPLES.glob("*/README.md"),
                   *ROOT.glob("adapters/*/README.md")])  # fmt: skip
EXAMPLE_SOURCES = sorted([*EXAMPLES.glob("*/*.py"), *EXAMPLES.glob("*/*.yaml")])
#: Fenced blocks whose lines are commands (and the output they print), not code.
SHELL_LANGUAGES = frozenset({"", "console", "bash", "sh", "shell", "text"})
#: A value in an f-string, kept as a marker: an option spelt around one (``--{outcome}``) is not checked.
DYNAMIC = "\x00"
#: Where a command starts: optional ``NAME=value`` prefixes, then the program.
START = r"(?:[A-Z_][A-Z0-9_]*=\S*\s+)*ctrlrun(?![\w.\-\[/])"
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
AFTER_COLON = re.compile(rf":[ \t]+({START}[ \t][^\n`]*)")
IN_PARENS = re.compile(rf"\(({START}[ \t][^()\n`]*)\)")
LITERAL_LINE = re.compile(rf"^\s*(?:#)?[ \t]{{4,}}({START}[ \t].*)$")
MENTION = re.compile(r"(?<![\w./\-`])ctrlrun\s")
#: Shell operators that end the command in a concrete (non-synopsis) line.
SHELL_STOPS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "2>&1", "&"})
#: Examples whose script another change owns; checked here only once their framework is installed.
OWNED_ELSEWHERE = {"openai-agents-support": "ctrlrun_openai_agents"}
COMMAND_NAMES = frozenset(cli.list_commands(click.Context(cli)))


@dataclass(frozen=True)
class Command:
    where: str  # file:line, or a description
    text: str


# --------------------------------------------------------------------------- finding commands


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _join_continuations(text: str) -> str:
    """``\\`` at the end of a line (or ``\\\\`` in Python source) continues the command."""
    return re.sub(r"[ \t]*\\{1,2}\n[ \t]*", " ", text)


def _names_a_command(text: str) -> bool:
    """Whether the word after ``ctrlrun`` is a command or an option: "(ctrlrun did not write it)"
    and "…: ctrlrun records what…" are sentences, not commands."""
    words = re.sub(START, "ctrlrun", text, count=1).split()
    return len(words) > 1 and (words[1].startswith("-") or words[1] in COMMAND_NAMES)


def commands_in_text(text: str, where: str, first: int = 1, *, prose: bool = False) -> list[Command]:
    """The commands in a comment, a docstring, a message or an output line (``text`` starts on
    line ``first`` of ``where``): code spans, and ``(ctrlrun …)``, ``…: ctrlrun …`` and literal
    lines indented four spaces when they name a command. In Markdown ``prose`` only code spans
    are commands ("the step runs: ctrlrun re-decides…" is a sentence)."""
    found: list[Command] = []
    for match in CODE_SPAN.finditer(text):
        body = " ".join(match.group(2).split())
        if re.fullmatch(rf"{START}\s.*", body) and not re.match(r"ctrlrun [\w-]+: ", body):  # a log line
            found.append(Command(f"{where}:{first - 1 + _line_of(text, match.start())}", body))
    if prose:
        return found
    joined = _join_continuations(text)  # a continued command is one line (later line numbers shift)
    candidates = [(m.start(), m.group(1)) for p in (AFTER_COLON, IN_PARENS) for m in p.finditer(joined)]
    offset = 0
    for line in joined.splitlines(True):
        literal = LITERAL_LINE.match(line.rstrip("\n"))
        if literal and not AFTER_COLON.search(line):
            candidates.append((offset, literal.group(1)))
        offset += len(line)
    for offset, command in sorted(candidates):
        if _names_a_command(command):
            found.append(Command(f"{where}:{first - 1 + _line_of(joined, offset)}", command.strip()))
    return found


def _shell_block(lines: list[str], language: str, first: int, where: str) -> list[Command]:
    """A shell-like fenced block: ``$ ctrlrun …`` lines, ``ctrlrun …`` lines (a ``text`` synopsis
    may go on over indented lines), and any command printed in the output lines."""
    found: list[Command] = []
    number = 0
    body = _join_continuations("\n".join(lines) + "\n").splitlines()
    while number < len(body):
        line = body[number].strip()
        prompt = line.startswith("$ ")
        command = line[2:] if prompt else line
        if re.match(rf"{START}(\s|$)", command) and (prompt or language != "console"):
            start = number
            continued = language == "text" and not prompt
            while continued and number + 1 < len(body) and body[number + 1][:1].isspace():
                number += 1
                command += " " + body[number].strip()
            found.append(Command(f"{where}:{first + start + 1}", command))
        elif not prompt:
            found.extend(commands_in_text(body[number], where, first + number + 1))
        number += 1
    return found


def markdown_commands(path: Path) -> list[Command]:
    where = str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Command] = []
    prose: list[str] = []
    block: list[str] | None = None
    language, opened = "", 0
    for number, line in enumerate(lines):
        fence = re.match(r"^\s*```(\S*)", line)
        if block is None and fence:
            block, language, opened = [], fence.group(1), number + 1
            prose.append("")
        elif block is not None and fence:
            if language in SHELL_LANGUAGES:
                found.extend(_shell_block(block, language, opened, where))
            else:
                for offset, code in enumerate(block):  # comments in python/yaml blocks
                    found.extend(commands_in_text(code, where, opened + offset + 1))
            block = None
            prose.append("")
        elif block is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    found.extend(commands_in_text("\n".join(prose), where, prose=True))
    return found


def source_commands(path: Path) -> list[Command]:
    """An example's YAML or Python file: its comments, docstrings and printed strings."""
    return commands_in_text(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))


def _string_value(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else DYNAMIC
            for part in node.values
        )
    return None


def message_commands(path: Path) -> list[Command]:
    """The commands in one module's string literals (f-string values become ``DYNAMIC``)."""
    found: list[Command] = []
    where = str(path.relative_to(ROOT))
    tree_ = ast.parse(path.read_text(encoding="utf-8"))
    inner: set[int] = set()  # the Constant parts of an f-string are read with it, not again
    for node in ast.walk(tree_):
        if isinstance(node, ast.JoinedStr):
            inner.update(id(part) for part in node.values)
    for node in ast.walk(tree_):
        value = _string_value(node)
        if value is None or id(node) in inner:
            continue
        found.extend(commands_in_text(value, where, node.lineno))
    return found


# --------------------------------------------------------------------------- checking commands


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\|", "|"))
    except ValueError:  # an apostrophe in prose
        return text.replace("\\|", "|").split()


def _option(command: click.Command, context: click.Context, name: str) -> click.Parameter | None:
    for parameter in command.get_params(context):
        if name in (*getattr(parameter, "opts", ()), *getattr(parameter, "secondary_opts", ())):
            return parameter
    return None


def _takes_value(parameter: click.Parameter) -> bool:
    return isinstance(parameter, click.Option) and not parameter.is_flag and not parameter.count


def problems(text: str) -> list[str]:
    """What is wrong with one command: a subcommand or an option the real CLI does not have."""
    synopsis = bool(re.search(r"[\[(]", text))
    tokens = _tokens(text)
    while tokens and re.fullmatch(r"\$|[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        tokens.pop(0)
    assert tokens and tokens[0] == "ctrlrun", text
    command: click.Command = cli
    path = ["ctrlrun"]
    context = click.Context(cli, info_name="ctrlrun")
    found: list[str] = []
    value_next = positional = False
    for raw in tokens[1:]:
        if not synopsis and (raw in SHELL_STOPS or raw.startswith("#") or raw == "--"):
            break  # a pipe, a comment, or the gateway's upstream command
        token = raw.strip("[](){}").rstrip(".,;:")
        if value_next:
            value_next = False
            continue
        if not token or token in {"|", "--", "...", "…", "-"} or set(token) <= {".", "…"}:
            continue
        if token.startswith("-"):
            alternatives = token.split("|") if all(p.startswith("-") for p in token.split("|")) else [token]
            for alternative in alternatives:
                name = alternative.split("=", 1)[0]
                if DYNAMIC in name:
                    continue
                parameter = _option(command, context, name)
                if parameter is None:
                    found.append(f"`{' '.join(path)}` has no option {name}")
                elif _takes_value(parameter) and "=" not in alternative and len(alternatives) == 1:
                    value_next = True
            continue
        if isinstance(command, click.Group) and not positional:
            if synopsis and re.fullmatch(r"[A-Z][A-Z_]*", token):  # `serve [OPTIONS] [COMMAND]`
                positional = True
                continue
            subs = [command.get_command(context, name) for name in token.split("|")]  # `approve|deny`
            if None in subs:
                found.append(f"`{' '.join(path)}` has no command {token!r}")
                break
            sub = subs[0]
            assert sub is not None
            command = sub
            path.append(token)
            context = click.Context(sub, info_name=token, parent=context)
            continue
        positional = True
    return found


def _report(commands: list[Command]) -> list[str]:
    return [f"{c.where}: `{c.text}`: {p}" for c in commands for p in problems(c.text)]


# --------------------------------------------------------------------------- the shipped files


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_commands_exist(path: Path) -> None:
    wrong = _report(markdown_commands(path))
    assert not wrong, "commands that do not exist as written:\n" + "\n".join(wrong)


@pytest.mark.parametrize("path", EXAMPLE_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_file_commands_exist(path: Path) -> None:
    wrong = _report(source_commands(path))
    assert not wrong, "commands that do not exist as written:\n" + "\n".join(wrong)


def test_cli_messages_name_commands_that_exist() -> None:
    """What an error or a note tells the user to run (``run `ctrlrun receipts --verify-chain```)."""
    commands = [c for path in sorted((SRC / "ctrlrun").rglob("*.py")) for c in message_commands(path)]
    assert len(commands) > 40  # the finder still finds them
    wrong = _report(commands)
    assert not wrong, "commands the CLI names that do not exist as written:\n" + "\n".join(wrong)


def test_the_finder_finds_commands_in_every_shape() -> None:
    """A finder that found nothing would pass everything: each shape is found where it is used."""
    readme = {c.text for c in markdown_commands(ROOT / "README.md")}
    cli_page = {c.text for c in markdown_commands(ROOT / "docs" / "cli.md")}
    mcp = {c.text for name in ("ctrlrun.yaml", "refund_server.py")
           for c in source_commands(EXAMPLES / "mcp" / name)}  # fmt: skip
    assert "ctrlrun pending" in readme
    assert "ctrlrun approve REQUEST_ID" in cli_page  # the command table
    assert "ctrlrun receipts --last 0" in cli_page  # a console block
    assert any(t.startswith("ctrlrun gateway --alias NAME (-- COMMAND") and "--max-message-bytes N" in t
               for t in cli_page)  # a text synopsis over several lines  # fmt: skip
    assert any(t.startswith("ctrlrun revoke dlg_") for t in cli_page)  # printed by `delegate`
    assert "ctrlrun approve <id>" in mcp  # a YAML comment's code span
    assert any(t.startswith("ctrlrun policy check ") for t in mcp)  # after a colon
    assert any(t.startswith("ctrlrun gateway --alias pay") and t.endswith("refund_server.py")
               for t in mcp)  # a docstring's literal lines  # fmt: skip
    assert problems("ctrlrun policy check --policy x") == ["`ctrlrun policy check` has no option --policy"]
    assert problems("ctrlrun resolve K --committed|--failed") == []
    assert problems("ctrlrun explode") == ["`ctrlrun` has no command 'explode'"]


def _table_rows(text: str) -> list[str]:
    """The first cell of each row of a Markdown table whose cells start with `ctrlrun …`."""
    rows = re.findall(r"^\| `(ctrlrun [^`]+)` \|", text, re.MULTILINE)
    return [" ".join(row.replace("\\|", "|").split()) for row in rows]


def _runnable(command: click.Command, path: list[str]) -> list[tuple[str, click.Command]]:
    """Every command a user can run: each leaf, and each group that runs without a subcommand."""
    if not isinstance(command, click.Group):
        return [(" ".join(path), command)]
    context = click.Context(command)
    found = [(" ".join(path), command)] if command.invoke_without_command and len(path) > 1 else []
    for name in command.list_commands(context):
        sub = command.get_command(context, name)
        assert sub is not None, name
        found.extend(_runnable(sub, [*path, name]))
    return found


def test_cli_page_table_lists_every_command() -> None:
    """A row per command, and for a command that takes one positional argument a row that shows
    it (``inspect ID`` is not ``inspect --grant ID``)."""
    rows = _table_rows((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    missing = []
    for path, command in _runnable(cli, ["ctrlrun"]):
        forms = [row[len(path):].split() for row in rows if row == path or row.startswith(path + " ")]
        positional = any(isinstance(p, click.Argument) and p.nargs == 1 for p in command.params)
        if not forms or (positional and not any(f and not f[0].startswith("-") for f in forms)):
            missing.append(path)
    assert not missing, f"docs/cli.md's command table has no row for {missing}"


# --------------------------------------------------------------------------- the demo's hints


def _shell_environment(bin_dir: Path) -> dict[str, str]:
    """No CTRLRUN_* variable, and a ``ctrlrun`` on PATH that runs the ctrlrun under test."""
    script = bin_dir / "ctrlrun"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ctrlrun "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _sh(line: str, directory: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", line], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


@pytest.mark.skipif(shutil.which("sh") is None, reason="runs the hints as a POSIX shell would")
def test_demo_hints_run_as_printed(tmp_path: Path) -> None:
    """Each command ``ctrlrun demo`` prints runs, pasted as is, where the demo ran, and exits 0."""
    bin_dir, directory = tmp_path / "bin", tmp_path / "where-the-user-is"
    bin_dir.mkdir()
    directory.mkdir()
    env = _shell_environment(bin_dir)
    demo = _sh("ctrlrun demo", directory, env)
    assert demo.returncode == 0, demo.stderr
    lines = demo.stdout.splitlines()
    hints = [c for n, line in enumerate(lines, 1) for c in commands_in_text(line, "the demo's output", n)]
    mentions = [line for line in lines if MENTION.search(line)]
    assert len(hints) == len(mentions) >= 2, f"a hint the finder cannot read:\n{mentions}\nfound: {hints}"
    assert not _report(hints)
    outputs = {}
    for hint in hints:
        done = _sh(hint.text, directory, env)
        assert done.returncode == 0 and done.stderr == "", (
            f"{hint.where}: the hint fails where it is printed:\n$ {hint.text}\n{done.stdout}{done.stderr}"
        )
        outputs[hint.text.split()[hint.text.split().index("ctrlrun") + 1]] = done.stdout
    assert outputs["resolve"] == "refund:txn_1 resolved committed by cli:local\n"  # in the demo's store
    assert len(outputs["receipts"].splitlines()) == 8


# --------------------------------------------------------------------------- the examples' scripts


def _readme_runs(readme: Path) -> list[list[str]]:
    """The ``python FILE …`` commands of a README's fenced bash blocks, comments dropped."""
    runs = []
    text = readme.read_text(encoding="utf-8")
    for body in re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for line in _join_continuations(body).splitlines():
            words = shlex.split(line, comments=True)
            while words and words[0] != "python":
                words.pop(0)  # `ctrlrun gateway … -- python FILE`: what comes after the gateway's `--`
            if len(words) > 1 and words[1].endswith(".py"):
                runs.append(words[1:])
    return runs


def _scripts() -> list[tuple[str, str]]:
    """(example, script path relative to the example) for every entry script a README runs, and
    every ``main.py``."""
    found: set[tuple[str, str]] = set()
    for directory in sorted(p for p in EXAMPLES.iterdir() if p.is_dir()):
        if (directory / "main.py").is_file():
            found.add((directory.name, "main.py"))
        for run in _readme_runs(directory / "README.md"):
            script = Path(run[0])
            if script.parts[:2] == ("examples", directory.name):
                script = Path(*script.parts[2:])
            found.add((directory.name, script.as_posix()))
    return sorted(found)


def _run_script(copy: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OPENAI_API_KEY="", OPENAI_AGENTS_DISABLE_TRACING="1")
    return subprocess.run([sys.executable, script, *args], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def test_every_example_has_an_entry_script() -> None:
    scripts = _scripts()
    named = {name for name, _ in scripts}
    assert named == {p.name for p in EXAMPLES.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert ("mcp", "refund_server.py") in scripts


@pytest.mark.parametrize(("name", "script"), _scripts(), ids=lambda v: str(v))
def test_example_script_answers_help_without_acting(name: str, script: str, tmp_path: Path) -> None:
    """``--help`` prints usage and exits 0, an unknown option exits 2, and neither writes anything
    (no ``.ctrlrun/``); every option the README passes is one the script lists."""
    module = OWNED_ELSEWHERE.get(name)
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(f"examples/{name} is another change's; its --help needs {module} installed")
    copy = tmp_path / name
    shutil.copytree(EXAMPLES / name, copy, ignore=shutil.ignore_patterns(".ctrlrun", "__pycache__"))
    before = tree(copy)

    shown = f"examples/{name}/{script}"
    helped = _run_script(copy, script, "--help")
    assert helped.returncode == 0, f"{shown} --help exited {helped.returncode}:\n{helped.stderr}"
    assert helped.stdout.startswith("usage: "), helped.stdout
    assert tree(copy) == before, f"{shown} --help wrote {sorted(set(tree(copy)) - set(before))}"

    refused = _run_script(copy, script, "--no-such-option")
    assert refused.returncode == 2, f"{shown} --no-such-option exited {refused.returncode}"
    assert refused.stderr.startswith("usage: ") and "--no-such-option" in refused.stderr, refused.stderr
    assert tree(copy) == before

    readme = _readme_runs(EXAMPLES / name / "README.md")
    runs = [run for run in readme if Path(run[0]).name == Path(script).name]
    documented = [word for run in runs for word in run[1:] if word.startswith("-")]
    unknown = [o for o in documented if not re.search(rf"(?<![\w-]){re.escape(o)}\b", helped.stdout)]
    assert not unknown, f"examples/{name}/README.md passes {unknown}, which {script} --help does not list"
