"""What the repository promises about itself: its documents link to files that exist and name tests that exist,
the driver reaches agents only through the workers' messages, and no function is longer than a screen."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_the_documents_exists(document):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text())
    missing = [link for link in links if "://" not in link and not (document.parent / link).exists()]
    assert missing == []


def test_the_readme_stays_short_and_names_its_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 300
    assert "make demo" in text and "make test" in text


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_driver_reaches_agents_only_through_the_workers_messages():
    """The seam: the driver (data, scoring, pools, logging, checkpoints) imports nothing of `hacrl.agent` except
    where its backends start the workers; `hacrl eval`'s in-process agents live in `hacrl.tools`."""
    crossing = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "src/hacrl/driver").rglob("*.py"))
        if path.parent.name != "backends"
        for name in _imports(path)
        if name == "hacrl.agent" or name.startswith("hacrl.agent.")
    }
    assert crossing == set()


def _module_files() -> dict[str, Path]:
    """{dotted module name: its file} of every module under src/hacrl (a package as its __init__.py)."""
    src = ROOT / "src"
    files = {}
    for path in sorted((src / "hacrl").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _module_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of hacrl that `path` imports anywhere (at the top, in a function, under TYPE_CHECKING): for
    `from a.b import c`, a.b.c where that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module in modules:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
            found.update(subs or {node.module})
    return found


def test_no_import_forms_a_circle():
    """The imports run one way (README, Layout): no module reaches itself through the imports of hacrl's modules,
    counting every import, also one inside a function or under TYPE_CHECKING (a circle there holds at run time only
    by the order of the calls)."""
    modules = _module_files()
    graph = {name: _module_imports(path, modules) - {name} for name, path in modules.items()}
    circles, seen = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            name, path = stack.pop()
            for nxt in sorted(graph[name]):
                if nxt == start:
                    circle = frozenset(path)
                    if circle not in seen:
                        seen.add(circle)
                        circles.append(" -> ".join([*path, start]))
                elif nxt not in path and nxt > start:  # each circle once, from its smallest module
                    stack.append((nxt, [*path, nxt]))
    assert circles == []


def test_no_code_rewrites_an_agents_placement_or_precision_settings():
    """What another role or process of an agent does comes from `Precision.resolve(agent, role=...)` and
    `Placement.resolve(agent)`, never from a copy of its config with `frozen`, `devices`, `sampler_devices`,
    `offload` or `master_weights` rewritten (two such copies described its sampler, and disagreed)."""
    keys = r"\b(frozen|devices|sampler_devices|offload|master_weights)="
    rewrites = []
    for path in sorted((ROOT / "src/hacrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "replace":
                if any(re.match(keys, f"{k.arg}=") for k in node.keywords if k.arg):
                    rewrites.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert rewrites == []


def _packages() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "src/hacrl").rglob("__init__.py") if p.parent != ROOT / "src/hacrl")


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(ROOT / "src")))
def test_every_module_is_named_by_its_folder_and_the_readmes_layout(package):
    """Each folder's `__init__` says what it owns, and the README's Layout shows every room: a module that neither
    names is one a reader cannot find."""
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("```", 2)[1]
    owner = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    owner += (package / "__init__.py").read_text()  # a lazy registry of names counts too
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    modules += sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    unnamed = [m for m in modules if not re.search(rf"\b{m}\b", owner)]
    unlisted = [m for m in modules if not re.search(rf"\b{m}\b", layout)]
    assert (unnamed, unlisted) == ([], [])


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in sorted((ROOT / "src/hacrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def test_no_class_inside_an_agent_is_longer_than_400_lines():
    long = []
    for path in sorted((ROOT / "src/hacrl/agent").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno >= 400:
                long.append(f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def test_an_agents_roles_are_composed_and_no_private_name_crosses_a_module():
    """Issue 70, part 1: the sampling and learning roles are parts a worker holds, not subclasses of it (a sampler
    that refused `learn`, a rank that overrode 12 of 27 methods); and no module imports another's private name (the
    rollout record every worker kind reached into)."""
    subclasses, private = [], []
    for path in sorted((ROOT / "src/hacrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "AgentWorker" for b in node.bases):
                subclasses.append(f"{path.relative_to(ROOT)}:{node.name}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hacrl"):
                private += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert subclasses == [] and private == []


def test_every_test_a_document_names_exists():
    """docs/reliability.md maps each promise to its test (`<file>::<test>` under tests/): each must exist."""
    named = set()
    for document in DOCUMENTS:
        named |= set(re.findall(r"`([a-z_/]+\.py)::(test_\w+)`", document.read_text()))
    assert len(named) > 50
    missing = [f"{f}::{t}" for f, t in sorted(named)
               if not re.search(rf"^def {t}\(", (ROOT / "tests" / f).read_text(), re.M)]  # fmt: skip
    assert not missing, missing
