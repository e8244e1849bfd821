"""MkDocs hooks of the site (mkdocs.yml's ``hooks:``): the docstrings' Sphinx roles shown as the code they name."""

from __future__ import annotations

import re
from typing import Any

# The docstrings write ``:func:`name``` (Sphinx's roles, for readers of the source); Markdown renders the role's
# name before the code, ":func:<code>name</code>", which the reference shows as the code alone.
SPHINX_ROLE = re.compile(r":(?:attr|class|data|exc|func|meth|mod|obj):(?=<code>)")


def on_page_content(html: str, **_: Any) -> str:
    """The page's HTML without the roles' names before their code."""
    return SPHINX_ROLE.sub("", html)
