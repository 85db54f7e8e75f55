"""The ``throttlekit`` command line (needs the ``cli`` extra: typer, rich, httpx, aiohttp).

Commands: ``simulate`` (a policy against a server model in virtual time),
``demo`` (a live crawl of local sites with different behaviours) and
``fetch`` (a polite, resumable bulk fetcher). Exit codes: 0 success, 1 some
work failed, 2 bad usage or configuration, 130 interrupted.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from ._common import EXIT_USAGE, CLIError, stderr

__all__ = ["app", "run"]

F = TypeVar("F", bound=Callable[..., Any])

#: Modules of the ``cli`` extra that commands import when they run.
_EXTRA_MODULES = frozenset({"httpx", "aiohttp", "h11", "httpcore", "anyio"})

app = typer.Typer(
    name="throttlekit",
    help="See and use throttlekit's throttling: simulate policies, watch a demo crawl, "
    "fetch URLs politely. Exit codes: 0 ok, 1 some work failed, 2 usage or config "
    "error, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich markup would eat bracketed words ("throttlekit-http[plot]",
    # "[simulate]") and rich's boxes cut long option names at 80 columns.
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


def _reporting(command: F) -> F:
    """Turn a :class:`CLIError` into one red line on stderr and its exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except CLIError as exc:
            stderr.print(f"[bold red]error:[/] {escape(str(exc))}")
            raise typer.Exit(exc.code) from None
        except ModuleNotFoundError as exc:
            if exc.name not in _EXTRA_MODULES:
                raise
            stderr.print(
                f"[bold red]error:[/] this command needs {exc.name}, which is not installed: "
                'pip install "throttlekit-http[cli]"'
            )
            raise typer.Exit(EXIT_USAGE) from None
        except KeyboardInterrupt:
            stderr.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"throttlekit {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    pass


def _register() -> None:
    from ._demo import demo_command
    from ._fetch import fetch_command
    from ._simulate import simulate_command

    app.command("simulate", short_help="Run a policy against a simulated server, in virtual time.")(
        _reporting(simulate_command)
    )
    app.command("demo", short_help="Crawl four local sites and watch throttlekit adapt.")(
        _reporting(demo_command)
    )
    app.command("fetch", short_help="Fetch URLs politely, per-host throttled and resumable.")(
        _reporting(fetch_command)
    )


_register()


#: The usage error of the click that typer runs on (click's, or typer's own copy
#: of it): shown by click, it is three lines (usage, a hint, the error).
_UsageError: type[Exception] = next(
    cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "UsageError"
)


def _usage_error(exc: Exception) -> str:
    """A usage error in one line: what is wrong, then where to read more."""
    context = getattr(exc, "ctx", None)
    command = getattr(context, "command_path", None) or "throttlekit"
    message = getattr(exc, "format_message", exc.__str__)()
    message = message[:1].lower() + message[1:].rstrip(".")  # as the other errors
    return f"{message}; see {command} --help"


def run(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    Every error is one line on stderr starting with ``error:``, also click's
    usage errors (an unknown option, a value out of range).
    """
    try:
        code = app(args=argv, prog_name="throttlekit", standalone_mode=False)
    except _UsageError as exc:
        context = getattr(exc, "ctx", None)
        if context is not None and not (argv if argv is not None else sys.argv[1:]):
            typer.echo(context.get_help())  # no arguments at all: the help, as before
            return EXIT_USAGE
        stderr.print(f"[bold red]error:[/] {escape(_usage_error(exc))}")
        return EXIT_USAGE
    except SystemExit as exc:
        code = exc.code
    except typer.Abort:
        stderr.print("[yellow]interrupted[/]")
        return 130
    if code is None:
        return 0
    return code if isinstance(code, int) else EXIT_USAGE
