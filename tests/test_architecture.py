"""The shape of the code, checked: the import-linter contracts hold (and break when a module
imports across them), nothing outside ``control`` reads a Control's private attributes, nothing
outside the CLI imports it, one module reads the ``CTRLRUN_*`` variables, modules stay small, and
docs/architecture.md names what is there."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ctrlrun

ROOT = Path(__file__).resolve().parent.parent
SRC = Path(ctrlrun.__file__).resolve().parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _lint_imports() -> str:
    found = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(found).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    return found


def _run_lint(pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = None
    if pythonpath is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_contracts_hold() -> None:
    done = _run_lint()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_an_import_from_the_console_into_the_cli_breaks_them(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "ctrlrun", ignore=shutil.ignore_patterns("__pycache__"))
    app = copy / "ctrlrun" / "console" / "app.py"
    app.write_text(app.read_text(encoding="utf-8") + "\nfrom ..cli import text as _cli_text  # noqa\n",
                   encoding="utf-8")  # fmt: skip
    done = _run_lint(copy)
    assert done.returncode != 0
    assert "Nothing outside the CLI imports the CLI BROKEN" in done.stdout
    assert "ctrlrun.console.app -> ctrlrun.cli.text" in done.stdout


def test_a_cycle_between_sibling_modules_breaks_them(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "ctrlrun", ignore=shutil.ignore_patterns("__pycache__"))
    attempt = copy / "ctrlrun" / "control" / "attempt.py"
    attempt.write_text(attempt.read_text(encoding="utf-8") + "\nfrom . import pipeline as _p  # noqa\n",
                       encoding="utf-8")  # fmt: skip
    done = _run_lint(copy)
    assert done.returncode != 0
    assert "No import cycles between sibling modules or packages, at any depth BROKEN" in done.stdout


def test_no_module_outside_control_reads_a_controls_private_attributes() -> None:
    reaching = re.compile(r"\bcontrol\)?\._[a-z]")
    offenders = [
        f"{path.relative_to(SRC)}:{number}"
        for path in _sources() if "control" not in path.relative_to(SRC).parts[:1]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if reaching.search(line)
    ]  # fmt: skip
    assert offenders == []


def test_nothing_outside_the_cli_imports_it() -> None:
    importing = re.compile(r"^\s*(from\s+(\.\.cli|ctrlrun\.cli)\b|import\s+ctrlrun\.cli\b)")
    offenders = [
        str(path.relative_to(SRC))
        for path in _sources()
        if path.relative_to(SRC).parts[0] != "cli" and path.name != "__main__.py"
        and any(importing.match(line) for line in path.read_text(encoding="utf-8").splitlines())
    ]  # fmt: skip
    assert offenders == []


def test_one_module_reads_the_environment_for_ctrlrun_settings() -> None:
    readers = {
        str(path.relative_to(SRC))
        for path in _sources()
        if re.search(r"os\.environ|os\.getenv|getenv\(", path.read_text(encoding="utf-8"))
    }
    # libpq's own PG* variables decide whether a timeout is already set; no CTRLRUN_* is read there
    assert readers == {"settings.py", "store/pgtimeouts.py"}
    assert "CTRLRUN_" not in (SRC / "store" / "pgtimeouts.py").read_text(encoding="utf-8")


def test_every_settings_variable_is_in_the_documented_table() -> None:
    from ctrlrun.settings import VARIABLES

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for variable in VARIABLES:
        assert f"| `{variable.name}` |" in text, variable.name
    named = set(re.findall(r"CTRLRUN_[A-Z_]+", (SRC / "settings.py").read_text(encoding="utf-8")))
    assert named == {v.name for v in VARIABLES}


def test_no_module_is_over_600_lines() -> None:
    long = {str(p.relative_to(SRC)): n for p in _sources()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}  # fmt: skip
    assert long == {}


def test_the_architecture_page_names_every_package_and_module() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    for path in _sources():
        relative = path.relative_to(SRC)
        if path.name == "__init__.py":
            assert f"`{relative.parent}/`" in text or relative.parent == Path("."), relative
            continue
        assert f"`{relative.name}`" in text, relative
    for named in re.findall(r"`([a-z_]+)/`", text):
        assert (SRC / named).is_dir(), named
    for named in re.findall(r"`([a-z_]+\.py)`", text):
        assert any(p.name == named for p in _sources()), named


def test_every_store_is_an_evidence_store(store: object) -> None:
    from ctrlrun.evidence.store import EvidenceStore

    assert isinstance(store, EvidenceStore)
