"""The docs say what the code does: every relative link and `#anchor` in README.md,
CONTRIBUTING.md and docs/ resolves (GitHub's heading slugs); every key the job and
inventory loaders accept is in the reference page of each; every verb and option of
the `orch` app is in the CLI reference; every path of ARCHITECTURE's "Adding a
backend" is in the tree. The keys, verbs and options are read from the code itself
(the loaders' own "known keys" hint, the typer app's commands), never from a list
kept here."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

from orchestrator.models.errors import SpecError
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job

REPO = Path(__file__).resolve().parents[2]
DOCS_DIR = REPO / "docs"
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted(DOCS_DIR.glob("*.md"))]
UNKNOWN = "zzqxv"  # a key no schema knows, nor anything close to one

# ---------------------------------------------------------------- reading markdown

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")


def prose(text: str) -> str:
    """The text without its fenced code blocks (their lines left empty, so that line
    numbers stay)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as shown (code spans and links as
    their text), lowercased, punctuation dropped, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """Each heading outside code blocks: its level and its text."""
    found = []
    for line in prose(text).split("\n"):
        match = HEADING.match(line)
        if match:
            found.append((len(match.group(1)), match.group(2)))
    return found


def anchors(text: str) -> set[str]:
    """Every anchor of a page; a heading whose slug came before gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in headings(text):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def link_targets(text: str) -> list[str]:
    """Every link's target outside code (blocks and inline spans)."""
    return LINK.findall(INLINE_CODE.sub("", prose(text)))


def broken_links(page: Path) -> list[str]:
    """`page: target (why)` for each relative link that leads nowhere: a missing file,
    or an anchor that no heading of the target page makes."""
    problems = []
    for target in link_targets(page.read_text()):
        if SCHEME.match(target):
            continue  # http:, mailto: ... not this checkout's to check
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            problems.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            problems.append(f"{page.name}: {target} (no heading makes #{anchor})")
    return problems


def section(text: str, title: str) -> str:
    """The part of a page under the heading `title` (code spans as their text), up to
    the next heading of the same level or above; "" where there is none."""
    lines = text.split("\n")
    plain = prose(text).split("\n")
    for i, line in enumerate(plain):
        match = HEADING.match(line)
        if match and match.group(2).replace("`", "") == title:
            level = len(match.group(1))
            for j in range(i + 1, len(plain)):
                after = HEADING.match(plain[j])
                if after and len(after.group(1)) <= level:
                    return "\n".join(lines[i:j])
            return "\n".join(lines[i:])
    return ""


def documented(key: str, text: str) -> bool:
    """A key is documented where it is written as code (`key`, `key:`) or as a YAML
    key of an example."""
    return re.search(rf"`{re.escape(key)}[`:]|^\s*(?:- )?{re.escape(key)}:", text, re.M) is not None


# ---------------------------------------------------------------- links and anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_pages_are_there() -> None:
    names = {p.name for p in PAGES}
    wanted = {"README.md", "CONTRIBUTING.md", "ARCHITECTURE.md", "JOB.md", "INVENTORY.md"}
    assert wanted | {"CLI.md", "BENCHMARKS.md", "SCALE.md"} <= names


