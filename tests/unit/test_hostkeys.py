"""Host keys as OpenSSH checks them (transport/hostkeys.py), with OpenSSH as the oracle:
`ssh-keygen -F` for host matching and hashed names, `ssh-keygen -s` for certificates,
`ssh -G` for what ~/.ssh/config says."""

from __future__ import annotations

import base64
import contextlib
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.transport.certificates import Certificate
from orchestrator.transport.hostkeys import (
    KeyPolicy,
    Offered,
    Untrusted,
    hashed_name,
    judge,
    parse_line,
    pattern_matches,
    read_known_hosts,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPJqHLGYBRPu8Aor7oC6jvzAOceZ3WBQ02jihYs5thVI"


def keygen(tmp: Path, name: str, *extra: str) -> Path:
    path = tmp / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path), *extra], check=True
    )
    return path


def blob_of(pub: Path) -> bytes:
    return base64.b64decode(pub.read_text().split()[1])


def ssh_keygen_finds(known_hosts: Path, name: str) -> bool:
    found = subprocess.run(
        ["ssh-keygen", "-F", name, "-f", str(known_hosts)], capture_output=True, text=True
    )
    return found.returncode == 0 and "found" in found.stdout


hostnames = st.text(alphabet="abn1.-", min_size=1, max_size=6)
patterns = st.lists(
    st.tuples(st.booleans(), st.text(alphabet="abn1.-*?", min_size=1, max_size=6)),
    min_size=1,
    max_size=3,
).map(lambda ps: ",".join(("!" if neg else "") + p for neg, p in ps))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pattern=patterns, name=hostnames, port=st.sampled_from([22, 2222]))
def test_host_patterns_match_exactly_what_ssh_keygen_finds(
    tmp_path: Path, pattern: str, name: str, port: int
) -> None:
    host = name if port == 22 else f"[{name}]:{port}"
    known = tmp_path / "known_hosts"
    known.write_text(f"{pattern} {KEY}\n")
    assert pattern_matches(pattern, host) == ssh_keygen_finds(known, host)


def test_hashed_names_match_what_ssh_keygen_hashed(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"node1.lab {KEY}\n[10.0.0.5]:2222 {KEY}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    hashed = read_known_hosts([known])
    assert all(e.patterns.startswith("|1|") for e in hashed)
    assert [e.names("node1.lab") for e in hashed] == [True, False]
    assert [e.names("[10.0.0.5]:2222") for e in hashed] == [False, True]
    assert not any(e.names("node1") or e.names("10.0.0.5") for e in hashed)
    ours = tmp_path / "ours"
    ours.write_text(f"{hashed_name('[10.0.0.5]:2222')} {KEY}\n")
    assert ssh_keygen_finds(ours, "[10.0.0.5]:2222") and not ssh_keygen_finds(ours, "10.0.0.5")


def test_lines_with_markers_comments_and_garbage(tmp_path: Path) -> None:
    assert parse_line("# a comment", "f:1", tmp_path) is None
    assert parse_line("node1 ssh-ed25519", "f:1", tmp_path) is None
    assert parse_line("node1 ssh-ed25519 not*base64", "f:1", tmp_path) is None
    ca = parse_line(f"@cert-authority *.lab {KEY} comment", "f:3", tmp_path)
    assert ca is not None and ca.marker == "@cert-authority" and ca.names("n1.lab")
    assert not ca.names("n1.lab.evil")


@pytest.fixture(scope="module")
def ca_and_host(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("certs")
    return keygen(tmp, "ca"), keygen(tmp, "host")


def certify(ca: Path, host: Path, *options: str) -> Certificate:
    """A certificate for `host`'s key, made by ssh-keygen -s with `options`."""
    cert = host.parent / f"{host.name}-cert.pub"
    cert.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(ca), "-I", "test", *options, str(host.with_suffix(".pub"))],
        check=True,
    )
    return Certificate.parse(blob_of(cert))


def test_a_host_certificate_vouches_for_its_principals_while_valid(
    ca_and_host: tuple[Path, Path],
) -> None:
    ca, host = ca_and_host
    cert = certify(ca, host, "-h", "-n", "10.0.0.5,node1", "-V", "-5m:+1h")
    now = time.time()
    assert cert.plain == blob_of(host.with_suffix(".pub"))
    assert cert.signature_key == blob_of(ca.with_suffix(".pub"))
    assert cert.problem("node1", now) is None and cert.problem("10.0.0.5", now) is None
    assert cert.problem("node2", now) == "its certificate is for 10.0.0.5, node1, not node2"
    assert cert.problem("node1", now + 7200) == "its certificate has expired"
    assert cert.problem("node1", now - 3600) == "its certificate is not valid yet"


def test_a_user_certificate_or_a_bad_signature_vouches_for_nothing(
    ca_and_host: tuple[Path, Path],
) -> None:
    ca, host = ca_and_host
    user_cert = certify(ca, host, "-n", "node1")
    assert user_cert.problem("node1", time.time()) == "its certificate is not a host certificate"
    certify(ca, host, "-h", "-n", "node1")
    forged = Certificate.parse(blob_of(host.parent / "host-cert.pub").replace(b"node1", b"node2"))
    assert forged.problem("node2", time.time()) == "its certificate's signature does not verify"


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_bytes_parse_as_a_certificate_or_raise_value_error(
    ca_and_host: tuple[Path, Path], data: st.DataObject
) -> None:
    ca, host = ca_and_host
    cert_file = host.parent / "host-cert.pub"
    if not cert_file.exists():
        certify(ca, host, "-h", "-n", "node1")
    real = blob_of(cert_file)
    cut = data.draw(st.integers(0, len(real)))
    blob = data.draw(
        st.one_of(st.binary(max_size=400), st.just(real[:cut] + data.draw(st.binary(max_size=8))))
    )
    with contextlib.suppress(ValueError):
        Certificate.parse(blob)


