"""The config documented from its own source: every group and field with its type, default and docstring (the body
of `hacrl train --help-config` and of docs/config-reference.txt).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import fields, is_dataclass
from typing import Any

from hacrl.config.schema import GROUPS, AgentConfig, TrainConfig


def describe() -> str:
    """Every config group and field with its type, default and docstring (the body of `hacrl train --help`)."""
    lines = []
    for group in GROUPS:
        cls = {"agents": AgentConfig}.get(group) or type(getattr(TrainConfig(), group))
        title = f"{group}:" + ("  (a list; index with agents.<i>.<field>)" if group == "agents" else "")
        lines.append(title)
        lines.extend(_describe_fields(cls, ""))
        lines.append("")
    return "\n".join(lines)


def _describe_fields(cls: type, prefix: str) -> list[str]:
    lines = []
    docs = field_docs(cls)
    for f in fields(cls):
        default = default_of(f)
        if is_dataclass(default):  # a nested group, e.g. runtime.ray
            lines.extend(_describe_fields(type(default), f"{prefix}{f.name}."))
            continue
        doc = " ".join(docs.get(f.name, "").split())
        lines.append(f"  {prefix}{f.name} = {default!r}")
        if doc:
            lines.extend(textwrap.wrap(doc, width=100, initial_indent="      ", subsequent_indent="      "))
    return lines


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:], strict=False):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    docs[node.target.id] = str(after.value.value)
    return docs


def default_of(f) -> Any:
    from dataclasses import MISSING

    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return "???"
