"""`loads` and `dumps` as `json.loads(text)` and `json.dumps(obj)` give them, through
CPython's C accelerator `_json`, which the `json` module itself uses for both.

Not `json` itself on the paths every host command takes: importing it compiles its
pure-Python fallback's regular expressions, which imports `re` and with it `enum`:
5 ms of each command's CPU on this project's hosts (python -I -S, perf stat), about
a quarter of what an `orch stack` agent command costs a host beyond py-spy.

1. Valid input gives what `json` gives, byte for byte (unit tests compare the two).
2. Anything else goes to `json` after all: invalid text raises its JSONDecodeError,
   an object it cannot encode its TypeError, exactly as before.
3. An interpreter without `_json`, or with another one, uses `json` throughout.
"""

from __future__ import annotations

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # another interpreter
    _json = None  # type: ignore[assignment]

_WHITESPACE = " \t\n\r"  # what json skips around a document
_NAN, _INF = float("nan"), float("inf")


class _Context:
    """What `_json.make_scanner` reads of a decoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"-Infinity": -_INF, "Infinity": _INF, "NaN": _NAN}[name]


def _not_serializable(obj: object) -> object:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


_scan: Any
try:
    _scan = _json.make_scanner(_Context()) if _json is not None else None  # type: ignore[arg-type]
except (TypeError, AttributeError):  # a `_json` of another shape
    _scan = None
_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")


def _utf8(data: bytes | bytearray) -> str | bytes | bytearray:
    """UTF-8 bytes as json reads them; other encodings (a BOM, the NULs of UTF-16 or
    32) and undecodable bytes as they are, for json to read itself."""
    if data.startswith(_BOMS) or b"\x00" in data[:4]:
        return data
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data


def loads(text: str | bytes | bytearray) -> Any:
    """`json.loads(text)`."""
    if isinstance(text, (bytes, bytearray)):
        text = _utf8(text)
    if _scan is not None and isinstance(text, str):
        start = len(text) - len(text.lstrip(_WHITESPACE))
        try:
            obj, end = _scan(text, start)
        except (StopIteration, ValueError, RecursionError):
            pass  # json raises its own error for it
        else:
            if not text[end:].strip(_WHITESPACE):
                return obj
    import json

    return json.loads(text)


def dumps(obj: object) -> str:
    """`json.dumps(obj)`."""
    if _json is not None and not isinstance(obj, str):
        try:
            # json.dumps's defaults: fresh circular-reference markers, ensure_ascii,
            # allow_nan, ", " and ": ", no sorting, no skipping.
            encode = _json.make_encoder(
                {},
                _not_serializable,
                _json.encode_basestring_ascii,
                None,
                ": ",
                ", ",
                False,
                False,
                True,
            )
            return "".join(encode(obj, 0))
        except (TypeError, ValueError, RecursionError, AttributeError):
            pass  # json raises its own error for it (or this `_json` is of another shape)
    import json

    return json.dumps(obj)
