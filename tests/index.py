"""A package index of wheels made in the test, served on this machine's loopback: a
PEP 503 "simple" page per project (what `pip download` reads), in a thread. The test
hosts (network namespaces) cannot reach it; the controller can."""

from __future__ import annotations

import hashlib
import html
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Index:
    """A served index: its URL (`.../simple/`) and the paths asked of it."""

    url: str
    asked: list[str] = field(default_factory=list)


def write_simple(wheels: Path, root: Path) -> None:
    """The PEP 503 layout of the wheels in `wheels`, under `root`: root/simple/NAME/
    with one link per file (its sha256 in the fragment), root/files/ the wheels."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    projects: dict[str, list[Path]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        (root / "files" / wheel.name).write_bytes(wheel.read_bytes())
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects.setdefault(name, []).append(wheel)
    simple = root / "simple"
    simple.mkdir(exist_ok=True)
    rows = "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{rows}</body></html>\n")
    for name, files in projects.items():
        (simple / name).mkdir(exist_ok=True)
        links = "".join(
            f'<a href="../../files/{html.escape(f.name)}#sha256='
            f'{hashlib.sha256(f.read_bytes()).hexdigest()}">{html.escape(f.name)}</a>\n'
            for f in files
        )
        (simple / name / "index.html").write_text(
            f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"
        )


@contextmanager
def serve_index(wheels: Path, root: Path, userinfo: str = "") -> Iterator[Index]:
    """Serve the wheels of `wheels` as an index on 127.0.0.1 while the block runs.

    Args:
        root: where the index's pages are written.
        userinfo: `user:token` put in the URL (the server ignores it), as an index
            that needs a token has it.
    """
    write_simple(wheels, root)
    asked: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            asked.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    at = f"{userinfo}@" if userinfo else ""
    try:
        yield Index(f"http://{at}127.0.0.1:{server.server_address[1]}/simple/", asked)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
