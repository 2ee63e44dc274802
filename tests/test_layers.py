"""Imports point one way (docs/architecture.md, "Layers"): no module imports a layer above its own.

Every import of the package is read from the source (relative imports and `alaya_flash.*`, also
those inside functions), so a lazy import cannot hide a wrong direction.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS = [
    ("model", ["model_zoo"]),                                   # networks, configs, loading
    ("conventions", ["streaming.gbuffer", "streaming.values", "streaming.metrics", "streaming.stops"]),  # what every part shares
    ("sources and sinks", ["streaming.files", "streaming.world"]),
    ("render", ["streaming.render"]),                           # the chunk loop, samplers, stages, pipelines, runner
    ("front ends", ["nodes", "streaming.live", "client"]),      # ComfyUI nodes; the live server; a game engine's client
    ("training", ["training"]),                                 # a client of the networks and the renderer
    ("cli", ["streaming.cli"]),
]
# Front ends are siblings: neither looks at the other. Only the CLI, which starts the runner,
# looks node classes up (a workflow is a graph of nodes).
SIBLINGS_APART = [("nodes", "streaming.live"), ("nodes", "client")]


# Folders that only group layers (their __init__ holds a docstring and imports nothing).
GROUPING = {"streaming"}


def layer_of(module: str) -> int:
    ranks = [i for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    assert len(ranks) == 1, f"{module}: in {len(ranks)} layers; each module must sit in exactly one"
    return ranks[0]


def package_modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in ("model_zoo", "streaming", "nodes", "training") and rel != Path("client.py"):
            continue
        name = ".".join(rel.with_suffix("").parts)
        is_pkg = name.endswith(".__init__")
        if name.removesuffix(".__init__") in GROUPING:
            continue
        yield path, name.removesuffix(".__init__"), is_pkg


def imports(path: Path, module: str, is_pkg: bool):
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [f"{target}.{a.name}" if target else a.name for a in node.names]
            elif node.module and node.module.startswith("alaya_flash."):
                names = [f"{node.module.removeprefix('alaya_flash.')}.{a.name}" for a in node.names]
            else:
                continue
            for target in names:
                yield node.lineno, target
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("alaya_flash."):
                    yield node.lineno, a.name.removeprefix("alaya_flash.")


def resolved(target: str) -> str:
    """`from ..streaming import sampler` names a module; `from .x import Y` names x."""
    parts = target.split(".")
    while parts and not ((ROOT / Path(*parts)).with_suffix(".py").exists() or (ROOT / Path(*parts)).is_dir()):
        parts.pop()
    return ".".join(parts)


def test_no_module_imports_a_layer_above_its_own():
    wrong = []
    for path, module, is_pkg in package_modules():
        mine = layer_of(module)
        for line, target in imports(path, module, is_pkg):
            target = resolved(target)
            if not target:
                continue
            theirs = layer_of(target)
            if theirs > mine:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
            for a, b in SIBLINGS_APART:
                if module.startswith(a) and target.startswith(b) or module.startswith(b) and target.startswith(a):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} imports its sibling {target}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_upward_import_even_inside_a_function(tmp_path):
    """A render module that lazily imports the CLI, and one that imports a sibling front end, are caught."""
    f = tmp_path / "driver.py"
    f.write_text("def later():\n    from ..cli import main\n    from ...nodes import comfy\n")
    found = [resolved(t) for _, t in imports(f, "streaming.render.driver", is_pkg=False)]
    assert found == ["streaming.cli", "nodes.comfy"]
    assert all(layer_of(t) > layer_of("streaming.render.driver") for t in found)
    assert layer_of("streaming.values") < layer_of("streaming.files.readers") < layer_of("streaming.render.pipelines") < layer_of("training.student")


def test_grouping_folders_import_nothing():
    """A folder that only groups layers sits in none, so its __init__ must not import anything."""
    for name in GROUPING:
        path = ROOT / name / "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], f"{path}: imports"


# The loading modules of model_zoo point one way (model_zoo/folders.py's docstring): loading ->
# weight_files -> helios, bundle -> published -> release -> folders, identify.
def model_zoo_imports() -> dict[str, set[str]]:
    """module -> the model_zoo modules it imports (lazy ones included)."""
    graph = {}
    for path, module, is_pkg in package_modules():
        if module.startswith("model_zoo"):
            targets = {resolved(t) for _, t in imports(path, module, is_pkg)}
            graph[module] = {t for t in targets if t.startswith("model_zoo.") and t != module}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of graph as [a, b, ..., a], or [] when its imports form none (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once all it imports is explored
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_model_zoo_imports_form_no_cycle():
    """No model_zoo module imports, even lazily, one that imports it back (directly or through others)."""
    graph = model_zoo_imports()
    assert {"model_zoo.bundle", "model_zoo.published", "model_zoo.release", "model_zoo.helios", "model_zoo.folders",
            "model_zoo.identify", "model_zoo.weight_files", "model_zoo.loading"} <= set(graph)
    assert "model_zoo.release" in graph["model_zoo.folders"]  # the dispatch is seen
    cycle = import_cycle(graph)
    assert not cycle, " -> ".join(cycle)


def test_the_cycle_check_sees_a_lazy_import_loop(tmp_path):
    """The loop this layout removed (bundle lazily importing release, which imports bundle) is found."""
    f = tmp_path / "bundle.py"
    f.write_text("def load_flash():\n    from .release import load_release\n")
    lazy = {resolved(t) for _, t in imports(f, "model_zoo.bundle", is_pkg=False)}
    assert lazy == {"model_zoo.release"}
    graph = {**model_zoo_imports(), "model_zoo.bundle": lazy}
    assert import_cycle(graph) == ["model_zoo.bundle", "model_zoo.release", "model_zoo.bundle"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
