"""The public surface of throttlekit: ``__all__``, docstrings, and imports without extras."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap
import types
from typing import Any

import pytest

import throttlekit

#: Public modules whose ``__all__`` is part of the API (adapters need their extras).
PUBLIC_MODULES = (
    "throttlekit",
    "throttlekit.scopes",
    "throttlekit.headers",
    "throttlekit.backends",
    "throttlekit.adapters",
    "throttlekit.otel",
)


def _public_names(module: types.ModuleType) -> set[str]:
    """Names a module binds that look public: not private, not submodules or __future__ flags."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and type(value).__module__ != "__future__"
    }


def test_all_is_sorted_and_unique() -> None:
    assert throttlekit.__all__ == sorted(throttlekit.__all__)
    assert len(set(throttlekit.__all__)) == len(throttlekit.__all__)


def test_all_is_exactly_the_public_surface() -> None:
    assert set(throttlekit.__all__) == _public_names(throttlekit)
    assert not [name for name in throttlekit.__all__ if name.startswith("_")]


def test_star_import_gives_every_listed_name() -> None:
    namespace: dict[str, Any] = {}
    exec("from throttlekit import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(throttlekit.__all__)
    for name, value in namespace.items():
        assert value is getattr(throttlekit, name)
        assert value.__module__.startswith("throttlekit"), name


def test_version() -> None:
    assert isinstance(throttlekit.__version__, str)
    assert throttlekit.__version__.count(".") >= 2


def _undocumented_members(cls: type) -> list[str]:
    missing = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        if (callable(target) or isinstance(value, property)) and not (
            getattr(target, "__doc__", None) or ""
        ).strip():
            missing.append(name)
    return missing


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_modules_list_importable_documented_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert (module.__doc__ or "").strip(), f"{module_name} has no docstring"
    names = getattr(module, "__all__", [])  # a package of submodules may list nothing
    assert names == sorted(names), f"{module_name}.__all__ is not sorted"
    for name in names:
        assert hasattr(module, name), f"{module_name}.__all__ lists missing {name!r}"
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            doc = inspect.getdoc(value) or ""
            assert doc.strip(), f"{module_name}.{name} has no docstring"
            assert doc.splitlines()[0].strip(), f"{module_name}.{name}: no one-line summary"
        if inspect.isclass(value):
            missing = _undocumented_members(value)
            assert not missing, f"{module_name}.{name}: undocumented public members {missing}"


@pytest.mark.parametrize("name", ["Limiter", "ScopePolicy"])
def test_main_classes_show_a_usage_example(name: str) -> None:
    assert "Usage::" in (getattr(throttlekit, name).__doc__ or "")


_BLOCKED = (
    "httpx",
    "httpx2",
    "aiohttp",
    "scrapy",
    "redis",
    "valkey",
    "requests",
    "urllib3",
    "twisted",
    "typer",
    "rich",
    "matplotlib",
    "opentelemetry",
)

_WITHOUT_EXTRAS = textwrap.dedent(
    """
    import importlib.abc
    import sys

    BLOCKED = {blocked!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Block())

    import asyncio
    import throttlekit
    import throttlekit.adapters
    import throttlekit.backends
    import throttlekit.headers
    import throttlekit.scopes

    async def main():
        limiter = throttlekit.Limiter(default=throttlekit.ScopePolicy(delay=0))
        async with limiter.acquire("https://example.com/") as permit:
            permit.record(status=200, headers={{"Retry-After": "1"}})
        return sorted(permit.scopes)

    assert asyncio.run(main()) == ["example.com"]
    loaded = sorted({{name.split(".")[0] for name in sys.modules}} & BLOCKED)
    assert not loaded, loaded

    for module, extra in [
        ("throttlekit.adapters.httpx", "httpx"),
        ("throttlekit.adapters.httpx2", "httpx2"),
        ("throttlekit.adapters.aiohttp", "aiohttp"),
        ("throttlekit.adapters.requests", "requests"),
        ("throttlekit.adapters.scrapy", "scrapy"),
        ("throttlekit.backends.redis", "redis"),
        ("throttlekit.otel", "otel"),
    ]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            hint = f'pip install "throttlekit-http[{{extra}}]"'
            assert hint in str(exc), (module, str(exc))
        else:
            raise AssertionError(f"{{module}} imported without its extra")
    print("ok")
    """
)


def test_import_without_optional_extras() -> None:
    """The core imports and works with none of the optional packages installed."""
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS.format(blocked=set(_BLOCKED))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


_ONE_LIBRARY = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == {blocked!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Block())

    import anyio
    import {library}
    import throttlekit
    from throttlekit.adapters.{library} import ThrottledTransport, client

    async def main():
        limiter = throttlekit.Limiter()
        inner = {library}.MockTransport(lambda request: {library}.Response(204))
        transport = ThrottledTransport(limiter, inner)
        async with {library}.AsyncClient(transport=transport) as http:
            response = await http.get("https://example.com/")
        async with client(limiter) as made:
            assert isinstance(made, {library}.AsyncClient)
        return response.status_code

    assert anyio.run(main) == 204
    assert {blocked!r} not in sys.modules
    print("ok")
    """
)


@pytest.mark.parametrize(("library", "blocked"), [("httpx", "httpx2"), ("httpx2", "httpx")])
def test_each_httpx_adapter_needs_its_library_only(library: str, blocked: str) -> None:
    """The httpx2 transport works where only httpx2 is installed (the SDKs' case), and back."""
    pytest.importorskip(library)
    result = subprocess.run(
        [sys.executable, "-c", _ONE_LIBRARY.format(library=library, blocked=blocked)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
