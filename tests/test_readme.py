"""The README's quick start, executed verbatim in a fresh directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .vectors import ROOT

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def quick_start_blocks() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = {}
    for language, body in FENCE.findall(section):
        blocks.setdefault(language, body)
    return blocks


def test_readme_set_up_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = [body.strip() for language, body in FENCE.findall(section) if language == "bash"]
    assert commands == ['pip install -e ".[dev]"', "python -m pytest"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert all(command in ci.splitlines() for command in commands)


def test_quick_start_runs_as_written(tmp_path):
    blocks = quick_start_blocks()
    (tmp_path / "ctrlrun.yaml").write_text(blocks["yaml"], encoding="utf-8")
    (tmp_path / "refund.py").write_text(blocks["python"], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "refund.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == blocks["text"]
    assert (tmp_path / ".ctrlrun" / "receipts.jsonl").is_file()
