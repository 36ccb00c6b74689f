"""Reading the course's scripts side by side: what one step changes from the previous one."""
from __future__ import annotations

import difflib
from pathlib import Path


def show_diff(old: str | Path, new: str | Path, context: int = 1) -> None:
    """Print the unified diff between two scripts, as `diff -u` would (the docstrings differ too)."""
    old, new = Path(old), Path(new)
    lines = difflib.unified_diff(old.read_text().splitlines(), new.read_text().splitlines(),
                                 fromfile=old.name, tofile=new.name, n=context, lineterm="")
    print("\n".join(lines))