def entries(tmp_path: Path, text: str) -> list:  # type: ignore[type-arg]
    path = tmp_path / "known_hosts"
    path.write_text(text)
    return read_known_hosts([path])


def test_trust_on_first_use_only_when_no_entry_of_any_kind_names_the_host(
    tmp_path: Path, ca_and_host: tuple[Path, Path]
) -> None:
    ca, host = ca_and_host
    ca_line = f"@cert-authority node* {ca.with_suffix('.pub').read_text().strip()}\n"
    plain = Offered(blob_of(host.with_suffix(".pub")))
    now = time.time()
    assert judge(entries(tmp_path, ""), "node1", "node1", plain, now).status == "unknown"
    assert judge(entries(tmp_path, ca_line), "other", "other", plain, now).status == "unknown"
    verdict = judge(entries(tmp_path, ca_line), "node1", "node1", plain, now)
    assert (verdict.status, verdict.problem) == (
        "mismatch",
        "it offered a plain key, no certificate",
    )
    ecdsa = f"node1 ecdsa-sha2-nistp256 {base64.b64encode(b'x').decode()}\n"
    verdict = judge(entries(tmp_path, ecdsa), "node1", "node1", plain, now)
    assert verdict.status == "mismatch" and "known_hosts has ecdsa-sha2-nistp256" in verdict.problem


def test_a_revoked_key_or_ca_is_refused_before_anything_trusts_it(
    tmp_path: Path, ca_and_host: tuple[Path, Path]
) -> None:
    ca, host = ca_and_host
    cert = certify(ca, host, "-h", "-n", "node1")
    offered = Offered(cert.plain, blob_of(host.parent / "host-cert.pub"))
    ca_pub, host_pub = (p.with_suffix(".pub").read_text().strip() for p in (ca, host))
    trusted = f"@cert-authority * {ca_pub}\nnode1 {host_pub}\n"
    assert (
        judge(entries(tmp_path, trusted), "node1", "node1", offered, time.time()).status
        == "trusted"
    )
    for revoked in (ca_pub, host_pub):
        verdict = judge(
            entries(tmp_path, trusted + f"@revoked * {revoked}\n"),
            "node1",
            "node1",
            offered,
            time.time(),
        )
        assert verdict.status == "revoked"


def test_settings_come_from_ssh_config_as_ssh_resolves_them(tmp_path: Path) -> None:
    import paramiko

    config = tmp_path / "config"
    config.write_text(
        "Host strict\n  StrictHostKeyChecking yes\n  UserKnownHostsFile ~/a /tmp/b\n"
        "Host *\n  GlobalKnownHostsFile /etc/g1\n  HashKnownHosts yes\n"
    )
    resolved = subprocess.run(
        ["ssh", "-G", "-F", str(config), "strict"], capture_output=True, text=True, check=True
    ).stdout
    by_ssh = dict(line.split(" ", 1) for line in resolved.splitlines())
    lookup = paramiko.SSHConfig.from_path(str(config)).lookup("strict")
    policy = KeyPolicy.of(lookup)
    assert policy.strict == "yes" and by_ssh["stricthostkeychecking"] == "true"
    assert [str(p) for p in policy.user_files] == [
        str(Path(p).expanduser()) for p in by_ssh["userknownhostsfile"].split()
    ]
    assert (
        [str(p) for p in policy.global_files]
        == by_ssh["globalknownhostsfile"].split()
        == ["/etc/g1"]
    )
    assert policy.hash_new and by_ssh["hashknownhosts"] == "yes"
    defaults = KeyPolicy.of({}, override=tmp_path / "kh")
    assert defaults.strict == "accept-new" and defaults.user_files == (tmp_path / "kh",)


def test_a_new_key_is_recorded_owner_only_where_ssh_finds_it(tmp_path: Path) -> None:
    known = tmp_path / "dir" / "known_hosts"
    notices: list[str] = []
    policy = KeyPolicy.of({"hashknownhosts": "yes"}, override=known)
    policy.decide(
        "[10.0.0.5]:2222", "10.0.0.5", Offered(base64.b64decode(KEY.split()[1])), notices.append
    )
    assert known.stat().st_mode & 0o777 == 0o600 and known.parent.stat().st_mode & 0o777 == 0o700
    assert ssh_keygen_finds(known, "[10.0.0.5]:2222") and "10.0.0.5" not in known.read_text()
    assert notices and notices[0].startswith(
        "added host key for [10.0.0.5]:2222 (ssh-ed25519 SHA256:"
    )
    strict = KeyPolicy.of({"stricthostkeychecking": "yes"}, override=tmp_path / "other")
    with pytest.raises(Untrusted, match="not known and StrictHostKeyChecking is yes"):
        strict.decide("node9", "node9", Offered(base64.b64decode(KEY.split()[1])), notices.append)
    assert not (tmp_path / "other").exists()


def test_algorithms_known_for_the_host_are_asked_for_first(tmp_path: Path) -> None:
    offered = ["ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256"]
    certs = ["ssh-ed25519-cert-v01@openssh.com", "rsa-sha2-512-cert-v01@openssh.com"]
    known = tmp_path / "kh"
    known.write_text(
        f"node1 ssh-rsa {base64.b64encode(b'k').decode()}\n@cert-authority lab* {KEY}\n"
    )
    policy = KeyPolicy.of({}, override=known)
    assert policy.key_types("node1", offered + certs) == [
        "rsa-sha2-512",
        "rsa-sha2-256",
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
    ]
    assert policy.key_types("lab3", offered + certs)[:2] == certs
    assert policy.key_types("new", offered + certs) == offered, "no certificates asked of strangers"
