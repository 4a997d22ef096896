"""Local job records: SQLite (stdlib) under $ORCH_HOME (default ~/.local/state/orch).

A record is written before any node starts, with every host's connection details,
job directory and rendezvous port, so that any later `orch` command (status, logs,
kill) can find the job on its hosts even if the controller that started it died.
Several `orch` processes may write at once: every write is one short transaction,
and SQLite's locking (WAL, a busy timeout) serialises them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.models.errors import InfraError, InputError
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState
from orchestrator.records.home import orch_home, private_dir

DB_NAME = "jobs.db"
BUSY_S = 30.0  # how long a command waits for another one's transaction


def _locked(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY (another connection holds the lock) or SQLITE_LOCKED (one of this
    connection's), whatever their extended codes."""
    return (exc.sqlite_errorcode & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _write_ahead(conn: sqlite3.Connection) -> None:
    """Put the store in WAL mode, once: the mode is kept in the file.

    Switching takes an exclusive lock that SQLite does not wait for when another
    connection is opening the same new file (two first `orch submit`s at once: one got
    'database is locked' at once), so a busy switch is tried again, up to BUSY_S. A
    filesystem without WAL leaves the mode as it was, without an error: kept so.
    """
    deadline = time.monotonic() + BUSY_S
    pause = 0.005
    while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _locked(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    exit_code INTEGER,
    master_addr TEXT NOT NULL,
    master_port INTEGER,
    spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    host TEXT NOT NULL,
    node_rank INTEGER NOT NULL,
    first_rank INTEGER NOT NULL,
    nproc INTEGER NOT NULL,
    job_dir TEXT NOT NULL,
    state TEXT NOT NULL,
    exit_code INTEGER,
    error TEXT,
    host_spec TEXT NOT NULL,
    PRIMARY KEY (job_id, host)
);
CREATE TABLE IF NOT EXISTS warm_hosts (
    host TEXT PRIMARY KEY,
    host_spec TEXT NOT NULL
);
"""

log = logging.getLogger(__name__)


def new_job_id(name: str) -> str:
    """A short id that reads well in prefixes and commands: `digits-3fa9c2`."""
    return f"{name}-{secrets.token_hex(3)}"


@dataclass
class NodeRecord:
    """One node of a recorded job."""

    host: Host
    node_rank: int
    first_rank: int
    nproc: int
    job_dir: str
    state: JobState = JobState.PENDING
    exit_code: int | None = None
    error: str | None = None
    # Seconds since its ranks last printed, on its host's clock, as the last look at the
    # host found it (`orch status`); not kept in the database.
    idle_s: float | None = field(default=None, compare=False)

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)


@dataclass
class RecordedAttempt:
    """An earlier attempt of a restarted job, as `JobDB.restart` kept it: its nodes'
    host, node_rank, job_dir, state, exit_code and error (rows of JSON)."""

    attempt: int
    nodes: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class SpecView:
    """A job record's spec, typed: what submit kept of the job (path, entry, args,
    workdir, outputs), where it runs (`backend`, and what that backend keeps of it:
    `own`) and its attempts. Read from the JSON the record holds; keys a
    newer orch added stay in `JobRecord.spec`, missing ones read as their default."""

    path: str | None = None
    entry: str | None = None
    args: tuple[str, ...] = ()
    workdir: str | None = None
    outputs: tuple[str, ...] = ()
    outputs_from: str | None = None
    metrics: tuple[str, ...] = ()  # the job file's `metrics:` patterns
    restarts: int = 0
    attempt: int = 0  # the current attempt (0: the first)
    attempts: tuple[RecordedAttempt, ...] = ()
    backend: str = "ssh"
    # What the job's backend keeps of it, in its own field of the spec (spec[backend]):
    # a detached SSH job's keeper (ssh/keep.py), a Slurm job's id and login node (slurm/).
    own: dict[str, Any] | None = None

    @classmethod
    def of(cls, spec: dict[str, Any]) -> SpecView:
        backend = str(spec.get("backend") or "ssh")
        own = spec.get(backend)
        return cls(
            path=spec.get("path"),
            entry=spec.get("entry"),
            args=tuple(spec.get("args") or ()),
            workdir=spec.get("workdir"),
            outputs=tuple(spec.get("outputs") or ()),
            outputs_from=spec.get("outputs_from"),
            metrics=tuple(str(m) for m in spec.get("metrics") or ()),
            restarts=int(spec.get("restarts") or 0),
            attempt=int(spec.get("attempt") or 0),
            attempts=tuple(
                RecordedAttempt(int(a["attempt"]), tuple(a["nodes"]))
                for a in spec.get("attempts", [])
            ),
            backend=backend,
            own=own if isinstance(own, dict) else None,
        )


@dataclass
class JobRecord:
    """A job as the controller remembers it; `spec` is JSON, `view` the same typed."""

    id: str
    name: str
    state: JobState
    master_addr: str
    master_port: int | None
    spec: dict[str, Any]
    nodes: list[NodeRecord] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None

    def node(self, host: str) -> NodeRecord:
        return next(n for n in self.nodes if n.host.name == host)

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.time()) - self.started

    @property
    def view(self) -> SpecView:
        return SpecView.of(self.spec)

    @property
    def backend(self) -> str:
        """Where the job runs: a key of backends.BACKENDS ("ssh": the nodes' records are
        its hosts; "slurm"); spec[backend] is that backend's own (`view.own`)."""
        return self.view.backend


