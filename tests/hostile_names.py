"""File names that break tools which pass names through a shell or assume UTF-8.

Shared by the sync tests, unit and integration: each must arrive byte-exact.
"""

import os

HOSTILE_NAMES = [
    "with space.py",
    "it's.py",
    'say "hi".txt',
    "new\nline.txt",
    "-leading-dash.py",
    "--help",
    "naïve-データ.py",
    "$(touch pwned).txt",
    "`id`.txt",
    "back\\slash",
    "star*.txt",
    "dir with space/inner 'q'.py",
    os.fsdecode(b"not-utf8-\xff.bin"),
]


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # the not-UTF-8 name: bytes kept as surrogates
        return False
    return True


# The names that are also valid text (for tests that write a name into a file's content).
TEXT_NAMES = [name for name in HOSTILE_NAMES if _is_text(name)]
