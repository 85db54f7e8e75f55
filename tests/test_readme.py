"""The README's set-up commands work as written on a fresh clone.

The README gives two one-line commands: run the demo and run the tests.
CI (``.ci/run``) runs both lines exactly as written; here the demo line runs
for real in a copy of the checkout, with a fresh virtual environment.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.rst"
CI = ROOT / ".ci" / "run"


def console_commands() -> list[str]:
    """Every ``$ ...`` line of the README's console blocks."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"^\.\. code-block:: console\n((?:\n|    .*\n)+)", text, re.M)
    return [
        line.strip()[2:]
        for block in blocks
        for line in block.splitlines()
        if line.strip().startswith("$ ")
    ]


def the_command(marker: str) -> str:
    found = [command for command in console_commands() if marker in command]
    assert len(found) == 1, f"the README should give one command with {marker!r}: {found}"
    return found[0]


def test_the_readme_gives_one_line_each_to_run_the_demo_and_the_tests() -> None:
    demo = the_command("throttlekit demo")
    tests = the_command("nox -s tests")
    for command in (demo, tests):
        assert command.startswith("python3 -m venv .venv && "), command  # a fresh venv
        assert "\\" not in command, command  # one line, no continuation


def test_ci_runs_both_commands_exactly_as_written() -> None:
    lines = [line.strip() for line in CI.read_text(encoding="utf-8").splitlines()]
    for marker in ("nox -s tests", "throttlekit demo"):
        assert the_command(marker) in lines, f".ci/run does not run {the_command(marker)!r}"


def test_ci_tests_scrapy_on_the_oldest_version_pyproject_accepts() -> None:
    """``.ci/run`` runs the ``scrapy`` session of the first of ``SCRAPY_VERSIONS``,
    which is the lower bound of the ``scrapy`` extra."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    versions = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SCRAPY_VERSIONS" for t in node.targets)
    )
    oldest = versions[0]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'scrapy = ["scrapy>={oldest}"]' in pyproject
    assert f"nox -s \"scrapy(scrapy='{oldest}')\"" in CI.read_text(encoding="utf-8")


def test_nox_runs_on_the_interpreter_that_runs_it() -> None:
    """No session is skipped for want of a Python that happens not to be installed."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    assigned = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert isinstance(assigned["PYTHON"], ast.Constant)
    assert assigned["PYTHON"].value is None
    options = {
        target.attr: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
    }
    error = options["error_on_missing_interpreters"]
    assert isinstance(error, ast.Constant)
    assert error.value is True
    sessions = [
        decorator
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        for decorator in node.decorator_list
        if "nox.session" in ast.unparse(decorator)
    ]
    assert sessions
    for decorator in sessions:
        assert ast.unparse(decorator) == "nox.session(python=PYTHON)", ast.unparse(decorator)


def _checkout_copy(destination: Path) -> Path:
    """The checkout's files as a fresh clone has them (no venvs, caches or build output)."""
    ignored = shutil.ignore_patterns(
        ".git", ".venv", ".nox", "__pycache__", "*.egg-info", "build", "dist", "_build", ".*cache"
    )
    shutil.copytree(ROOT, destination, ignore=ignored)
    return destination


@pytest.mark.slow
def test_the_demo_command_works_on_a_fresh_clone(tmp_path: Path) -> None:
    """The README's demo line, run as written (the demo told to stop after 1 s, not 20)."""
    if shutil.which("python3") is None:
        pytest.skip("no python3 on PATH")
    clone = _checkout_copy(tmp_path / "clone")
    command = the_command("throttlekit demo") + " --duration 1"
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=clone,
        env={**environment, "COLUMNS": "120", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    unreachable = ("No matching distribution found", "Could not find a version", "NewConnection")
    if result.returncode and any(text in result.stderr for text in unreachable):
        pytest.skip(f"the package index is not reachable: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "fast.test" in result.stdout, result.stdout


def _why_section(path: Path, underline: str) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index(f"Why throttlekit\n{underline * len('Why throttlekit')}\n")
    mention = ":doc:`migrating`" if underline == "-" else "migrating.rst"
    end = text.index("\n\n", text.index(mention, start))
    return text[start:end]


@pytest.mark.parametrize(
    ("page", "underline"), [("README.rst", "="), ("docs/getting-started.rst", "-")]
)
def test_the_comparison_quotes_the_measured_figures(page: str, underline: str) -> None:
    """Every figure the front pages quote is on the benchmarks page (rerun: update both)."""
    section = _why_section(ROOT / page, underline)
    measured = (ROOT / "docs" / "benchmarks.rst").read_text(encoding="utf-8")
    figures = re.findall(r"\d+(?:\.\d+)? (?:%|us|ns)", section)
    assert len(figures) >= 5, section
    stale = [figure for figure in figures if figure not in measured]
    assert not stale, f"{page} quotes figures the benchmarks page no longer has: {stale}"
