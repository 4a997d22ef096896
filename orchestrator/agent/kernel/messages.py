"""The framework of what the controller and the host agent say to each other: a
message class names its fields once, one side builds it, the other parses it.

**Commands** run as `python -I -S -c LOADER N VERSION AGENT_ROOT COMMAND ARGS...`
(`nodes/agent.py`): the agent's archive comes first on stdin, then the command's own
input. A command answers with one JSON object on the last line of its stdout
(`last_json`); the controller parses it into one of the reply classes (replies.py,
`parse_message`): fields a newer agent adds are ignored, a missing one is an error
that names the host.
"""

from __future__ import annotations

from . import cjson

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform

    M = TypeVar("M", bound="Message")
else:

    def dataclass_transform(**_: object) -> object:
        """The checker's alone: at run time a message class stays as written."""
        return lambda cls: cls


def last_json(stdout: str) -> dict[str, Any] | None:
    """The JSON object a command printed last, or None."""
    try:
        data = cjson.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return data if isinstance(data, dict) else None


class MessageError(ValueError):
    """A message lacks a field this side needs, or a field has the wrong type (an older,
    newer or broken peer)."""


_MESSAGES: dict[str, type[Message]] = {}  # every message class, by name
_FIELDS: dict[type[Message], dict[str, str]] = {}
_CHECKS: dict[type[Message], dict[str, Any]] = {}  # per class: field -> check(value)


@dataclass_transform(kw_only_default=True)
class Message:
    """A message of the wire, built on one side (`as_dict`) and parsed on the other
    (`parse_message`). A subclass's annotated names are its fields; those with a
    class-level default may be missing. Each field's annotation (a string: this module
    uses postponed annotations) is checked against the value at the boundary; another
    message's class name in an annotation parses that field as that message. (Not a
    dataclass and no `typing.get_type_hints`: importing dataclasses costs every host
    command 6 ms; the checks are compiled from the strings once per class, on first
    parse.)

    To the type checker every subclass is a dataclass whose fields are keywords
    (`dataclass_transform`): the code that builds a message is checked, a misspelt or
    missing field, or a value of the wrong type, is an error there. At run time the
    constructor takes what it is given, as it always did (the agent builds some
    replies from its own records, `**record`, whose extra keys `as_dict` leaves out);
    the parser is the run-time check."""

    def __init__(self, **values: Any) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _MESSAGES[cls.__name__] = cls

    @classmethod
    def fields(cls) -> dict[str, str]:
        """Every field's name and annotation, the base classes' first."""
        found = _FIELDS.get(cls)
        if found is None:
            found = {}
            for klass in reversed(cls.__mro__):  # a class's own: 3.8 inherits them
                found.update(klass.__dict__.get("__annotations__", {}))  # noqa: RUF063 (3.8)
            _FIELDS[cls] = found
        return found

    def as_dict(self) -> dict[str, Any]:
        """The message as JSON data: the fields it was given (the others' defaults are
        the reader's), a message inside as its own dict."""
        given = vars(self)
        return {name: _plain(given[name]) for name in self.fields() if name in given}

    def to_json(self) -> str:
        return cjson.dumps(self.as_dict())

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n, None)!r}" for n in self.fields())
        return f"{type(self).__name__}({fields})"


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return value.as_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def parse_message(cls: type[M], data: dict[str, Any], host: str | None = None) -> M:
    """`data` as a message of `cls`: unknown keys ignored (a newer peer may send more),
    missing required ones and values of the wrong type refused. A field that names
    another message class is parsed as one.

    Raises:
        MessageError: a field without a default is missing, or a value has the wrong
            type; says which message, field and (when given) host.
    """
    checks = _CHECKS.get(cls)
    if checks is None:
        checks = _CHECKS[cls] = {n: _compile(a) for n, a in cls.fields().items()}
    values: dict[str, Any] = {}
    where = f" from {host}" if host else ""
    if not isinstance(data, dict):
        raise MessageError(f"{cls.__name__}{where} is {type(data).__name__}, not an object")
    for name, check in checks.items():
        if name in data:
            try:
                values[name] = check(data[name])
            except _Wrong as wrong:
                raise MessageError(
                    f"{cls.__name__}.{name}{where} is {wrong.args[0]}, not {cls.fields()[name]}"
                ) from None
            except MessageError as inner:
                raise MessageError(f"{cls.__name__}.{name}{where}: {inner}") from None
        elif not hasattr(cls, name):
            raise MessageError(f"{cls.__name__}{where} lacks '{name}'")
    return cls(**values)


class _Wrong(Exception):
    """A value does not fit its annotation (args: what it is)."""


def _split(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside brackets."""
    parts: list[str] = []
    depth, current = 0, ""
    for char in text:
        depth += (char == "[") - (char == "]")
        if char == sep and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def _what(value: Any) -> str:
    return "null" if value is None else type(value).__name__


_SCALARS: dict[str, Any] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "None": lambda v: v is None,
}


def _compile(annotation: str) -> Any:
    """A check of a value against an annotation string: returns the value (a message
    class's dict parsed as that class), raises _Wrong. Knows None, bool, int, float,
    str, Any, X | Y, Optional[X], Sequence[X] / list[X] / tuple[X, ...] (a JSON
    array), dict[str, X] / Mapping[str, X] (a JSON object), Literal strings, and
    the message classes by name."""
    options = _split(annotation, "|")
    if len(options) > 1:
        checks = [_compile(o) for o in options]

        def either(value: Any) -> Any:
            for check in checks:
                try:
                    return check(value)
                except _Wrong:
                    continue
            raise _Wrong(_what(value))

        return either
    text = options[0]
    if text == "Any":
        return lambda value: value
    head, _, rest = text.partition("[")
    inner = rest[:-1] if rest.endswith("]") else ""
    if head == "Optional":
        return _compile(f"{inner} | None")
    if head == "Literal":
        allowed = [cjson.loads(a.replace("'", '"')) for a in _split(inner, ",")]

        def literal(value: Any) -> Any:
            if value in allowed and isinstance(value, str):
                return value
            raise _Wrong(repr(value) if isinstance(value, str) else _what(value))

        return literal
    if head in ("Sequence", "list", "List", "tuple", "Tuple"):
        item = _compile(_split(inner, ",")[0] if inner else "Any")

        def array(value: Any) -> Any:
            if not isinstance(value, (list, tuple)):
                raise _Wrong(_what(value))
            try:
                return [item(v) for v in value]
            except _Wrong as wrong:
                raise _Wrong(f"a list holding {wrong.args[0]}") from None

        return array
    if head in ("dict", "Dict", "Mapping"):
        each = _compile(_split(inner, ",")[1] if inner else "Any")

        def mapping(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Wrong(_what(value))
            try:
                return {k: each(v) for k, v in value.items()}
            except _Wrong as wrong:
                raise _Wrong(f"an object holding {wrong.args[0]}") from None

        return mapping
    if text in _SCALARS:
        fits = _SCALARS[text]

        def scalar(value: Any) -> Any:
            if not fits(value):
                raise _Wrong(_what(value))
            return value

        return scalar
    if text in _MESSAGES:
        kind = _MESSAGES[text]

        def message(value: Any) -> Any:
            if isinstance(value, kind):
                return value
            if not isinstance(value, dict):
                raise _Wrong(_what(value))
            return parse_message(kind, value)

        return message
    raise TypeError(f"the wire cannot check the annotation {annotation!r}")