def _node_rows(job: JobRecord) -> list[tuple[Any, ...]]:
    return [
        (
            job.id,
            n.host.name,
            n.node_rank,
            n.first_rank,
            n.nproc,
            n.job_dir,
            n.state.value,
            n.exit_code,
            n.error,
            host_to_json(n.host),
        )
        for n in job.nodes
    ]


def host_to_json(host: Host) -> str:
    """A host as node records (and a keeper's record of its hosts) store it."""
    return json.dumps(dataclasses.asdict(host))


def host_from_json(text: str) -> Host:
    """The host of a node record; fields a newer orch added are left out."""
    data = json.loads(text)
    known = {f.name for f in dataclasses.fields(Host)}
    data = {k: v for k, v in data.items() if k in known}
    data["gpus"] = tuple(data.get("gpus", ()))
    data["labels"] = tuple(data.get("labels", ()))
    return Host(**data)


class JobDB:
    """The job records of this controller."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or orch_home()
        self.path = self.home / DB_NAME

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        try:
            private_dir(self.home)
            conn = sqlite3.connect(self.path, timeout=BUSY_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise InfraError(
                f"cannot open the job store {self.path}: {exc}",
                "check the permissions of $ORCH_HOME, or point ORCH_HOME elsewhere",
            ) from None
        try:
            conn.row_factory = sqlite3.Row
            _write_ahead(conn)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.executescript(_SCHEMA)
            yield conn
        except sqlite3.OperationalError as exc:
            if not _locked(exc):
                raise self._unreadable(exc) from None
            raise InfraError(
                f"the job store {self.path} stayed locked for {BUSY_S:.0f} s: {exc}",
                "another orch command of yours holds it; run this again once it is done "
                f"(fuser {self.path} names it)",
            ) from None
        except sqlite3.DatabaseError as exc:
            raise self._unreadable(exc) from None
        finally:
            conn.close()

    def _unreadable(self, exc: sqlite3.DatabaseError) -> InfraError:
        return InfraError(
            f"the job store {self.path} is unreadable: {exc}",
            f"move it away (mv {self.path} {self.path}.bad); orch starts a new one, "
            "and jobs running on hosts keep running",
        )

    def add(self, job: JobRecord) -> None:
        """Record a new job and its nodes, in one transaction."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    job.id,
                    job.name,
                    job.state.value,
                    job.created,
                    job.started,
                    job.ended,
                    job.exit_code,
                    job.master_addr,
                    job.master_port,
                    json.dumps(job.spec),
                ),
            )
            db.executemany("INSERT INTO nodes VALUES (?,?,?,?,?,?,?,?,?,?)", _node_rows(job))
            db.execute("COMMIT")

    def restart(self, job: JobRecord) -> None:
        """Start the job's next attempt: its nodes now are `job.nodes` (their rows
        replace the last attempt's, which go into spec["attempts"]), and it is pending
        again with the new master."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT spec FROM jobs WHERE id=?", (job.id,)).fetchone()
            old = db.execute("SELECT * FROM nodes WHERE job_id=?", (job.id,)).fetchall()
            spec = json.loads(row["spec"]) if row else {}
            spec["attempts"] = [
                *spec.get("attempts", []),
                {
                    "attempt": spec.get("attempt", 0),
                    "nodes": [
                        {
                            k: n[k]
                            for k in ("host", "node_rank", "job_dir", "state", "exit_code", "error")
                        }
                        for n in old
                    ],
                },
            ]
            spec["attempt"] = job.spec.get("attempt", 0)
            db.execute("DELETE FROM nodes WHERE job_id=?", (job.id,))
            db.execute(
                "UPDATE jobs SET state=?, ended=NULL, exit_code=NULL, master_addr=?,"
                " master_port=?, spec=? WHERE id=?",
                (
                    JobState.PENDING.value,
                    job.master_addr,
                    job.master_port,
                    json.dumps(spec),
                    job.id,
                ),
            )
            db.executemany("INSERT INTO nodes VALUES (?,?,?,?,?,?,?,?,?,?)", _node_rows(job))
            db.execute("COMMIT")

    def update_spec(self, job_id: str, **changes: Any) -> None:
        """Merge `changes` into a job's spec (a Slurm job's id, once sbatch gave one)."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT spec FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is not None:
                spec = {**json.loads(row["spec"]), **changes}
                db.execute("UPDATE jobs SET spec=? WHERE id=?", (json.dumps(spec), job_id))
            db.execute("COMMIT")

    def update_node(
        self,
        job_id: str,
        host: str,
        state: JobState,
        exit_code: int | None = None,
        error: str | None = None,
    ) -> None:
        self.update_nodes(job_id, {host: (state, exit_code, error)})

    def update_nodes(
        self, job_id: str, changes: Mapping[str, tuple[JobState, int | None, str | None]]
    ) -> None:
        """Several nodes' state, exit code and error at once (by host), in one write."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "UPDATE nodes SET state=?, exit_code=?, error=? WHERE job_id=? AND host=?",
                [
                    (s.value, code, error, job_id, host)
                    for host, (s, code, error) in changes.items()
                ],
            )
            db.execute("COMMIT")

    def update_job(
        self, job_id: str, state: JobState, exit_code: int | None = None, ended: float | None = None
    ) -> None:
        """Move a job to a state; stamps started/ended the first time it gets there.

        Args:
            ended: when it ended, where known better than now (a reconciled job that
                ended while no controller watched).
        """
        now = time.time()
        with self._db() as db:
            db.execute(
                "UPDATE jobs SET state=?, exit_code=COALESCE(?, exit_code),"
                " started=CASE WHEN started IS NULL AND ? != 'pending' THEN ? ELSE started END,"
                " ended=CASE WHEN ended IS NULL AND ? THEN ? ELSE ended END WHERE id=?",
                (
                    state.value,
                    exit_code,
                    state.value,
                    now,
                    state.is_terminal(),
                    ended or now,
                    job_id,
                ),
            )

    def add_warm_hosts(self, hosts: Sequence[Host]) -> None:
        """Hosts that `orch warm JOB` left a warm interpreter on, outside any job's
        record: `orch kill --all` ends those too."""
        with self._db() as db:
            db.executemany(
                "INSERT OR REPLACE INTO warm_hosts (host, host_spec) VALUES (?, ?)",
                [(h.name, host_to_json(h)) for h in hosts],
            )

    def warm_hosts(self) -> list[Host]:
        with self._db() as db:
            rows = db.execute("SELECT host_spec FROM warm_hosts ORDER BY host").fetchall()
        return [host_from_json(row["host_spec"]) for row in rows]

    def forget_warm_hosts(self, names: Iterable[str]) -> None:
        with self._db() as db:
            db.executemany("DELETE FROM warm_hosts WHERE host = ?", [(n,) for n in names])

    def jobs(self) -> list[JobRecord]:
        """Every job, newest first."""
        with self._db() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY created DESC").fetchall()
            nodes = db.execute("SELECT * FROM nodes ORDER BY job_id, node_rank").fetchall()
        by_job: dict[str, list[sqlite3.Row]] = {}
        for n in nodes:
            by_job.setdefault(n["job_id"], []).append(n)
        return [_readable(r, by_job.get(r["id"], [])) for r in rows]

    def get(self, job_id: str) -> JobRecord:
        """One job, by its id or a unique prefix of it.

        Raises:
            InputError: no such job (exit 2), with the nearest ids as the hint.
        """
        with self._db() as db:
            ids = [r["id"] for r in db.execute("SELECT id FROM jobs ORDER BY created DESC")]
        matches = [i for i in ids if i == job_id] or [i for i in ids if i.startswith(job_id)]
        if len(matches) != 1:
            if len(matches) > 1:
                raise InputError(
                    f"job id '{job_id}' is ambiguous", "it could be: " + ", ".join(matches[:5])
                )
            close = difflib.get_close_matches(job_id, ids, n=3, cutoff=0.5)
            hint = ("did you mean: " + ", ".join(close)) if close else "list jobs with: orch status"
            raise InputError(f"unknown job id '{job_id}' (in {self.path})", hint)
        found = matches[0]
        with self._db() as db:
            row = db.execute("SELECT * FROM jobs WHERE id=?", (found,)).fetchone()
            nodes = db.execute(
                "SELECT * FROM nodes WHERE job_id=? ORDER BY node_rank", (found,)
            ).fetchall()
        return _readable(row, nodes)


def _readable(row: sqlite3.Row, nodes: list[sqlite3.Row]) -> JobRecord:
    """The record of a job row and its node rows; one that cannot be read (damaged,
    or written by a newer orch) comes back `unknown` with what could be read, so
    that the other jobs still show."""
    try:
        return _job_from_row(row, [_node_from_row(n) for n in nodes])
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        log.debug("unreadable job record %r: %s", row["id"], exc)
        return JobRecord(
            id=str(row["id"]),
            name=str(row["name"]) if isinstance(row["name"], str) else "?",
            state=JobState.UNKNOWN,
            master_addr="?",
            master_port=None,
            spec={},
            created=row["created"] if isinstance(row["created"], (int, float)) else 0.0,
        )


def _node_from_row(row: sqlite3.Row) -> NodeRecord:
    return NodeRecord(
        host=host_from_json(row["host_spec"]),
        node_rank=row["node_rank"],
        first_rank=row["first_rank"],
        nproc=row["nproc"],
        job_dir=row["job_dir"],
        state=JobState.parse(row["state"]),
        exit_code=row["exit_code"],
        error=row["error"],
    )


def _job_from_row(row: sqlite3.Row, nodes: list[NodeRecord]) -> JobRecord:
    return JobRecord(
        id=row["id"],
        name=row["name"],
        state=JobState.parse(row["state"]),
        master_addr=row["master_addr"],
        master_port=row["master_port"],
        spec=json.loads(row["spec"]),
        nodes=nodes,
        created=row["created"],
        started=row["started"],
        ended=row["ended"],
        exit_code=row["exit_code"],
    )
