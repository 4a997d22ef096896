"""Checking a YAML file's mappings against a small schema, with positions.

PyYAML forgets where a value came from once it is a dict. The loader (yaml_file.py)
keeps the line and column of every mapping key and value (positions.py), so that an
error can say `jobs/x.yaml:5:8: nodes: expected an integer, got 'two'`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.models.errors import SpecError
from orchestrator.models.positions import PosDict


def load_yaml(path: Path, kind: str) -> PosDict:
    """Read a YAML file whose top level must be a mapping (yaml_file.py: PyYAML is
    imported only by the commands that read a file, 8 ms of every other's start).

    Args:
        path: the file.
        kind: "job" or "inventory", for the messages.

    Returns:
        The top-level mapping, with positions.

    Raises:
        SpecError: missing file, syntax error (with line:column) or not a mapping.
    """
    from orchestrator.models.yaml_file import load

    return load(path, kind)


@dataclass(frozen=True)
class Where:
    """A place in a YAML file, used to build SpecErrors."""

    path: str
    mapping: PosDict
    prefix: str = ""

    def error(self, key: str | None, message: str, hint: str = "") -> SpecError:
        """A SpecError at `key` of this mapping (or at the mapping itself)."""
        line, column = (
            self.mapping.positions.get(key, self.mapping.start) if key else self.mapping.start
        )
        label = (
            f"{self.prefix}{key}: "
            if key
            else (f"{self.prefix.rstrip('.')}: " if self.prefix else "")
        )
        return SpecError(self.path, f"{label}{message}", hint, line, column)

    def child(self, mapping: PosDict, prefix: str) -> Where:
        return Where(self.path, mapping, prefix)


def check_keys(where: Where, allowed: Mapping[str, object], required: tuple[str, ...] = ()) -> None:
    """Reject unknown keys (with a "did you mean") and report missing required ones."""
    for key in where.mapping:
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
            hint = (
                f"did you mean '{close[0]}'?"
                if close
                else "known keys: " + ", ".join(sorted(allowed))
            )
            raise where.error(key, "unknown key", hint)
    for key in required:
        if key not in where.mapping:
            raise where.error(None, f"missing required key '{key}'", f"add '{key}:' to the file")


def _type_name(value: object) -> str:
    if value is None:
        return "nothing"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        PosDict: "a mapping",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def get_str(where: Where, key: str, default: str | None = None) -> str | None:
    """A string value."""
    value = where.mapping.get(key, default)
    if value is None or isinstance(value, str):
        _check_text(where, key, value or "")
        return value
    raise where.error(
        key,
        f"expected a string, got {_type_name(value)} {value!r}",
        f'quote it: {key}: "{value}"' if not isinstance(value, (list, dict)) else "",
    )


def get_int(
    where: Where, key: str, default: int | None = None, minimum: int | None = None
) -> int | None:
    """An integer value, optionally with a lower bound."""
    value = where.mapping.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(
            key,
            f"expected an integer, got {_type_name(value)} {value!r}",
            f"write a whole number, e.g. {key}: {minimum if minimum is not None else 1}",
        )
    if minimum is not None and value < minimum:
        raise where.error(key, f"must be at least {minimum}, got {value}", f"use {minimum} or more")
    return value


def get_str_list(where: Where, key: str) -> tuple[str, ...]:
    """A list of strings; scalars inside are turned into their string form (args: [--lr, 0.1])."""
    value = where.mapping.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise where.error(
            key,
            f"expected a list, got {_type_name(value)} {value!r}",
            f'write a YAML list, e.g. {key}: ["{value}"]',
        )
    source = where.mapping.source.get(key) or []
    out = []
    for item, text in zip(value, source, strict=False):
        if isinstance(item, (list, dict)) or item is None:
            raise where.error(
                key,
                f"list items must be strings or numbers, got {_type_name(item)}",
                "quote each item",
            )
        out.append(text if isinstance(text, str) else _scalar_text(item))
    for text in out:
        _check_text(where, key, text)
    return tuple(out)


def get_env(where: Where, key: str) -> dict[str, str]:
    """An environment mapping NAME: value; values are turned into strings."""
    value = where.mapping.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise where.error(
            key,
            f"expected a mapping of NAME: value, got {_type_name(value)}",
            f"write it as {key}: {{NAME: value}}",
        )
    source = where.mapping.source.get(key) or {}
    env: dict[str, str] = {}
    for name, item in value.items():
        if (
            not name
            or not name.replace("_", "a").isalnum()
            or not name.isascii()
            or name[0].isdigit()
        ):
            raise where.error(
                key,
                f"'{name}' is not a valid environment variable name",
                "use letters, digits and '_', not starting with a digit",
            )
        if isinstance(item, (list, dict)) or item is None:
            raise where.error(
                key, f"value of {name} must be a string or number", f'quote it: {name}: "..."'
            )
        text = source.get(name)
        env[name] = text if isinstance(text, str) else _scalar_text(item)
        _check_text(where, key, env[name])
    return env


def _check_text(where: Where, key: str, text: str) -> None:
    """A NUL byte cannot pass through argv or the environment of any process."""
    if "\0" in text:
        raise where.error(
            key,
            "contains a NUL character, which no command line can carry",
            "remove the NUL character",
        )


def get_mapping(where: Where, key: str) -> PosDict | None:
    value = where.mapping.get(key)
    if value is None:
        return None
    if not isinstance(value, PosDict):
        raise where.error(
            key,
            f"expected a mapping, got {_type_name(value)} {value!r}",
            f"write it as {key}: {{name: value}}",
        )
    return value


def _scalar_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
