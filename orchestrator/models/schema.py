"""Loading YAML with positions, and checking it against a small schema.

PyYAML forgets where a value came from once it is a dict. The loader here keeps the
line and column of every mapping key and value, so that an error can say
`jobs/x.yaml:5:8: nodes: expected an integer, got 'two'`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.models.errors import SpecError


class PosDict(dict[str, Any]):
    """A mapping that remembers the (line, column) of each key, 1-based, and the
    source text of each value: YAML 1.1 would read `1.10` as 1.1, `on` as True and
    `010` as 8, and args and env values must reach the script as they were written."""

    def __init__(self) -> None:
        super().__init__()
        self.positions: dict[str, tuple[int, int]] = {}
        self.start: tuple[int, int] = (1, 1)
        self.source: dict[str, Any] = {}


class _PosLoader(yaml.SafeLoader):
    """SafeLoader whose mappings are PosDicts and whose duplicate keys are errors."""


def _construct_mapping(loader: _PosLoader, node: yaml.MappingNode) -> PosDict:
    result = PosDict()
    result.start = (node.start_mark.line + 1, node.start_mark.column + 1)
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = (
            key_node.value
            if isinstance(key_node, yaml.ScalarNode)
            else str(loader.construct_object(key_node))
        )
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}'", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.positions[key] = (value_node.start_mark.line + 1, value_node.start_mark.column + 1)
        result.source[key] = _source_text(value_node)
    return result


def _source_text(node: yaml.Node) -> Any:
    """A node's scalars as written in the file (a list or dict of them for collections)."""
    if isinstance(node, yaml.ScalarNode):
        return node.value
    if isinstance(node, yaml.SequenceNode):
        return [_source_text(item) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        return {
            _source_text(k): _source_text(v)
            for k, v in node.value
            if isinstance(k, yaml.ScalarNode)
        }
    return None


_PosLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


MAX_FILE_BYTES = 1 << 20  # a job or inventory file is a few kB
MAX_NODES = 100_000  # values in a file once its aliases are expanded
MAX_FLOW_DEPTH = 64  # [ and { nested: PyYAML's scanner is quadratic in it


def _flow_depth(text: str) -> int:
    """How deep `[` and `{` nest, counted roughly: brackets inside quotes and comments
    count too, so the figure may be too high, never too low."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}" and depth:
            depth -= 1
    return deepest


def _expanded_size(node: yaml.Node) -> int:
    """How many nodes `node` stands for with every alias expanded, computed without
    expanding them (a few aliases of aliases stand for billions)."""
    sizes: dict[int, int] = {}
    order: list[yaml.Node] = []
    stack, seen = [node], set()
    while stack:  # children before parents, without recursion: nesting may be deep
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        order.append(current)
        if isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
        elif isinstance(current, yaml.MappingNode):
            stack.extend(n for pair in current.value for n in pair)
    for current in reversed(order):
        children: list[yaml.Node] = []
        if isinstance(current, yaml.SequenceNode):
            children = current.value
        elif isinstance(current, yaml.MappingNode):
            children = [n for pair in current.value for n in pair]
        sizes[id(current)] = min(1 + sum(sizes.get(id(c), 1) for c in children), MAX_NODES + 1)
    return sizes[id(node)]


def _read_limited(path: Path, kind: str) -> str:
    shown = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(
            shown, f"{kind} file not found", f"check the path of the {kind} file"
        ) from None
    except OSError as exc:  # a directory, no permission, a name too long, a symlink loop
        raise SpecError(shown, f"cannot read {kind} file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(
            shown,
            f"{kind} file is larger than {MAX_FILE_BYTES >> 20} MB",
            f"is it really a {kind} file?",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(shown, f"cannot read {kind} file: not UTF-8 text ({exc.reason})") from None


def load_yaml(path: Path, kind: str) -> PosDict:
    """Read a YAML file whose top level must be a mapping.

    Args:
        path: the file.
        kind: "job" or "inventory", for the messages.

    Returns:
        The top-level mapping, with positions.

    Raises:
        SpecError: missing file, syntax error (with line:column) or not a mapping.
    """
    shown = str(path)
    text = _read_limited(path, kind)
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        raise SpecError(shown, f"{kind} file is nested too deeply", "flatten it")
    try:
        loader = _PosLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None and _expanded_size(node) > MAX_NODES:
                raise SpecError(
                    shown,
                    f"{kind} file expands to over {MAX_NODES:,} values through its YAML aliases",
                    "write the values out, or use fewer aliases",
                )
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except RecursionError:
        raise SpecError(shown, f"{kind} file is nested too deeply", "flatten it") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise SpecError(
            shown, f"YAML syntax error: {problem}", "fix the YAML at that position", line, column
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(shown, f"YAML error: {exc}") from None
    if not isinstance(data, PosDict):
        raise SpecError(shown, f"a {kind} file must be a YAML mapping of keys to values", line=1)
    return data


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
