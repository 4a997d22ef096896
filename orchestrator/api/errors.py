"""Every error orch raises, and the exit code of each, for the API's callers and the
CLI: one hierarchy (`OrchError(message, hint)`), whose `exit_code` the CLI exits with."""

from orchestrator.models.errors import (
    EXIT_BAD_INPUT,
    EXIT_INFRA,
    EXIT_INTERRUPTED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    ExecFailed,
    HostChoiceError,
    HostError,
    InfraError,
    InputError,
    Interrupted,
    JobFailed,
    MultiHostError,
    OrchError,
    PreflightError,
    Refused,
    RemoteCommandError,
    SpecError,
    Unsupported,
)

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_INFRA",
    "EXIT_INTERRUPTED",
    "EXIT_JOB_FAILED",
    "EXIT_OK",
    "ExecFailed",
    "HostChoiceError",
    "HostError",
    "InfraError",
    "InputError",
    "Interrupted",
    "JobFailed",
    "MultiHostError",
    "OrchError",
    "PreflightError",
    "Refused",
    "RemoteCommandError",
    "SpecError",
    "Unsupported",
    "combined",
]


def combined(errors: list[OrchError] | tuple[OrchError, ...]) -> OrchError:
    """One error for the hosts' errors of a verb: the one, or all of them together."""
    return errors[0] if len(errors) == 1 else MultiHostError(list(errors))
