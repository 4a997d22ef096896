"""Opening the page in the user's browser without showing its token to the machine's
other users.

A browser is started with the address in its command line, and every user of the
machine can read every process's command line (`ps`, /proc/PID/cmdline). So the
browser is handed a file instead: owner-only, in an owner-only directory, holding a
link to the page (with its token) that it follows at once. Jupyter opens its page the
same way. The file is removed a minute later, or when `orch ui` ends.
"""

from __future__ import annotations

import atexit
import html
import os
import shutil
import sys
import tempfile
import threading
import webbrowser
from pathlib import Path

REMOVE_AFTER_S = 60.0


def has_display() -> bool:
    """Whether a browser window could show here: always on macOS and Windows; on
    Linux and the BSDs, where an X or Wayland display is set."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def launch_file(url: str, folder: Path) -> Path:
    """An owner-only page in `folder` that leads the browser to `url`."""
    target = html.escape(url, quote=True)
    page = (
        "<!doctype html><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='0;url={target}'>"
        f"<title>orch ui</title><a href='{target}'>orch ui</a>\n"
    )
    path = folder / "open.html"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(page)
    return path


def open_page(url: str) -> bool:
    """Ask the user's browser to open `url` through a launch file; False where there is
    no display or no browser."""
    if not has_display():
        return False
    try:
        browser = webbrowser.get()
    except webbrowser.Error:
        return False
    folder = Path(tempfile.mkdtemp(prefix="orch-ui-"))  # 0700
    path = launch_file(url, folder)

    def remove() -> None:
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
    timer = threading.Timer(REMOVE_AFTER_S, remove)
    timer.daemon = True
    timer.start()
    return bool(browser.open(path.as_uri()))
