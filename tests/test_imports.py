"""The import graph, read from the source with ast (imports inside functions included): the
layering DESIGN calls for holds, and no module imports itself back through others."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = ("vkllm", "worker", "appliance")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """module -> every module it imports (project modules as the longest existing name)."""
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from pkg import mod` imports the submodule pkg.mod when there is one
                subs = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
                targets |= subs or {base}
        graph[name] = {t for t in targets if t != name}
    return graph


GRAPH = _graph()


def _imports(prefix: str, roots: tuple[str, ...]) -> list[tuple[str, str]]:
    return sorted((m, t) for m, ts in GRAPH.items() if m == prefix or m.startswith(prefix + ".")
                  for t in ts if t.split(".")[0] in roots)


def test_no_import_cycles():
    project = {m: {t for t in ts if t in GRAPH} for m, ts in GRAPH.items()}
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for t in sorted(project[m]):
            if state.get(t) == "open":
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(project):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_web_app_and_worker_meet_only_in_the_neutral_package():
    assert _imports("appliance", ("worker",)) == []
    assert _imports("worker", ("appliance",)) == []


def test_neutral_package_needs_neither_flask_nor_vulkan():
    """vkllm/ holds the contract both sides share: standard library, plus the Redis and RQ clients
    for what both sides do on the queue (the orphan watchdog)."""
    outside = {t.split(".")[0] for m, ts in GRAPH.items() if m.startswith("vkllm") for t in ts}
    assert outside - set(sys.stdlib_module_names) - {"vkllm", "redis", "rq"} == set()
    protocol_imports = {t.split(".")[0] for t in GRAPH["vkllm.protocol"] | GRAPH["vkllm.cli"]}
    assert protocol_imports <= set(sys.stdlib_module_names) | {"vkllm"}


def test_engine_needs_neither_flask_nor_rq_and_the_web_app_no_vulkan():
    assert _imports("worker.engine", ("flask", "rq", "redis", "werkzeug", "appliance")) == []
    assert [(m, t) for m, t in _imports("worker.engine", ("worker",)) if not t.startswith("worker.engine")] == []
    assert _imports("appliance", ("vulkan", "numpy")) == []
