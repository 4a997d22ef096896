"""What orch does on a Slurm cluster's login node, over its one SSH connection:
sbatch, squeue (else sacct, else the batch script's exit record), scancel, sinfo, and
the job's files on the shared home. Every value is quoted; the job's env travels on
stdin into a 0600 file, never in an argv."""

from __future__ import annotations

import json
import logging
import shlex
import time

from orchestrator.agent.kernel.slurm import node_dir_name
from orchestrator.agent.kernel.slurm_chain import attempt_dir
from orchestrator.models.errors import HostError, InputError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.nodes.shell import sh_path
from orchestrator.slurm import queue
from orchestrator.slurm.queue import Partition, QueuedJob
from orchestrator.transport import CommandResult, Transport

log = logging.getLogger(__name__)
TOOLS = ("sbatch", "srun", "squeue", "scancel", "sinfo")
COMMAND_TIMEOUT_S = 60.0
_SURVEY_MARK = "--- orch: sinfo ---"  # between the missing tools and sinfo's lines
_WRITE_FAILED = 97  # the files were not written, and sbatch did not run
GONE_TIMEOUT_S = 120.0  # scancel to the allocation gone: Slurm's KillWait is 30 s by default

# Writes the files given as JSON on stdin ({path: [text, mode]}), making directories.
_WRITE = (
    "import json, os, sys\n"
    "for path, (text, mode) in json.load(sys.stdin).items():\n"
    "    path = os.path.expanduser(path)\n"
    "    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)\n"
    "    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)\n"
    "    with os.fdopen(fd, 'w') as f:\n"
    "        f.write(text)\n"
    "    os.chmod(path, mode)\n"
)


