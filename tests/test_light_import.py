"""``import ctrlrun`` and ``ctrlrun --help`` stay light: pinned on ``sys.modules`` in a fresh
interpreter (names, never time); every public name still imports; the CLI's command table never
drifts from the commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import click

import ctrlrun
from ctrlrun.cli.app import COMMANDS, cli

from .vectors import ROOT

# Loaded by the store, the policy loader, the CLI or an extra; never by a bare import.
HEAVY = (
    "sqlalchemy", "psycopg", "psycopg2", "pydantic", "pydantic_core", "click", "yaml",
    "importlib.metadata", "ssl", "asyncio", "sqlite3", "mcp", "starlette", "jinja2", "uvicorn",
    "httpx", "anyio",
)  # fmt: skip
# What ``ctrlrun --help`` must not load: the data libraries and every command's own module.
NOT_FOR_HELP = (
    "sqlalchemy", "psycopg", "pydantic", "yaml", "importlib.metadata", "ctrlrun.gateway",
    "ctrlrun.console", "ctrlrun.store.sqlite", "ctrlrun.policy.engine",
    *(f"ctrlrun.cli.{module}" for module, _, _ in COMMANDS.values()),
)  # fmt: skip


def _modules_after(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter on this source tree; its last stdout line is a JSON
    object that ``code`` printed (it may print other lines before)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """The entries of ``names`` that are loaded, as a package or any module under it."""
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


_MODULES = "import json, sys; print(json.dumps({'modules': sorted(sys.modules)}))"


def test_a_bare_import_loads_nothing_heavy() -> None:
    seen = _modules_after("import ctrlrun; " + _MODULES)
    assert _loaded(seen["modules"], HEAVY) == []


def test_the_decorator_control_and_memory_store_are_light_too() -> None:
    seen = _modules_after(
        "import ctrlrun\n"
        "from ctrlrun import protect, Control, InMemoryStateStore, Action, CTRLRunError, Receipt\n"
        "assert callable(ctrlrun.protect)\n" + _MODULES
    )
    assert _loaded(seen["modules"], HEAVY) == []


def test_the_heavy_parts_load_when_first_used() -> None:
    seen = _modules_after(
        "import json, sys, ctrlrun\n"
        "ctrlrun.Policy\n"
        "policy = sorted(sys.modules)\n"
        "ctrlrun.SQLiteStateStore\n"
        "store = sorted(sys.modules)\n"
        "ctrlrun.__version__\n"
        "print(json.dumps({'policy': policy, 'store': store, 'version': sorted(sys.modules)}))"
    )
    assert _loaded(seen["policy"], ("pydantic", "yaml", "sqlalchemy")) == ["pydantic", "yaml"]
    assert "sqlalchemy" in _loaded(seen["store"], HEAVY)
    assert "importlib.metadata" in seen["version"]


def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    seen = _modules_after(
        "import json, importlib, ctrlrun\n"
        "wrong = []\n"
        "for name in ctrlrun.__all__:\n"
        "    value = getattr(importlib.import_module('ctrlrun'), name)\n"
        "    exec(f'from ctrlrun import {name} as again')\n"
        "    if again is not value: wrong.append(name)\n"
        "missing = sorted(set(ctrlrun.__all__) - set(dir(ctrlrun)))\n"
        "print(json.dumps({'wrong': wrong, 'missing': missing, 'version': ctrlrun.__version__,"
        " 'protect': callable(ctrlrun.protect)}))"
    )
    assert seen["wrong"] == [] and seen["missing"] == []
    assert isinstance(seen["version"], str) and seen["version"]
    assert seen["protect"] is True


def test_public_names_are_the_defining_modules_objects() -> None:
    from ctrlrun.control.front import Control
    from ctrlrun.policy.engine import Policy
    from ctrlrun.protect import protect
    from ctrlrun.store.sqlite import SQLiteStateStore

    assert (ctrlrun.Control, ctrlrun.Policy, ctrlrun.SQLiteStateStore) == (Control, Policy, SQLiteStateStore)
    assert ctrlrun.protect is protect  # the decorator, never the submodule of the same name
    assert set(ctrlrun.__all__) <= set(dir(ctrlrun))


def test_the_lazy_subpackages_resolve_every_public_name() -> None:
    seen = _modules_after(
        "import json, ctrlrun.policy as policy, ctrlrun.store as store\n"
        "light = [m for m in ('pydantic', 'yaml', 'sqlalchemy') if m in __import__('sys').modules]\n"
        "unresolved = [f'{p.__name__}.{n}' for p in (policy, store) for n in p.__all__"
        " if getattr(p, n, None) is None or n not in dir(p)]\n"
        "print(json.dumps({'light': light, 'unresolved': unresolved}))"
    )
    assert seen == {"light": [], "unresolved": []}


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    try:
        ctrlrun.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("ctrlrun.no_such_name resolved")
    seen = _modules_after(
        "import json\ntry:\n    from ctrlrun import no_such_name\nexcept ImportError as exc:\n"
        "    print(json.dumps({'error': str(exc)}))"
    )
    assert "no_such_name" in seen["error"]


def _cli_modules(*args: str) -> dict[str, Any]:
    return _modules_after(
        "import json, runpy, sys\n"
        f"sys.argv = ['ctrlrun', *{list(args)!r}]\n"
        "try:\n    runpy.run_module('ctrlrun', run_name='__main__')\nexcept SystemExit as exc:\n"
        "    code = exc.code\n"
        "print()\nprint(json.dumps({'code': code, 'modules': sorted(sys.modules)}))"
    )


def test_help_and_version_load_no_command_module() -> None:
    for args in (["--help"], ["--version"]):
        seen = _cli_modules(*args)
        assert seen["code"] in (0, None), args
        allowed = ("importlib.metadata",) if args == ["--version"] else ()  # it reads the version
        assert _loaded(seen["modules"], tuple(n for n in NOT_FOR_HELP if n not in allowed)) == [], args


def test_a_command_loads_its_own_module_only() -> None:
    seen = _cli_modules("receipts", "--help")
    assert "ctrlrun.cli.commands_receipts" in seen["modules"]
    others = tuple(n for n in NOT_FOR_HELP if n not in ("ctrlrun.cli.commands_receipts",))
    assert _loaded(seen["modules"], others + ("ctrlrun.cli.commands_serve",)) == []


def test_the_table_help_is_each_commands_own_short_help() -> None:
    context = click.Context(cli)
    for name, (module, _attribute, help_line) in COMMANDS.items():
        command = cli.get_command(context, name)
        assert command is not None and command.name == name, name
        assert f"ctrlrun.cli.{module}" == getattr(command.callback, "__module__", None), name
        assert command.get_short_help_str(limit=10_000) == help_line, (
            f"COMMANDS[{name!r}] in ctrlrun/cli/app.py says {help_line!r}; set it to the "
            f"command's own {command.get_short_help_str(limit=10_000)!r}"
        )


def test_the_lazy_listing_equals_the_loaded_commands_listing() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "100"}
    load_all = (
        "import click; from ctrlrun.cli.app import COMMANDS, cli; from ctrlrun.cli import main\n"
        "[cli.get_command(click.Context(cli), name) for name in COMMANDS]\n"
        "main()"
    )  # every row then comes from the real command, not the table
    runs = [
        subprocess.run(
            [sys.executable, *how, "--help"], env=env, capture_output=True, text=True, timeout=120
        )
        for how in (["-m", "ctrlrun"], ["-c", load_all])
    ]
    assert [run.returncode for run in runs] == [0, 0], [run.stderr for run in runs]
    assert runs[0].stdout == runs[1].stdout
    assert all(f"  {name} " in runs[0].stdout for name in COMMANDS)


def test_a_mistyped_command_is_told_the_nearest_one_before_any_loads() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "ctrlrun", "recipts"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "No such command 'recipts'. Did you mean 'receipts'?" in done.stderr


def test_every_module_imports_first() -> None:
    """With the package's names resolved on first use, no module may depend on another having
    been imported before it: each imports first, with no ctrlrun module loaded (a cycle shows)."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import ctrlrun\n"
        "names = [m.name for m in pkgutil.walk_packages(ctrlrun.__path__, 'ctrlrun.')\n"
        "         if not m.name.endswith('__main__')]\n"
        "failed = []\n"
        "for name in names:\n"
        "    for key in [k for k in sys.modules if k == 'ctrlrun' or k.startswith('ctrlrun.')]:\n"
        "        del sys.modules[key]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print(json.dumps({'count': len(names), 'failed': failed}))\n"
    )
    seen = _modules_after(code)
    assert seen["count"] > 100 and seen["failed"] == []