def test_a_broken_link_or_anchor_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Shared filesystems (an NFS home)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Adding a backend\n\n## Usage\n\n## Usage\n\n"
        "[fine](other.md) [fine](#adding-a-backend) [fine](#usage-1)\n"
        "[fine, over two\nlines](other.md#shared-filesystems-an-nfs-home) [web](https://x.org/y)\n"
        "[gone](missing.md) [gone](#nowhere) [gone](other.md#usage)\n"
        "`[in code](missing-too.md)`\n\n```\n[in a block](missing-three.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md: missing.md (no such file)",
        "page.md: #nowhere (no heading makes #nowhere)",
        "page.md: other.md#usage (no heading makes #usage)",
    ]


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Warm starts: a resubmit's ranks start without importing torch again",
         "warm-starts-a-resubmits-ranks-start-without-importing-torch-again"),
        ("`orch top`", "orch-top"),
        ("Slurm: orch against sbatch + tail -f by hand", "slurm-orch-against-sbatch--tail--f-by-hand"),
        ("Shared filesystems (an NFS home)", "shared-filesystems-an-nfs-home"),
        ("The [job file](JOB.md) and `max_restarts`", "the-job-file-and-max_restarts"),
    ],
)  # fmt: skip
def test_slugs_follow_githubs_rules(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_repeated_heading_gets_a_numbered_anchor() -> None:
    assert anchors("# A\n## Usage\n## Usage\n```\n## not a heading\n```\n") == {
        "a",
        "usage",
        "usage-1",
    }


# ---------------------------------------------------------------- job and inventory keys


def known_keys(error: SpecError) -> list[str]:
    """The keys a loader's "unknown key" error lists as known."""
    hint = error.hint
    assert hint.startswith("known keys: "), f"not an unknown-key hint: {error.message}: {hint}"
    return hint.removeprefix("known keys: ").split(", ")


def rejected(load: Callable[[Path], object], path: Path, text: str) -> SpecError:
    """The error of a file with one unknown key (UNKNOWN) where `text` puts it."""
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load(path)
    assert f"{UNKNOWN}: unknown key" in caught.value.message
    return caught.value


def job_keys(tmp_path: Path) -> dict[str, list[str]]:
    """Every key the job loader accepts, at the top and in each nested mapping."""
    (tmp_path / "train.py").write_text("")
    base = "script: train.py\n"
    job = tmp_path / "job.yaml"
    return {
        "": known_keys(rejected(load_job, job, f"{UNKNOWN}: 1\n")),
        "rendezvous": known_keys(rejected(load_job, job, f"{base}rendezvous: {{{UNKNOWN}: 1}}\n")),
        "outputs": known_keys(rejected(load_job, job, f"{base}outputs: {{{UNKNOWN}: 1}}\n")),
    }


def inventory_keys(tmp_path: Path) -> dict[str, list[str]]:
    """Every key the inventory loader accepts: at the top, of a host, of `defaults:`, and
    of each other section the top takes (a backend's, such as `slurm:`)."""
    path = tmp_path / "inventory.yaml"
    host = "hosts: [{name: a, address: localhost}]\n"
    top = known_keys(rejected(load_inventory, path, f"{host}{UNKNOWN}: 1\n"))
    found = {
        "": top,
        "hosts": known_keys(
            rejected(load_inventory, path, f"hosts: [{{name: a, address: b, {UNKNOWN}: 1}}]\n")
        ),
        "defaults": known_keys(
            rejected(load_inventory, path, f"{host}defaults: {{{UNKNOWN}: 1}}\n")
        ),
    }
    for name in set(top) - {"hosts", "defaults"}:
        found[name] = known_keys(rejected(load_inventory, path, f"{name}: {{{UNKNOWN}: 1}}\n"))
    return found


def test_every_job_key_is_in_the_job_reference(tmp_path: Path) -> None:
    page = (DOCS_DIR / "JOB.md").read_text()
    keys = job_keys(tmp_path)
    assert {"script", "nodes", "restarts", "warm_idle"} <= set(keys[""])  # the hint was read
    missing = [f"{where}.{k}".lstrip(".") for where, ks in keys.items() for k in ks]
    assert [k for k in missing if not documented(k.rpartition(".")[2], page)] == []


def test_every_inventory_key_is_in_the_inventory_reference(tmp_path: Path) -> None:
    page = (DOCS_DIR / "INVENTORY.md").read_text()
    keys = inventory_keys(tmp_path)
    assert {"name", "address", "gpus", "shared_fs"} <= set(keys["hosts"])
    assert "slurm" in keys and "login" in keys["slurm"]
    named = [f"{where}.{k}".lstrip(".") for where, ks in keys.items() for k in ks]
    assert [k for k in named if not documented(k.rpartition(".")[2], page)] == []


def test_an_undocumented_key_is_caught() -> None:
    page = "| `nodes` | 2 |\n```yaml\nname: digits\n  - address: x\n```\nnproc_per_node means"
    assert [k for k in ("nodes", "name", "address") if not documented(k, page)] == []
    assert not documented("nproc_per_node", page)  # prose, not code
    assert not documented("node", page)  # part of another key


# ---------------------------------------------------------------- the command line


def cli_commands() -> dict[str, list[str]]:
    """`orch VERB [SUB]` -> its options' names (long and short, --help left out), for
    the root, every verb and every sub-command, as the typer app registers them."""
    import typer.main
    from typer import _click as click  # typer's own click, as cli/app.py uses it
    from typer.core import TyperGroup

    from orchestrator.cli.app import app

    def walk(command: click.Command, path: str) -> Iterable[tuple[str, list[str]]]:
        names = [
            name
            for param in command.params
            if param.param_type_name == "option"
            for name in (*param.opts, *param.secondary_opts)
            if name != "--help"
        ]
        yield path, names
        if isinstance(command, TyperGroup):
            ctx = click.Context(command, info_name=path)
            for sub in command.list_commands(ctx):
                found = command.get_command(ctx, sub)
                assert found is not None, f"{path} {sub}"
                yield from walk(found, f"{path} {sub}")

    root = typer.main.get_command(app)
    # typer adds --install-completion and --show-completion to the root by itself
    return dict(walk(root, "orch"))


def test_every_verb_and_option_is_in_the_cli_reference() -> None:
    page = (DOCS_DIR / "CLI.md").read_text()
    commands = cli_commands()
    assert {"orch submit", "orch bench allreduce", "orch keys"} <= set(commands)
    assert "--detach" in commands["orch submit"]
    missing = {}
    for path, options in commands.items():
        part = section(page, path)
        groups = [p for p in commands if p.startswith(f"{path} ")]
        if not part and groups:  # a group: its sub-commands carry the sections
            continue
        lost = [o for o in options if not re.search(rf"`[^`]*{re.escape(o)}(?![\w-])", part)]
        if not part or lost:
            missing[path] = lost or ["(no section)"]
    assert missing == {}


def test_every_verb_the_cli_reference_names_exists() -> None:
    names = {t.replace("`", "") for _, t in headings((DOCS_DIR / "CLI.md").read_text())}
    assert sorted(n for n in names if n.startswith("orch") and n not in cli_commands()) == []


# ---------------------------------------------------------------- adding a backend

PATH_SPAN = re.compile(r"`([\w.<>-]+(?:/[\w.<>-]*)+|[\w<>-]+\.(?:py|md))`")


def backend_paths(page: str) -> list[str]:
    """The paths ARCHITECTURE's "Adding a backend" names, as code spans."""
    return PATH_SPAN.findall(section(page, "Adding a backend"))


def missing_paths(paths: Sequence[str], root: Path, backends: Sequence[str]) -> list[str]:
    """Each path that is not in the tree. A path with a placeholder (`<name>`, `<NAME>`)
    is the pattern a new backend follows: some backend of today must already fit it."""
    missing = []
    for path in paths:
        if "<" not in path:
            if not (root / path).exists():
                missing.append(path)
            continue
        fits = [path.replace("<name>", name).replace("<NAME>", name.upper()) for name in backends]
        if not any((root / p).exists() for p in fits):
            missing.append(path)
    return missing


def test_every_path_of_adding_a_backend_is_in_the_tree() -> None:
    from orchestrator.backends import BACKENDS

    paths = backend_paths((DOCS_DIR / "ARCHITECTURE.md").read_text())
    assert {"orchestrator/backends/__init__.py", "orchestrator/backends/<name>.py"} <= set(paths)
    assert "orchestrator/<name>/" in paths
    assert missing_paths(paths, REPO, list(BACKENDS)) == []


def test_a_path_that_left_the_tree_is_caught(tmp_path: Path) -> None:
    (tmp_path / "orchestrator" / "slurm").mkdir(parents=True)
    (tmp_path / "orchestrator" / "backends").mkdir()
    (tmp_path / "orchestrator" / "backends" / "slurm.py").write_text("")
    page = (
        "## Adding a backend\n\n- `orchestrator/<name>/` and `orchestrator/backends/<name>.py`\n"
        "- `orchestrator/backends/__init__.py`, `orchestrator/<name>/gone.py`, `BACKENDS`\n"
        "## After\n\n`orchestrator/elsewhere.py`\n"
    )
    paths = backend_paths(page)
    assert paths == [
        "orchestrator/<name>/",
        "orchestrator/backends/<name>.py",
        "orchestrator/backends/__init__.py",
        "orchestrator/<name>/gone.py",
    ]
    assert missing_paths(paths, tmp_path, ["ssh", "slurm"]) == [
        "orchestrator/backends/__init__.py",
        "orchestrator/<name>/gone.py",
    ]
