"""The agent's JSON (kernel/cjson.py) is json's, byte for byte, and json's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.kernel import cjson

REPO = Path(__file__).resolve().parents[2]

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(value=values)
@settings(max_examples=400)
def test_what_it_writes_and_reads_is_what_json_writes_and_reads(value: object) -> None:
    text = cjson.dumps(value)
    assert text == json.dumps(value)
    assert repr(cjson.loads(text)) == repr(json.loads(text))
    assert repr(cjson.loads(f" \n{text}\t ".encode())) == repr(json.loads(text))


@pytest.mark.parametrize("bad", ["", "[1", '{"a": }', "[1] x", "nul", "\ufeff[1]", "[1e400000]"])
def test_text_json_refuses_is_refused_with_jsons_own_error(bad: str) -> None:
    try:
        expected: object = json.loads(bad)
    except ValueError as exc:
        with pytest.raises(type(exc)) as raised:
            cjson.loads(bad)
        assert str(raised.value) == str(exc)
    else:
        assert repr(cjson.loads(bad)) == repr(expected)


def test_what_json_cannot_write_fails_as_in_json() -> None:
    circular: list[object] = []
    circular.append(circular)
    for value in (object(), {(1, 2): 1}, circular):
        with pytest.raises((TypeError, ValueError)) as ours:
            cjson.dumps(value)
        with pytest.raises(type(ours.value)) as theirs:
            json.dumps(value)
        assert str(ours.value) == str(theirs.value)
    assert cjson.dumps([1]) == "[1]", "a failure leaves nothing behind"


def test_an_agent_stack_command_imports_neither_json_nor_re_nor_threads(tmp_path: Path) -> None:
    """What each host's `orch stack` costs: re (with enum), json, subprocess and
    threading were 12 ms of it."""
    node = tmp_path / "node1"
    (node / "logs").mkdir(parents=True)
    (node / "node.json").write_text('{"argv": ["torchrun"], "env": {}}')
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from orchestrator.agent.node import stack; "
        "reply = stack.take(sys.argv[2], stack.StackRequest(taken='t')); "
        "assert reply.saved, reply; "
        "heavy = {'json', 're', 'enum', 'subprocess', 'hashlib', 'threading', 'signal'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(REPO), str(node)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "argv",
    [["status", "{node}"], ["follow", "{node}", '{{"stdout": 0}}', "--once"], ["kill", "{node}"]],
    ids=["status", "follow", "kill"],
)
def test_the_agents_most_frequent_commands_import_neither_json_nor_re_nor_typing(
    tmp_path: Path, argv: list[str]
) -> None:
    """Every attached job's hosts run these again and again (docs/BENCHMARKS.md, "Host
    command start"): `json` (with `re` and `enum`) and `typing` were 10 ms of each.
    (`kill` has `enum` through `signal`, which it needs.)"""
    node = tmp_path / "node1"
    (node / "logs").mkdir(parents=True)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from orchestrator.agent import main; "
        "main.main(sys.argv[2:]); "
        "heavy = {'json', 're', 'typing', 'subprocess'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    args = [a.format(node=node) for a in argv]
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
