"""Reading a job or inventory YAML file, bounded, into PosDicts that keep positions.
`schema.load_yaml` imports it when a file is read: the commands that read none
(status, logs, kill) do not pay for importing PyYAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.models.errors import SpecError
from orchestrator.models.positions import PosDict


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


def load(path: Path, kind: str) -> PosDict:
    """`schema.load_yaml`: the file's top-level mapping, bounded in size, nesting and
    aliases, with positions; every failure a SpecError."""
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
