"""The package as a whole: its folders are the pipeline's stages, each importing only from the
stages below it, and no module imports, directly or through others, one that imports it."""

import ast
import re
from pathlib import Path

import tomllib
from helpers import REPO

PACKAGE = REPO / "esmshard"
# The stages from the bottom up: a module imports only from its own stage or one below.
# The top level holds what every stage shares (the version, file helpers, the outdir's layout,
# typed config values); embeddings_h5, what embeddings.h5 holds (the one table of kinds);
# api, esmshard.embed, which runs the steps in the calling process.
STAGES = (
    "",
    "search",
    "embeddings_h5",
    "input",
    "store",
    "models",
    "compute",
    "outputs",
    "steps",
    "commands",
    "api",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports, at its top or inside functions."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + [node.module] if node.module else base)
            submodules = {f"{target}.{a.name}" for a in node.names} & modules
            found |= submodules
            if len(submodules) < len(node.names) and target in modules:
                found.add(target)  # a name defined in the module itself
    return found - {name}


def missing_modules(path: Path, modules: set[str]) -> list[str]:
    """The package's modules that `path` imports from, at its top or inside functions, and that
    do not exist (a module moved, an import left behind)."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or node.module.startswith("esmshard")):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + [node.module] if node.module else base)
            if target not in modules:
                missing.append(f"{name}:{node.lineno} imports from {target}")
    return missing


def test_every_import_of_the_package_names_a_module_it_has():
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    folders = {module_name(p / "__init__.py") for p in PACKAGE.rglob("*") if p.is_dir()}
    known = set(paths) | folders  # a folder without __init__.py is a namespace package
    assert [m for path in paths.values() for m in missing_modules(path, known)] == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done = [], set()

    def visit(module, path):
        for imported in sorted(graph[module]):
            if imported in path:
                found.append(path[path.index(imported) :] + [imported])
            elif imported not in done:
                visit(imported, path + [imported])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return found


def test_the_package_has_no_import_circle():
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: imports(path, set(paths)) for name, path in paths.items()}
    assert graph["esmshard.models"] >= {"esmshard.models.families", "esmshard.models.spec"}
    assert "esmshard.outputs.reader" in graph["esmshard.api.calls"]  # imports inside functions too
    assert circles(graph) == []


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else ""


def test_every_module_imports_only_from_its_stage_or_below():
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    assert {stage(name) for name in paths} == set(STAGES)
    upward = [
        f"{name} imports {imported}"
        for name, path in sorted(paths.items())
        if name != "esmshard"  # the public API: esmshard.open_embeddings
        for imported in sorted(imports(path, set(paths)))
        if STAGES.index(stage(imported)) > STAGES.index(stage(name))
    ]
    assert upward == []


def test_how_it_works_draws_the_stages_in_order():
    text = (REPO / "docs" / "how-it-works.md").read_text()
    places = [text.index(f"`esmshard/{folder}/`") for folder in STAGES[1:]]
    assert places == sorted(places)


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_version_is_written_in_one_place():
    import esmshard

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "esmshard.version.__version__"
    }
    # Where it must be repeated, it is checked: the rules' conda env pins the release, and the
    # changelog's first entry is it.
    env = (REPO / "envs" / "esmshard.yaml").read_text()
    assert re.findall(r"esmshard==(\S+)", env) == [esmshard.__version__]
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(r"^## (\S+)", changelog, re.M).group(1) == esmshard.__version__
