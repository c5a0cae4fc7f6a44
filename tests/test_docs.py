"""Every fenced block in ``docs/*.md`` runs, so the documentation cannot drift from the code.

How a page is run (one test per page, in a fresh temporary directory, no ``CTRLRUN_*`` variable):

- ```` ```python ```` blocks run in order, in one namespace per page, in that directory. A block
  whose first line is ``# file: NAME`` is written to ``NAME`` instead of being run.
- ```` ```yaml ```` blocks are policies: each loads with ``Policy.from_yaml``. A block whose first
  lines carry ``# error: TEXT`` must fail with a ``PolicyError`` whose message contains ``TEXT``
  (``# error`` alone: any ``PolicyError``). ``# file: NAME`` also writes the block to ``NAME``.
  A block marked ``# grant`` is one delegated grant instead: it loads with
  ``ctrlrun.authority.resolve.grant_from_yaml``.
- ```` ```console ```` blocks: every ``$ ctrlrun …`` line runs the CLI (in process), every
  ``$ python FILE …`` line runs Python on a file of the page (a subprocess), ``$ echo $?`` prints
  the previous exit status, and ``NAME=value`` prefixes set environment variables. The output
  (stdout and stderr together) must match the lines that follow, with ids and timestamps
  normalised the way the README test does it (``tests/test_readme.py``), ``act_…`` ids matched by
  shape, and the temporary directory shown as ``/home/ada/refunds``. A command that exits
  non-zero must be followed by ``$ echo $?``.
- Blocks that cannot run (``bash`` install commands, SQL, JSON documents, pseudo-output) use a
  language listed in ``SKIPPED_LANGUAGES``; any other language fails, so a typo cannot hide a block.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import ctrlrun
from ctrlrun import Policy, PolicyError
from ctrlrun.cli import cli

from .test_readme import FENCE, console_steps, expected_pattern
from .vectors import ROOT

DOCS = ROOT / "docs"
SRC = Path(ctrlrun.__file__).resolve().parents[1]  # the ctrlrun under test, for subprocesses
DOC_DIR = "/home/ada/refunds"  # how the pages show the directory they run in
RUN_LANGUAGES = frozenset({"python", "yaml", "console"})
SKIPPED_LANGUAGES = frozenset({"", "text", "bash", "sql", "json", "ini"})
#: Pages other work owns; their blocks need a Postgres server or run the benchmarks.
NOT_RUN = {
    "performance.md": "benchmark commands (owned by the bench work; `python -m bench` checks itself)",
    "postgres.md": "needs a Postgres server (covered by tests/test_postgres.py)",
}
ACTION_ID = re.compile(r"act_[0-9a-f]{32}")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@dataclass
class Block:
    language: str
    body: str
    line: int  # line of the opening fence, 1-based


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    found = [
        Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in FENCE.finditer(text)
    ]
    fences = len(re.findall(r"^```", text, re.MULTILINE))
    assert fences == 2 * len(found), (
        f"docs/{path.name}: {fences} fence lines but {len(found)} blocks; open each block with "
        "```<language> alone on its line, so no block escapes the test"
    )
    return found


def pages() -> list[Path]:
    return sorted(p for p in DOCS.glob("*.md") if p.name not in NOT_RUN)


def markers(body: str) -> dict[str, str]:
    """The ``# file: NAME`` / ``# error: TEXT`` / ``# grant`` comments at the top of a block."""
    found: dict[str, str] = {}
    for line in body.splitlines():
        match = re.match(r"#\s*(file|error|grant)\b:?\s*(.*)$", line.strip())
        if not match:
            break
        found[match.group(1)] = match.group(2).strip()
    return found


