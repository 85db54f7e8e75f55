"""Developer tasks: ``nox -s tests``, ``lint``, ``typing``, ``docs``, ``benchmarks``."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typing", "docs"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = ["3.11"]


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (real local servers, a real redis-server when installed)."""
    session.install("-e", ".[all,test,benchmarks,docs]")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typing(session: nox.Session) -> None:
    """mypy --strict on the package."""
    session.install("-e", ".[all]", "mypy>=1.11")
    session.run("mypy", "--strict", "throttlekit")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs with warnings as errors."""
    session.install("-e", ".[all,docs]")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session(python=PYTHON)
def benchmarks(session: nox.Session) -> None:
    """Run every benchmark side by side with the peers; write JSON results."""
    session.install("-e", ".[all,benchmarks]")
    session.run("python", "-m", "benchmarks", *session.posargs)
