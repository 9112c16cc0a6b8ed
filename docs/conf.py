"""Sphinx configuration of the docs site (Markdown pages through myst-parser).

``tests/test_docs_site.py`` builds it with ``-W --keep-going -n``: a broken link, a missing
anchor or a page outside the toctree fails the suite.
"""

from __future__ import annotations

project = "duplex-gateway"
author = "duplex-gateway contributors"
copyright = "duplex-gateway contributors"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# Headings up to ### get anchors, so "page.md#a-heading" links are checked.
myst_heading_anchors = 3
# Not pages: the benchmark data and plots are linked from pages, never built.
exclude_patterns = ["_build", "performance/bench/*.json"]
# Mermaid diagrams stay fenced code for the repository's own renderer; no extension that
# fetches a script is used, so Pygments' unknown lexer name is not an error here.
suppress_warnings = ["misc.highlighting_failure"]
html_theme = "alabaster"
