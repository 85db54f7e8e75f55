"""``python -m throttlekit`` and the ``throttlekit`` command (needs ``throttlekit-http[cli]``)."""

from __future__ import annotations

import sys

__all__ = ["main"]

#: The modules of the ``cli`` extra that the command line imports at start.
_CLI_MODULES = frozenset({"typer", "rich", "tomli", "click", "shellingham"})


def main(argv: list[str] | None = None) -> int:
    """Run the ``throttlekit`` command line; return its exit code.

    Exit codes: 0 success, 1 some work failed (``fetch``: some URLs;
    ``simulate --check``: a rule broken), 2 bad usage, bad configuration or a
    missing optional extra, 130 interrupted.
    """
    try:
        from ._cli import run
    except ModuleNotFoundError as exc:
        if exc.name not in _CLI_MODULES:
            raise
        missing = exc.name
        print(
            f"throttlekit: the command line needs {missing}, which is not installed: "
            'pip install "throttlekit-http[cli]"',
            file=sys.stderr,
        )
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
