"""The code's shape (issue 30): no module over 500 lines, no function over 80, and the edge never imports
the composition root. Read from the source, so a regression names the file."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parent.parent / "gateway"
MODULE_LINES = 500
FUNCTION_LINES = 80
EDGE = ("http", "dashboard", "inbound", "pipeline", "memory", "jobs", "adapters")


def sources() -> list[Path]:
    return sorted(GATEWAY.rglob("*.py"))


def test_no_module_over_500_lines_and_no_function_over_80() -> None:
    too_long: list[str] = []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(GATEWAY.parent)
        if text.count("\n") > MODULE_LINES:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert too_long == []


def imported(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def test_the_edge_adapters_and_pipeline_never_import_the_composition_root() -> None:
    offenders = [
        str(path.relative_to(GATEWAY.parent))
        for folder in EDGE
        for path in sorted((GATEWAY / folder).rglob("*.py"))
        if "gateway.wiring" in imported(path)
    ]
    assert offenders == []


def test_no_adapter_imports_the_pipeline() -> None:
    offenders = [
        f"{path.relative_to(GATEWAY.parent)}: {module}"
        for path in sorted((GATEWAY / "adapters").rglob("*.py"))
        for module in sorted(imported(path))
        if module.startswith("gateway.pipeline")
    ]
    assert offenders == []