class LoginNode:
    """The login node of a Slurm cluster, through a connected transport."""

    def __init__(self, host: Host, transport: Transport) -> None:
        self.host = host
        self.transport = transport

    def run(self, command: str, stdin: bytes | None = None) -> CommandResult:
        """Run a /bin/sh command line with umask 077: what it creates, sbatch's job and
        its files included (Slurm hands the submitting umask to the job), is the user's
        alone."""
        return self.transport.run(f"umask 077; {command}", stdin=stdin, timeout=COMMAND_TIMEOUT_S)

    def _tool_checks(self) -> str:
        """A shell list that prints the name of each of Slurm's commands orch needs
        that is not on the login node's PATH."""
        # command -v alone names a file that is there but cannot run (bash does).
        return " ; ".join(
            f'{{ p=$(command -v {tool}) && [ -f "$p" ] && [ -x "$p" ]; }} || echo {tool}'
            for tool in TOOLS
        )

    def missing_tools(self) -> list[str]:
        """Which of Slurm's commands orch needs are not on the login node's PATH."""
        return self.run(self._tool_checks()).stdout.split()

    def require_tools(self) -> None:
        """Raises: HostError (exit 3) naming the login node and what it lacks."""
        self._require(self.missing_tools())

    def _require(self, missing: list[str]) -> None:
        if missing:
            raise HostError(
                self.host.name,
                f"no {', '.join(missing)} on the Slurm login node {self.host.name}",
                "is slurm.login a login node of the cluster (where sbatch works)? "
                "if Slurm comes from a module there, load it in the login shell's profile",
            )

    def partitions(self) -> dict[str, Partition]:
        result = self.run(self._sinfo())
        if not result.ok:
            raise RemoteCommandError(self.host.name, "sinfo", result.exit_code, result.stderr)
        return queue.parse_sinfo(result.stdout)

    @staticmethod
    def _sinfo() -> str:
        return f"sinfo --noheader --format={shlex.quote(queue.SINFO_FORMAT)}"

    def survey(self) -> dict[str, Partition]:
        """`require_tools`, then `partitions`, in one round trip (a submit's first).

        Raises:
            HostError: the login node lacks one of Slurm's commands.
            RemoteCommandError: sinfo failed.
        """
        result = self.run(f"{self._tool_checks()} ; echo {_SURVEY_MARK} ; {self._sinfo()}")
        missing, _, listed = result.stdout.partition(f"{_SURVEY_MARK}\n")
        self._require(missing.split())
        if not result.ok:
            raise RemoteCommandError(self.host.name, "sinfo", result.exit_code, result.stderr)
        return queue.parse_sinfo(listed)

    def write_files(self, files: dict[str, tuple[str, int]]) -> None:
        """Write text files (path -> (text, mode)), paths may start with ~."""
        self._write_then(files, None)

    def write_and_sbatch(self, files: dict[str, tuple[str, int]], command: str) -> str:
        """`write_files`, then `sbatch` with the command line, in one round trip; the
        Slurm job id. Raises as those do; nothing is queued where the files failed."""
        return self._sbatched(self._write_then(files, command))

    def _write_then(self, files: dict[str, tuple[str, int]], command: str | None) -> CommandResult:
        payload = json.dumps({path: [text, mode] for path, (text, mode) in files.items()})
        write = f"{sh_path(self.host.python)} -I -S -c {shlex.quote(_WRITE)}"
        if command is not None:
            write += f" || exit {_WRITE_FAILED} ; {command}"
        result = self.run(write, stdin=payload.encode())
        if (command is None and not result.ok) or result.exit_code == _WRITE_FAILED:
            raise RemoteCommandError(
                self.host.name,
                "writing the batch script",
                result.exit_code,
                result.stderr,
                f"check free space and permissions of {self.host.workdir} on the login node",
            )
        return result

    def _sbatched(self, result: CommandResult) -> str:
        slurm_id = result.stdout.strip().split(";", 1)[0]
        if not result.ok or not slurm_id.isdigit():
            said = (result.stderr.strip() or result.stdout.strip()).replace("sbatch: error: ", "")
            raise InputError(
                f"sbatch refused the job on {self.host.name}: {said}",
                "check the job's nodes: and the inventory's slurm: section "
                "(partition, sbatch: options); sinfo on the login node shows what exists",
            )
        return slurm_id

    def query(self, slurm_id: str, job_root: str) -> QueuedJob | None:
        """The job's state: squeue while Slurm remembers it, then sacct, then the batch
        script's exit record on the shared home; None when none of them knows it."""
        found = self.squeue([slurm_id]).get(slurm_id)
        if found is not None:
            return found
        fields = queue.SACCT_FIELDS
        sacct = self.run(
            f"sacct --noheader --parsable2 --jobs={slurm_id} --format={fields} 2>/dev/null"
        )
        from_sacct = queue.parse_sacct(sacct.stdout, slurm_id) if sacct.ok else None
        if from_sacct is not None:
            return from_sacct
        record = self.run(f"cat {sh_path(job_root)}/slurm/exit-{slurm_id}.json 2>/dev/null")
        log.debug("job %s: squeue and sacct forgot it; exit record %r", slurm_id, record.stdout)
        return queue.from_exit_record(record.stdout if record.ok else None, slurm_id)

    def squeue(self, slurm_ids: list[str]) -> dict[str, QueuedJob]:
        """What squeue says of these jobs (any state it still remembers)."""
        if not slurm_ids:
            return {}
        ids = ",".join(slurm_ids)
        fmt = shlex.quote(queue.SQUEUE_FORMAT)
        result = self.run(f"squeue --noheader --states=all --jobs={ids} --format={fmt} 2>/dev/null")
        return queue.parse_squeue(result.stdout)

    def scancel(self, slurm_id: str) -> None:
        result = self.run(f"scancel {slurm_id}")
        if not result.ok and "already completed" not in result.stderr.lower():
            log.debug("scancel %s: %s", slurm_id, result.stderr.strip())

    def wait_gone(self, slurm_id: str, job_root: str, timeout: float = GONE_TIMEOUT_S) -> bool:
        """Until squeue shows the job's allocation gone (not pending, running or
        completing); False if it is still there after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.squeue([slurm_id]).get(slurm_id)
            if found is None or not found.allocated:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)

    def prepare_node_dirs(self, job_root: str, names: list[str], attempt: int = 0) -> None:
        """Each node's directory, with its links to the job's code and agent and an
        empty node.json (the agent's follow takes a directory without one for a node
        that never started), before following it: its launcher may not have run yet."""
        parts = []
        for name in names:
            d = f"{sh_path(job_root)}/{shlex.quote(attempt_dir(node_dir_name(name), attempt))}"
            parts.append(
                f"mkdir -p {d}/logs && {{ [ -e {d}/node.json ] || echo '{{}}' > {d}/node.json; }}"
                f" && {{ [ -L {d}/code ] || ln -s ../code {d}/code 2>/dev/null || true; }}"
                f" && {{ [ -L {d}/agent ] || ln -s ../agent {d}/agent 2>/dev/null || true; }}"
            )
        result = self.run(" && ".join(parts))
        if not result.ok:
            raise RemoteCommandError(
                self.host.name, "preparing the nodes' directories", result.exit_code, result.stderr
            )

    def read(self, path: str) -> str | None:
        result = self.run(f"cat {sh_path(path)} 2>/dev/null")
        return result.stdout if result.ok else None
