"""Sphinx configuration for the throttlekit docs."""

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
html_title = "throttlekit"
exclude_patterns = ["_build"]
