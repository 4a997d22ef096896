"""The push receiver (agent sync) against hostile input: a decompression bomb, and any
frames hypothesis makes up. It answers with one JSON line, in bounded memory, and
never writes outside its store and the snapshot asked for."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.agent.kernel import framing
from orchestrator.agent.store import sync as receiver
from orchestrator.agent.store.content import ContentStore


def test_a_piece_that_inflates_beyond_its_object_is_refused_in_bounded_memory(
    tmp_path: Path,
) -> None:
    bomb = zlib.compress(b"\0" * (1300 << 20), 9)  # 1.3 GB of zeros in about 1.3 MB
    store = ContentStore(str(tmp_path / "store"))
    meta = {"k": hashlib.sha256(b"0123456789").hexdigest(), "off": 0, "size": 10, "z": 1}
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="larger than announced"):
            store.put_piece(meta, bomb, "t1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak >> 20} MB"
    assert not os.listdir(store.objects) if os.path.isdir(store.objects) else True


KEY = hashlib.sha256(b"hello").hexdigest()
frames = st.one_of(
    st.builds(
        lambda d: framing.json_frame(b"P", d),
        st.dictionaries(
            st.sampled_from(["k", "off", "size", "z"]),
            st.one_of(st.integers(-5, 1 << 40), st.sampled_from([KEY, "../x", KEY + ".x", ""])),
        ),
    ),
    st.builds(lambda b: framing.frame(b"B", b), st.binary(max_size=64)),
    st.builds(lambda b: framing.frame(b"B", zlib.compress(b)), st.binary(max_size=64)),
    st.builds(lambda b: framing.frame(b"M", zlib.compress(b)), st.binary(max_size=200)),
    st.builds(
        lambda e: framing.frame(b"M", zlib.compress(json.dumps({"entries": e}).encode())),
        st.lists(
            st.tuples(
                st.sampled_from(["a", "../up", "/abs", "d/f", "x"]),
                st.sampled_from("fxld"),
                st.sampled_from([KEY, "/etc", "..", ""]),
                st.integers(0, 10),
            ),
            max_size=4,
        ),
    ),
    st.builds(
        lambda d: framing.json_frame(b"S", d),
        st.fixed_dictionaries(
            {
                "digest": st.sampled_from([KEY, "0" * 64, "../x"]),
                "job_dir": st.sampled_from(["JOB", "JOB/../../out", "/etc"]),
                "nodes": st.lists(st.sampled_from(["n1", "..", "a/b", "code"]), max_size=2),
            }
        ),
    ),
    st.builds(lambda k: framing.frame(k, b"{}"), st.sampled_from([b"Q", b"H", b"Z"])),
    st.binary(max_size=20),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.lists(frames, max_size=8))
def test_any_frames_get_a_reply_and_write_nothing_outside(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    body: list[bytes],
) -> None:
    root = tmp_path / f"run{len(os.listdir(tmp_path))}"
    (root / "work").mkdir(parents=True)
    header = framing.json_frame(b"H", {"store": str(root / "work" / "store"), "push": "t1"})
    data = (header + b"".join(body)).replace(b"JOB", str(root / "work" / "jobs" / "j").encode())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    monkeypatch.setattr(receiver, "gc_due", lambda _store: False)
    code = receiver.main([])
    reply = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert isinstance(reply, dict) and code in (0, 1)
    outside = [p for p in root.rglob("*") if not p.is_relative_to(root / "work")]
    assert outside == []
    assert not Path("/etc/n1").exists()
