"""Who needs whom in the tree, for tests/test_layout.py: Python modules by their imports (read with ast,
every import statement, those inside functions and under TYPE_CHECKING too), C files by their
``#include "..."`` lines and by the functions each calls that another file defines; and the circles in
either graph.

A Python edge goes to the module an import names: ``from a.b import c`` to ``a.b.c`` where that is a
module, else to ``a.b`` (``c`` is then a name defined there). Importing ``a.b.c`` runs ``a/b/__init__.py``
too, but that is the package's entry, not a dependency of the importer, and is not counted.

A C edge goes from a file to each file it includes and to each file that defines a function it calls: a
call resolves to the caller's own ``static`` function of that name, else to a ``static inline`` one in a
header it includes, else to the one file that defines it with external linkage. Names the tree does not
define (libc, the Python C API, macros) make no edge.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_graph(root: Path, paths: Iterable[Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``paths`` it imports."""
    files = {module_name(root, path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_known_prefix(alias.name, files) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in files else _known_prefix(base, files))
        graph[name] = {target for target in targets if target and target != name}
    return graph


def _known_prefix(name: str, files: Mapping[str, Path]) -> str:
    """The longest prefix of ``name`` that is a module of the tree ('' for none: a third-party one)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in files:
            return ".".join(parts[:end])
    return ""


_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_DECLARED = re.compile(r"([A-Za-z_]\w*)\s*\($")


def _c_code(text: str) -> str:
    """``text`` without comments, string and character literals and preprocessor lines."""
    text = _COMMENT.sub(" ", text.replace("\\\n", " "))
    text = _LITERAL.sub('""', text)
    return "\n".join("" if line.lstrip().startswith("#") else line for line in text.splitlines())


def _c_functions(code: str) -> tuple[dict[str, bool], set[str]]:
    """The functions ``code`` defines (name -> static) and the names it calls inside their bodies."""
    defined: dict[str, bool] = {}
    called: set[str] = set()
    depth, start, body_start = 0, 0, -1
    for at, char in enumerate(code):
        if char == "{":
            if depth == 0:
                head = code[start:at].strip()
                name = _function_name(head)
                if name is not None:
                    defined[name] = re.search(r"\bstatic\b", head) is not None
                    body_start = at
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                if body_start >= 0:
                    called.update(_CALL.findall(code[body_start:at]))
                body_start, start = -1, at + 1
        elif char == ";" and depth == 0:
            start = at + 1
    return defined, called


def _function_name(head: str) -> str | None:
    """The name a definition's head declares (``... name(params)``), or None (a struct, an initializer)."""
    if not head.endswith(")"):
        return None
    level = 0
    for at in range(len(head) - 1, -1, -1):  # back to the '(' that opens the parameter list
        level += {")": 1, "(": -1}.get(head[at], 0)
        if level == 0:
            found = _DECLARED.search(head[: at + 1])
            return found.group(1) if found else None
    return None


def c_graph(root: Path, paths: Iterable[Path]) -> dict[str, set[str]]:
    """C file (its path from ``root``) -> the C files it includes or calls into."""
    files = {path.relative_to(root).as_posix(): path for path in paths}
    includes: dict[str, set[str]] = {}
    functions: dict[str, tuple[dict[str, bool], set[str]]] = {}
    for name, path in files.items():
        text = path.read_text()
        includes[name] = {(path.parent / target).resolve().relative_to(root.resolve()).as_posix()
                          for target in _INCLUDE.findall(_COMMENT.sub(" ", text))}
        functions[name] = _c_functions(_c_code(text))
    external: dict[str, str] = {}
    for name, (defined, _) in functions.items():
        external.update({function: name for function, static in defined.items() if not static})
    graph: dict[str, set[str]] = {}
    for name, (defined, called) in functions.items():
        targets = {target for target in includes[name] if target in files}
        for function in called - set(defined):
            inline = [header for header in targets if header.endswith(".h")
                      and functions[header][0].get(function)]
            targets.update(inline[:1] or ([external[function]] if function in external else []))
        graph[name] = targets - {name}
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's), each sorted: every circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    """Every node ``start`` leads to, itself excluded."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen
