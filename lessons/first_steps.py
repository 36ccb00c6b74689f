"""Lesson 00's plumbing: the diff between two scripts, without their docstrings."""
from __future__ import annotations

import ast
import difflib
from pathlib import Path


def code_lines(path: str | Path) -> list[str]:
    """A script's lines after its module docstring (the usage line differs between scripts, the code is the point)."""
    text = Path(path).read_text()
    tree = ast.parse(text)
    first = tree.body[1] if ast.get_docstring(tree) is not None else tree.body[0]
    return text.splitlines()[first.lineno - 1:]


def script_diff(old: str | Path, new: str | Path, context: int = 1) -> str:
    """`diff -u old new` of the code (docstrings left out): '-' lines go, '+' lines come."""
    old, new = Path(old), Path(new)
    lines = difflib.unified_diff(code_lines(old), code_lines(new), old.name, new.name, n=context, lineterm="")
    return "\n".join(lines)
