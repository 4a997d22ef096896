"""Building /bin/sh command lines for hosts, with every value quoted."""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def sh_path(path: str) -> str:
    """Quote a path for sh, letting a leading `~` mean the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def sh_join(words: Iterable[str]) -> str:
    """Quote every word; nothing in them is ever interpreted by the shell."""
    return shlex.join(list(words))
