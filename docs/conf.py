"""Sphinx configuration for the throttlekit docs (``nox -s docs`` builds them with -W).

The build needs no network: no intersphinx. The images in ``_static/`` are
drawn by ``docs/_generate.py`` (rerun it after changing a controller).
"""

from __future__ import annotations

import throttlekit

project = "throttlekit"
author = "throttlekit developers"
copyright = "2026, throttlekit developers"
release = throttlekit.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
nitpicky = False
html_theme = "furo"
html_title = f"throttlekit {release}"
html_static_path = ["_static"]
exclude_patterns = ["_build"]