class Page:
    """One page's run: its directory, the ids seen so far, the last exit status."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.directory = directory
        self.ids: dict[str, str] = {}  # example id in the page -> the id this run produced
        self.namespace: dict[str, object] = {"__name__": "__docs__"}
        self.status = 0
        self.unchecked_failure: str | None = None

    def where(self, block: Block) -> str:
        return f"docs/{self.name}:{block.line}"

    def substitute(self, text: str) -> str:
        for example, real in self.ids.items():
            text = text.replace(example, real)
        return text

    # -- blocks

    def python(self, block: Block) -> None:
        source = self.substitute(block.body)
        name = markers(block.body).get("file")
        if name:
            (self.directory / name).write_text(source, encoding="utf-8")
            return
        code = compile("\n" * block.line + source, self.where(block), "exec")
        exec(code, self.namespace)  # noqa: S102 - the documentation's own examples

    def yaml(self, block: Block) -> None:
        marks = markers(block.body)
        if "file" in marks:
            (self.directory / marks["file"]).write_text(block.body, encoding="utf-8")
        if "grant" in marks:
            from ctrlrun.authority.resolve import grant_from_yaml

            grant_from_yaml(block.body)
        elif "error" in marks:
            with pytest.raises(PolicyError) as refused:
                Policy.from_yaml(block.body, source=marks.get("file") or "<string>")
            assert marks["error"] in str(refused.value), (
                f"{self.where(block)}: expected the error to contain {marks['error']!r}, "
                f"got {str(refused.value)!r}"
            )
        else:
            Policy.from_yaml(block.body, source=marks.get("file") or "<string>")

    def console(self, block: Block) -> None:
        for command, expected in console_steps(f"```console\n{block.body}```\n"):
            if command.strip() != "echo $?":
                self.check_unchecked(block)
            command = self.substitute(command)
            output = self.run(command, block)
            actual = self.normalise(output).splitlines()
            expected = [ACTION_ID.sub("act_" + "0" * 32, line) for line in expected]
            assert len(actual) == len(expected), (
                f"{self.where(block)}: $ {command}\nexpected {len(expected)} lines, got "
                f"{len(actual)}:\n{output}"
            )
            for want, got in zip(expected, actual, strict=True):
                match = expected_pattern(want, self.ids).match(got)
                assert match, f"{self.where(block)}: $ {command}\nexpected: {want}\nactual:   {got}"
                self.ids.update(match.groupdict())

    def check_unchecked(self, block: Block) -> None:
        assert self.unchecked_failure is None, (
            f"{self.where(block)}: `{self.unchecked_failure}` exited {self.status}; "
            "show it with `$ echo $?`"
        )

    def normalise(self, output: str) -> str:
        output = output.replace(str(self.directory), DOC_DIR)
        return ACTION_ID.sub("act_" + "0" * 32, output)

    # -- commands

    def run(self, command: str, block: Block) -> str:
        argv = shlex.split(command)
        env: dict[str, str] = {}
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
            key, _, value = argv.pop(0).partition("=")
            env[key] = value
        if argv == ["echo", "$?"]:
            self.unchecked_failure = None
            return f"{self.status}\n"
        if argv[0] == "ctrlrun":
            code, output = self.ctrlrun(argv[1:], env)
        elif argv[0] == "python":
            code, output = self.python_process(argv[1:], env)
        else:
            raise AssertionError(
                f"{self.where(block)}: a console block runs only `ctrlrun`, `python` and "
                f"`echo $?`; mark `{command}` as ```bash if it is not meant to run"
            )
        self.status = code
        self.unchecked_failure = command if code != 0 else None
        return output

    def ctrlrun(self, args: list[str], env: dict[str, str]) -> tuple[int, str]:
        # terminal_width=78: what click uses on any terminal of 80 columns or more (CliRunner
        # would force 80)
        result = CliRunner().invoke(
            cli, args, env=env, prog_name="ctrlrun", terminal_width=78, catch_exceptions=True
        )
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.output

    def python_process(self, args: list[str], env: dict[str, str]) -> tuple[int, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
        base["PYTHONPATH"] = str(SRC) + os.pathsep + base.get("PYTHONPATH", "")
        base["PYTHONUNBUFFERED"] = "1"
        done = subprocess.run(
            [sys.executable, *args],
            cwd=self.directory,
            env={**base, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            check=False,
        )
        return done.returncode, done.stdout


@pytest.fixture
def clean_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in [k for k in os.environ if k.startswith("CTRLRUN_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    ctrlrun.reset()
    yield tmp_path
    ctrlrun.reset()


@pytest.mark.parametrize("path", pages(), ids=lambda p: p.name)
def test_page_runs(path: Path, clean_directory: Path) -> None:
    page = Page(path.name, clean_directory)
    for block in blocks(path):
        language = block.language
        if language in SKIPPED_LANGUAGES:
            continue
        assert language in RUN_LANGUAGES, (
            f"{page.where(block)}: unknown block language {language!r}; use one of "
            f"{sorted(RUN_LANGUAGES)} (run) or {sorted(SKIPPED_LANGUAGES - {''})} (shown only)"
        )
        getattr(page, language)(block)
    assert page.unchecked_failure is None, (
        f"docs/{path.name}: `{page.unchecked_failure}` exited {page.status}; show it with "
        "`$ echo $?`"
    )


def test_every_page_is_listed_in_the_index() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    listed = set(LINK.findall(index))
    missing = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md" and p.name not in listed)
    assert not missing, f"docs/index.md does not link {missing}"


def test_relative_links_resolve() -> None:
    broken = []
    for path in sorted(DOCS.glob("*.md")):
        for target in LINK.findall(path.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"docs/{path.name}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def _documented(name: str, text: str) -> bool:
    return re.search(rf"`{re.escape(name)}[`(\s.]", text) is not None


def test_api_reference_covers_every_public_name() -> None:
    from ctrlrun import identity, receipt

    text = (DOCS / "api.md").read_text(encoding="utf-8")
    names = [
        *ctrlrun.__all__,
        *receipt.__all__,
        *identity.__all__,
        "idempotency_token_for",
        "PostgresStateStore",
    ]
    missing = sorted({n for n in names if not _documented(n, text)})
    assert not missing, f"docs/api.md does not document {missing}"


def test_cli_reference_covers_every_command_and_option() -> None:
    import click

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    missing = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):  # list_commands: the top group loads its commands lazily
            context = click.Context(command)
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                assert sub is not None, name
                walk(sub, [*path, name])
        if path and f"ctrlrun {' '.join(path)}" not in text:
            missing.append(" ".join(path))
        for parameter in command.params:
            for option in getattr(parameter, "opts", []):
                if option.startswith("--") and option not in text:
                    missing.append(f"{' '.join(path) or 'ctrlrun'} {option}")

    walk(cli, [])
    assert not missing, f"docs/cli.md does not mention {missing}"


#: ``pip install`` lines that install something other than this clone on purpose.
OTHER_PACKAGES = {
    "docs/performance.md": "ctrlrun==0.12.2",  # the published release, the benchmark's reference, in its own venv
}
PIP_INSTALL = re.compile(r"pip install((?:[ \t]+(?!#)[^\s`)]+)+)")


def _is_path(target: str) -> bool:
    return target.startswith((".", "/")) or "/" in target  # a name on PyPI has no '/'


def _install_targets(tokens: list[str]) -> list[str]:
    """What a ``pip install`` names: its first argument after the flags, and the paths after it."""
    targets: list[str] = []
    for token in (t.strip("'\"") for t in tokens):
        if token.startswith("-"):
            continue
        if targets and not _is_path(token):
            break  # prose after the command
        targets.append(token)
    return targets


def test_every_install_line_installs_this_clone() -> None:
    """``pip install 'ctrlrun[postgres]'`` fetches another project of that name from PyPI: every
    install line names a path in the clone (``.``, ``'.[postgres]'``, ``./adapters/…``)."""
    files = [ROOT / "README.md", ROOT / "DEVELOPERS.md", *DOCS.glob("*.md"), *ROOT.glob("examples/*/README.md"),
             *ROOT.glob("adapters/*/README.md"), *ROOT.glob("src/ctrlrun/**/*.py"), *ROOT.glob("bench/*.py")]  # fmt: skip
    wrong = []
    for path in files:
        name = str(path.relative_to(ROOT))
        for match in PIP_INSTALL.finditer(path.read_text(encoding="utf-8")):
            for target in _install_targets(match.group(1).split()):
                if not _is_path(target) and OTHER_PACKAGES.get(name) != target:
                    wrong.append(f"{name}: pip install {target}")
    assert not wrong, "install lines that do not install this clone:\n" + "\n".join(wrong)


def test_missing_dependency_says_how_to_install_from_the_clone() -> None:
    from ctrlrun.errors import MissingDependency

    message = str(MissingDependency(module="psycopg", extra="postgres"))
    assert "pip install '.[postgres]' from the root of your ctrlrun clone" in message
    assert "ctrlrun[postgres]" not in message


def test_recovery_page_says_what_the_chain_covers(tmp_path: Path) -> None:
    """An edit of the effects, approvals or events tables leaves the receipt chain intact, so the
    page must not promise the chain shows it."""
    import sqlite3

    from ctrlrun import Control, SQLiteStateStore
    from ctrlrun.receipt import verify_chain

    db = tmp_path / "state.db"
    store = SQLiteStateStore(db)
    control = Control(Policy.from_file(ROOT / "ctrlrun.yaml"), store)

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: str, amount: int) -> None:
        return None

    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_1", amount=100)
        with pytest.raises(ctrlrun.ApprovalRequired):
            refund(payment_id="txn_2", amount=500_000)
    with sqlite3.connect(db) as tamper:
        tamper.execute("UPDATE effects SET state = 'failed'")  # would let the refund run again
        tamper.execute("UPDATE approvals SET status = 'granted'")
        tamper.execute("DELETE FROM events")
    assert verify_chain(store).ok  # nothing in the chain shows it
    store.close()
    text = " ".join((DOCS / "recovery.md").read_text(encoding="utf-8").split())
    assert "chain will show the edit" not in text
    assert "the effects, approvals and events tables are not chained" in text


def test_no_message_or_docstring_names_the_other_package() -> None:
    """``ctrlrun[console]`` on the public index is another project: nothing this repository
    prints or documents may name an extra that way (a clone installs ``'.[console]'``)."""
    sources = [*ROOT.glob("src/ctrlrun/**/*.py"), *ROOT.glob("adapters/*/src/**/*.py"),
               *ROOT.glob("src/ctrlrun/**/*.html"), *ROOT.glob("examples/**/*.py")]  # fmt: skip
    wrong = [f"{p.relative_to(ROOT)}:{n}" for p in sources
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bctrlrun\[[a-z-]+\]", line)]  # fmt: skip
    assert not wrong, "names the public index's ctrlrun with an extra:\n" + "\n".join(wrong)
