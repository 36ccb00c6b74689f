"""The doctor's static reading: what the script's text shows and no CPU run can (a GPU chosen by the global rank)."""

from __future__ import annotations

from pathlib import Path

from .doctor_record import _shown_path
from .doctor_report import Finding, Rule


def _device_from_global_rank(script) -> list[Finding]:  # STATIC, below
    """Read the script: a GPU picked by the global rank (dist.get_rank(), RANK) instead of LOCAL_RANK. On the CPU
    that branch never runs; on one node the two ranks agree; from the second node on, cuda:RANK doesn't exist."""
    import ast

    try:
        tree = ast.parse(Path(script).read_text())
    except (OSError, SyntaxError, ValueError):
        return []

    def text(node):
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    def names_rank(node, names=()):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "int" and node.args:
            return names_rank(node.args[0], names)
        if isinstance(node, ast.Call) and not node.args and not node.keywords and (
                isinstance(node.func, ast.Attribute) and node.func.attr == "get_rank" or
                isinstance(node.func, ast.Name) and node.func.id == "get_rank"):
            return True
        if isinstance(node, ast.Subscript) and text(node.slice) == "RANK":
            return True  # os.environ["RANK"]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "get", "getenv") and node.args and text(node.args[0]) == "RANK":
            return True
        return isinstance(node, ast.Name) and node.id in names

    assigned = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append(node.value)
    parameters = {a.arg for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.Lambda))
                  for a in node.args.args + node.args.kwonlyargs}
    names = {name for name, values in assigned.items() if name not in parameters
             and all(names_rank(v) for v in values)}  # only ever the global rank

    def by_rank(node):
        return names_rank(node, names)

    for node in ast.walk(tree):
        chosen = None
        if isinstance(node, ast.Call):
            func = node.func
            attr = func.attr if isinstance(func, ast.Attribute) else None
            if attr == "set_device" and node.args and by_rank(node.args[0]):
                chosen = "torch.cuda.set_device"
            elif attr == "device" and len(node.args) == 2 and text(node.args[0]) == "cuda" and by_rank(node.args[1]):
                chosen = "torch.device('cuda', rank)"
            elif attr in ("cuda", "to") and len(node.args) == 1 and not node.keywords and by_rank(node.args[0]):
                chosen = f".{attr}(rank)"
            for keyword in node.keywords:
                if keyword.arg == "device_ids" and isinstance(keyword.value, (ast.List, ast.Tuple)) and \
                        any(by_rank(v) for v in keyword.value.elts):
                    chosen = "device_ids=[rank]"
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for before, value in zip(parts, parts[1:]):
                if text(before) and text(before).endswith("cuda:") and isinstance(value, ast.FormattedValue) \
                        and by_rank(value.value):
                    chosen = "f'cuda:{rank}'"
        if chosen:
            return [Finding("device-from-global-rank", (
                f"{chosen} with the global rank: right on one node, where it equals LOCAL_RANK; from the second"
                " node on it names a GPU that machine doesn't have (invalid device ordinal). Choose the GPU by"
                " LOCAL_RANK: int(os.environ['LOCAL_RANK']) (lesson 10)"),
                f"{_shown_path(str(script))}:{node.lineno}")]
    return []


STATIC = Rule(("device-from-global-rank",), (), _device_from_global_rank)  # reads the script's text, not events
