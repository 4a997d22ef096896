"""The one exception hierarchy of orch.

Every error carries what failed and where (`message`), how to fix it (`hint`) and
the exit code the CLI maps it to. Nothing below the CLI prints or exits: it raises
one of these, and `cli.main` turns it into `error: ...` / `hint: ...` lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INFRA = 3
EXIT_INTERRUPTED = 130


class OrchError(Exception):
    """Base of every error orch reports to the user."""

    exit_code = EXIT_INFRA
    host: str | None = None  # the one host it happened on, when there is one

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.what = message  # the message without the host's name


class InputError(OrchError):
    """A job file, inventory file or argument is wrong (exit 2)."""

    exit_code = EXIT_BAD_INPUT


def place(path: str, line: int | None = None, column: int | None = None) -> str:
    """Where in a file, as errors name it: `job.yaml`, `job.yaml:7` or `job.yaml:7:3`."""
    if line is None:
        return path
    return f"{path}:{line}" + ("" if column is None else f":{column}")


class SpecError(InputError):
    """A YAML file does not match its schema; names file, line and key."""

    def __init__(
        self,
        path: str,
        message: str,
        hint: str = "",
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(f"{place(path, line, column)}: {message}", hint)
        self.path = path
        self.line = line
        self.column = column


class Unsupported(InputError):
    """What a backend cannot do (exit 2): a verb of the Backend protocol, or a job key,
    that it refuses, with the way around it. The protocol's one refusal: each backend
    raises it from its one list of what it lacks (slurm/unsupported.py), never from
    scattered checks, and before any host is contacted.

    Args:
        message: what is not supported, and on which backend.
        hint: the way around it.
        where: the job file's key (`job.yaml:7:1`), the inventory or the job
            (`job digits-3fa9c2`) that asked for it; the message starts with it.
    """

    def __init__(self, message: str, hint: str = "", where: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message, hint)
        self.where = where

    @classmethod
    def verb(cls, said: str, backend: str, why: str, hint: str, where: str = "") -> Unsupported:
        """The refusal of a verb: `orch gc is not for the slurm backend: <why>`.

        Args:
            said: the verb as the user names it (`orch gc`, `orch warm --stop`).
            backend: the backend's name (`Backend.name`).
            why: why this backend cannot do it.
            hint: the way around it.
            where: the inventory that chose the backend.
        """
        return cls(f"{said} is not for the {backend} backend: {why}", hint, where)


class InfraError(OrchError):
    """A host could not be used: unreachable, auth refused, python missing (exit 3)."""

    exit_code = EXIT_INFRA


class HostError(InfraError):
    """An infrastructure error on one named host."""

    host: str

    def __init__(self, host: str, message: str, hint: str = "") -> None:
        super().__init__(f"{message} (host {host})", hint)
        self.host = host
        self.what = message


class Refused(HostError):
    """The host's address answered, refusing the connection: its sshd is not there.
    Evidence from the host's side, where silence may be the controller's own network."""


class RemoteCommandError(HostError):
    """A command on a host exited non-zero; shows the command, code and stderr tail."""

    def __init__(
        self, host: str, command: str, exit_code: int, stderr: str, hint: str = ""
    ) -> None:
        tail = "\n".join(stderr.strip().splitlines()[-8:])
        message = f"command exited with {exit_code}: {command}"
        if tail:
            message += "\n" + tail
        super().__init__(host, message, hint)
        self.command = command
        self.remote_exit_code = exit_code
        self.stderr = stderr


class MultiHostError(InfraError):
    """Several hosts failed at once; keeps every host's error, none hidden."""

    def __init__(self, failed: Sequence[OrchError], succeeded: Sequence[str] = ()) -> None:
        self.failed = list(failed)
        self.succeeded = list(succeeded)
        first = self.failed[0]
        lines = [first.message] + [e.message for e in self.failed[1:]]
        super().__init__("\n".join(lines), first.hint)
        self.exit_code = max(e.exit_code for e in self.failed)


class JobFailed(OrchError):
    """The job ran and failed, or was killed (exit 1)."""

    exit_code = EXIT_JOB_FAILED


class Interrupted(OrchError):
    """The user pressed Ctrl-C (exit 130)."""

    exit_code = EXIT_INTERRUPTED


class HostChoiceError(InputError):
    """Hosts asked for by name, label or count that the inventory does not have;
    `key` is the job key that asked (hosts, labels, nodes)."""

    def __init__(self, key: str, message: str, hint: str) -> None:
        super().__init__(message, hint)
        self.key = key


class Finding(Protocol):
    """A problem as check reports it (ssh/check/rules.py Problem)."""

    @property
    def severity(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def hint(self) -> str: ...

    def lines(self) -> list[str]: ...


class PreflightError(InfraError):
    """Submit refuses to start: the blocking problems, each as check prints it (exit 3)."""

    def __init__(self, problems: Sequence[Finding]) -> None:
        self.problems = list(problems)
        # The CLI prints `error: <message>` and `hint: <hint>`: the first problems ride
        # in the message so that every one shows as its own error/hint pair.
        lines = [line for p in self.problems[:-1] for line in p.lines()]
        last = self.problems[-1]
        message = "\n".join([*lines, f"{last.severity}: {last.message}"])
        super().__init__(message.removeprefix("error: "), last.hint)


class HostOutcome(Protocol):
    """How a command ended on one host (nodes/execute.py HostRun)."""

    @property
    def host(self) -> str: ...

    @property
    def exit_code(self) -> int: ...

    @property
    def error(self) -> OrchError | None: ...

    @property
    def ok(self) -> bool: ...

    def describe(self) -> str: ...


class ExecFailed(OrchError):
    """The command failed on some hosts; exits with the worst host's exit code."""

    def __init__(self, runs: Sequence[HostOutcome]) -> None:
        failed = [r for r in runs if not r.ok]
        worked = [r.host for r in runs if r.ok]
        message = "command failed on " + ", ".join(r.describe() for r in failed)
        if worked:
            message += f"; succeeded on {', '.join(worked)}"
        hints = [r.error.hint for r in failed if r.error is not None and r.error.hint]
        super().__init__(message, hints[0] if hints else "each host's output is above")
        self.runs = list(runs)
        self.exit_code = max(r.exit_code for r in runs)
