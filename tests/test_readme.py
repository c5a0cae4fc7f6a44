"""The README's quick start, typed as written in a fresh directory, output compared line by line.

Ids and timestamps differ on every run: the README's example ids are mapped to the real ones as
they first appear, and timestamps and receipt ids match by shape. Everything else is exact.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from .vectors import ROOT

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
APPROVAL = re.compile(r"(?:apr|dlg)_[0-9a-f]{32}")  # ids a later command names again
VOLATILE = {
    "timestamp": r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z",
    "receipt id": r"ctr_[0-9a-f]{32}",
    "hash": r"sha256:[0-9a-f]{64}",
}
VOLATILE_RE = re.compile("|".join(f"(?:{p})" for p in VOLATILE.values()))


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def console_steps(section: str) -> list[tuple[str, list[str]]]:
    """``(command, expected output lines)`` for every ``$`` line of the console blocks."""
    steps: list[tuple[str, list[str]]] = []
    for language, body in FENCE.findall(section):
        if language != "console":
            continue
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
    return steps


def ctrlrun_command() -> list[str]:
    """The installed script when it runs this checkout, else the module."""
    script = shutil.which("ctrlrun")
    if script:
        probe = subprocess.run(
            [script, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        if probe.returncode == 0:
            return [script]
    return [sys.executable, "-m", "ctrlrun.cli"]


def expected_pattern(line: str, ids: dict[str, str]) -> re.Pattern[str]:
    """A regex for one expected line: known ids substituted, new ids captured, volatile by shape."""
    pattern, position = "", 0
    for match in APPROVAL.finditer(line):
        pattern += _volatile(line[position : match.start()])
        token = match.group()
        pattern += re.escape(ids[token]) if token in ids else f"(?P<{token}>{token[:4]}[0-9a-f]{{32}})"
        position = match.end()
    return re.compile(pattern + _volatile(line[position:]) + r"\Z")


def _volatile(text: str) -> str:
    """Escape ``text``, letting timestamps and receipt ids match any value of their shape."""
    pattern, position = "", 0
    for match in VOLATILE_RE.finditer(text):
        shape = next(p for p in VOLATILE.values() if re.fullmatch(p, match.group()))
        pattern += re.escape(text[position : match.start()]) + shape
        position = match.end()
    return pattern + re.escape(text[position:])


def test_set_up_commands():
    commands = [b.strip() for lang, b in FENCE.findall(readme_section("Set up")) if lang == "bash"]
    assert commands == ['pip install -e ".[dev]"', "python -m pytest"]
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert all(command in ci_lines for command in commands)


@pytest.mark.slow
def test_quick_start_as_written(tmp_path):
    section = readme_section("Quick start")
    files = {lang: body for lang, body in FENCE.findall(section) if lang in ("yaml", "python")}
    (tmp_path / "ctrlrun.yaml").write_text(files["yaml"], encoding="utf-8")
    (tmp_path / "refund.py").write_text(files["python"], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    cli = ctrlrun_command()
    ids: dict[str, str] = {}
    steps = console_steps(section)
    assert [c.split()[0] for c, _ in steps][:2] == ["pip", "python"]
    for command, expected in steps:
        if command.startswith("pip install"):
            continue  # the suite already runs inside an installed checkout
        for example, real in ids.items():
            command = command.replace(example, real)
        argv = shlex.split(command)
        argv = cli + argv[1:] if argv[0] == "ctrlrun" else [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        actual = done.stdout.splitlines()
        assert len(actual) == len(expected), f"{command}\n{done.stdout}"
        for want, got in zip(expected, actual, strict=True):
            match = expected_pattern(want, ids).match(got)
            assert match, f"{command}\nexpected: {want}\nactual:   {got}"
            ids.update({k: v for k, v in match.groupdict().items()})
    assert (tmp_path / ".ctrlrun" / "receipts.jsonl").is_file()
