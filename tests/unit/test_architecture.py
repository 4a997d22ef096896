"""The layering of the package, checked on its imports (read with ast, nothing run):
models import nothing else of orch but the states both ends name (agent/kernel/
states.py); the agent only the standard library; only the
transport touches paramiko and fabric; only the CLI typer and rich; the CLI nothing
of the package but the API; no package imports one that imports it back, and the SSH
and Slurm backends neither the other."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved to absolute names."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            name = node.module or ""
            full = (f"{base}.{name}" if name else base) if node.level else name
            found.add(full)
            found.update(f"{full}.{alias.name}" for alias in node.names)
    return found


def files(*under: str) -> list[Path]:
    """The package's Python files under each folder (the package itself for "");
    a folder that no longer exists fails here, not as a check that finds nothing."""
    missing = [sub for sub in under if not (PACKAGE / sub).is_dir()]
    assert missing == [], f"no such part of the package: {missing}"
    return sorted(p for sub in under for p in (PACKAGE / sub).rglob("*.py"))


def offenders(paths: list[Path], bad: object) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        names = sorted(n for n in imports_of(path) if bad(n))  # type: ignore[operator]
        if names:
            found[str(path.relative_to(PACKAGE.parent))] = names
    return found


SHARED_WITH_MODELS = ("orchestrator.models", "orchestrator.agent.kernel.states")


def test_models_import_nothing_else_of_the_package() -> None:
    outside = offenders(
        files("models"),
        lambda n: n.startswith("orchestrator.") and not n.startswith(SHARED_WITH_MODELS),
    )
    assert outside == {}


def test_the_agent_imports_only_the_standard_library() -> None:
    def foreign(name: str) -> bool:
        top = name.split(".")[0]
        if top == "orchestrator":
            return not name.startswith("orchestrator.agent")
        return top not in sys.stdlib_module_names

    assert offenders(files("agent"), foreign) == {}


def test_the_controller_imports_only_the_agents_kernel() -> None:
    """The rest of the agent is host-only: what it does runs on a host, not here."""
    outside = [p for p in files("") if p.relative_to(PACKAGE).parts[0] != "agent"]

    def host_only(name: str) -> bool:
        return name.startswith("orchestrator.agent.") and not name.startswith(
            "orchestrator.agent.kernel"
        )

    assert offenders(outside, host_only) == {}


@pytest.mark.parametrize("path", files("agent"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_host_side_code_parses_as_the_oldest_python_a_host_may_run(path: Path) -> None:
    """The agent runs on the hosts' own Python, 3.8 at the oldest: no syntax of a newer
    one, and annotations left unevaluated (`str | None` and `list[str]` are 3.10's and
    3.9's at run time)."""
    tree = ast.parse(path.read_text(), str(path), feature_version=(3, 8))
    code = [n for n in tree.body if not isinstance(n, ast.Expr)]  # past the docstring
    if code:
        first = code[0]
        future = isinstance(first, ast.ImportFrom) and first.module == "__future__"
        assert future and "annotations" in {a.name for a in first.names}, path


@pytest.mark.parametrize(
    ("libraries", "allowed"),
    [
        (("paramiko", "fabric", "invoke"), "transport"),
        (("typer", "rich", "click"), "cli"),
        (("starlette", "uvicorn"), "ui"),
    ],
)
def test_third_party_libraries_stay_in_their_room(libraries: tuple[str, ...], allowed: str) -> None:
    others = [p for p in files("") if allowed not in p.relative_to(PACKAGE).parts[:1]]
    assert offenders(others, lambda n: n.split(".")[0] in libraries) == {}


def test_the_checks_see_the_imports_they_forbid_elsewhere() -> None:
    assert offenders(files("cli"), lambda n: n.split(".")[0] == "typer")
    assert offenders(files("transport"), lambda n: n.split(".")[0] == "paramiko")
    relative = imports_of(PACKAGE / "agent" / "store" / "sync.py")
    assert {"orchestrator.agent.kernel.framing", "orchestrator.agent.store.content"} <= relative


def test_no_bench_script_shadows_a_standard_module() -> None:
    """bench/ is the first entry of sys.path when a bench script runs: a bench/queue.py
    made `import queue` (fabric's, paramiko's) find it instead of the standard one."""
    scripts = {p.stem for p in (PACKAGE.parent / "bench").glob("*.py")}
    assert sorted(scripts & set(sys.stdlib_module_names)) == []


def package_imports() -> dict[str, dict[str, set[str]]]:
    """Which top-level parts of orchestrator (packages, and modules such as __main__.py)
    import which others: part -> imported part -> the files that do. The package's own
    `__init__` and `__main__` (entry points) are left out."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in files(""):
        parts = path.relative_to(PACKAGE).parts
        source = parts[0].removesuffix(".py")
        if source in ("__init__", "__main__"):
            continue
        for name in imports_of(path):
            pieces = name.split(".")
            if pieces[0] != "orchestrator" or len(pieces) < 2 or pieces[1] == source:
                continue
            target = pieces[1]
            if (PACKAGE / target).is_dir() or (PACKAGE / f"{target}.py").is_file():
                graph.setdefault(source, {}).setdefault(target, set()).add("/".join(parts))
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Every import that closes a circle: [a, b, ..., a] for each edge a -> b from which
    a can be reached back."""

    def path(start: str, goal: str) -> list[str] | None:
        seen, todo = {start}, [[start]]
        while todo:
            trail = todo.pop(0)
            for nxt in sorted(graph.get(trail[-1], {})):
                if nxt == goal:
                    return [*trail, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append([*trail, nxt])
        return None

    found = []
    for source in sorted(graph):
        for target in sorted(graph[source]):
            back = path(target, source)
            if back is not None:
                found.append([source, *back])
    return found


def test_no_package_imports_one_that_imports_it_back() -> None:
    graph = package_imports()
    described = [
        " -> ".join(circle) + f" (first: {sorted(graph[circle[0]][circle[1]])})"
        for circle in cycles(graph)
    ]
    assert described == []


def test_the_ssh_and_slurm_backends_import_neither_the_other() -> None:
    """What both use lives in reporting/; backends/ alone sees both."""
    assert offenders(files("ssh"), lambda n: n.startswith("orchestrator.slurm")) == {}
    assert offenders(files("slurm"), lambda n: n.startswith("orchestrator.ssh")) == {}


def test_the_cycle_check_finds_a_circle_through_several_packages() -> None:
    graph = {"a": {"b": {"a/x.py"}}, "b": {"c": {"b/y.py"}}, "c": {"a": {"c/z.py"}}, "d": {}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["b", "c", "a", "b"], ["c", "a", "b", "c"]]
    assert cycles({"a": {"b": {"a/x.py"}}, "b": {}}) == []
    assert {"ssh", "reporting"} <= set(package_imports()["backends"])


# The whole order, top to bottom: a part imports only parts on the layers below its own
# (never one beside it, never one above). A new package fails here until it is placed.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # typer and rich: parse, print, exit codes
    ("ui",),  # orch ui's page: a client of the api, as the CLI is (only `orch ui` starts it)
    ("api",),  # the same verbs for Python, and every other client
    ("backends",),  # the protocol, and the one place a backend is chosen
    ("ssh", "slurm", "bench"),  # the SSH backend and the Slurm backend; orch bench's job
    ("reporting", "onboard"),  # what both backends use; orch init
    ("sync",),  # the code push
    ("nodes",),  # agent commands over SSH, on many hosts at once
    ("records", "transport"),  # job records; SSH and local
    ("models",),  # pure: job, inventory, errors, states
    ("agent",),  # the host agent; the controller imports its kernel only (wire, states)
)


def test_every_part_of_the_package_has_its_place_in_the_layers() -> None:
    placed = [part for layer in LAYERS for part in layer]
    parts = {
        p.name.removesuffix(".py")
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"
    } - {"__init__", "__main__"}
    assert sorted(placed) == sorted(set(placed))
    assert sorted(parts - set(placed)) == [], "place the new part in LAYERS"
    assert sorted(set(placed) - parts) == [], "a part in LAYERS no longer exists"


def test_each_part_imports_only_the_layers_below_its_own() -> None:
    layer_of = {part: i for i, layer in enumerate(LAYERS) for part in layer}
    upward = [
        f"{source} -> {target} ({', '.join(sorted(where))})"
        for source, targets in package_imports().items()
        for target, where in targets.items()
        if layer_of.get(target, -1) <= layer_of.get(source, len(LAYERS))
    ]
    assert upward == []


def test_the_cli_and_the_api_reach_a_backend_only_through_the_protocol() -> None:
    def backend_code(name: str) -> bool:
        return name.split(".")[:2] in (["orchestrator", "ssh"], ["orchestrator", "slurm"])

    assert offenders(files("cli", "api"), backend_code) == {}


def test_the_cli_imports_nothing_of_the_package_but_the_api_and_itself() -> None:
    """One front door: every verb the CLI has, a notebook or a web page has through the
    same `api` calls, with the same typed results (errors and progress modes too)."""

    def behind_the_door(name: str) -> bool:
        if name == "orchestrator" or not name.startswith("orchestrator."):
            return False
        return not name.startswith(("orchestrator.api", "orchestrator.cli"))

    verbs = [p for p in files("cli") if p.name != "cmd_ui.py"]
    assert offenders(verbs, behind_the_door) == {}
    assert offenders([PACKAGE / "api" / "cluster.py"], behind_the_door)  # the check sees
    # `orch ui` starts the page's server, and only that: the page itself is a client of
    # the API as the CLI is (the next test).
    cmd_ui = offenders([PACKAGE / "cli" / "cmd_ui.py"], behind_the_door)
    assert cmd_ui == {"orchestrator/cli/cmd_ui.py": ["orchestrator.ui", "orchestrator.ui.Server"]}


def test_the_page_imports_nothing_of_the_package_but_the_api_and_itself() -> None:
    """orch ui's page is a client of the one front door, as the CLI is: every job, line,
    curve and host it shows comes through the `api` verbs the CLI calls."""

    def behind_the_door(name: str) -> bool:
        if name == "orchestrator" or not name.startswith("orchestrator."):
            return False
        return not name.startswith(("orchestrator.api", "orchestrator.ui"))

    assert offenders(files("ui"), behind_the_door) == {}
    assert offenders(files("ui"), lambda n: n.startswith("orchestrator.api"))  # the check sees
