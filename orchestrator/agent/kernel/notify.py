"""Word of a job's events (`notify:`, docs/RUNNING.md), sent the same way from both
ends: an attached job's controller on the laptop (reporting/notify.py) and a detached
job's keeper on its host (keeper/notify.py). Standard library only, Python 3.8.

1. A target is a webhook (an http:// or https:// URL: a JSON POST whose `text` is the
   message, as Slack's, Mattermost's and Rocket.Chat's incoming webhooks take it) or a
   shell command (`/bin/sh -c`, the message on its stdin and in ORCH_MESSAGE, with
   ORCH_JOB_ID, ORCH_EVENT, ORCH_STATE and ORCH_EXIT_CODE in its environment).
2. Events: `ended` (the job ended and did not fail: succeeded, or killed), `failed`,
   `restarted` (a new attempt started), `stalled` (the stall watchdog fired). Each
   fires once per event of a job.
3. A send that fails is tried again, TRIES times in all, BACKOFF_S apart, each failure
   told to `log`; it never raises, and so never changes how the job ends.
4. A webhook's URL may hold a token (Slack's do): it is never in an argv, and `redact`
   is all of it that a log line or message names.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Callable

# The agent's `kill` imports this module (NOTIFY_MARK) on its every run: what only a
# send needs (urllib, subprocess, threads, typing: 20 ms) is imported where it is used.

ENDED, FAILED, RESTARTED, STALLED = "ended", "failed", "restarted", "stalled"
EVENTS = (ENDED, FAILED, RESTARTED, STALLED)
TRIES = 3
BACKOFF_S = (1.0, 2.0)  # before the second try, and the third
TIMEOUT_S = 5.0  # one HTTP request: a hook that hangs holds the end of the job this long
COMMAND_TIMEOUT_S = 30.0  # one run of a notify command (its process group is killed after)
FINISH_WAIT_S = TRIES * (TIMEOUT_S + 3.0) + 3.0  # the sends left when a job's end is told
MESSAGE_ENV_MAX = 4000  # ORCH_MESSAGE's characters at most (the whole message is on stdin)
WEBHOOK_SCHEMES = ("http", "https")
# In a notify command's environment, beside ORCH_JOB_ID: the job's kill, which stops
# every process carrying the job's id (agent/node/kill.py), leaves it be.
NOTIFY_MARK = b"ORCH_NOTIFY=1"


class Event:
    """One event of a job, as it is told: `exit_code` is what `orch submit` exits with
    for an end (0 succeeded, 1 failed or killed, 130 interrupted), None while the job
    still runs (restarted, stalled); `text` is the message. (Not a dataclass: the
    agent's `kill` imports this module, and dataclasses costs it 20 ms.)"""

    __slots__ = ("event", "exit_code", "job_id", "state", "text")

    def __init__(
        self, job_id: str, event: str, state: str, exit_code: int | None, text: str
    ) -> None:
        self.job_id, self.event, self.state = job_id, event, state
        self.exit_code, self.text = exit_code, text


def is_webhook(target: str) -> bool:
    """Whether `target` is a URL (scheme://...) rather than a shell command."""
    scheme, sep, _ = target.partition("://")
    return bool(sep) and scheme.lower() in WEBHOOK_SCHEMES


def redact(target: str) -> str:
    """What a log line may name of a target: a URL's scheme and host (its path, query
    and user may hold a token); a command as `command`."""
    if not is_webhook(target):
        return "command"
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(target.strip())
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "webhook"
    return f"{parts.scheme.lower()}://{host}{port}/…"


def message(job_id: str, event: str, state: str, exit_code: int | None) -> str:
    """The first line of an event's message: the job, what happened, its exit code."""
    code = "" if exit_code is None else f" (exit code {exit_code})"
    what = {RESTARTED: "restarted", STALLED: "stalled"}.get(event, state)
    return f"orch: job {job_id} {what}{code}"


def environment(event: Event) -> dict[str, str]:
    """The variables a notify command sees, besides the environment it runs in."""
    return {
        "ORCH_JOB_ID": event.job_id,
        "ORCH_EVENT": event.event,
        "ORCH_STATE": event.state,
        "ORCH_EXIT_CODE": "" if event.exit_code is None else str(event.exit_code),
        "ORCH_MESSAGE": event.text[:MESSAGE_ENV_MAX],
        "ORCH_NOTIFY": "1",
    }


def payload(event: Event) -> bytes:
    """A webhook's body: Slack's `text`, and the event's fields for other readers."""
    import json  # not at import: `orch kill` on every host reads NOTIFY_MARK from here

    return json.dumps(
        {
            "text": event.text,
            "job_id": event.job_id,
            "event": event.event,
            "state": event.state,
            "exit_code": event.exit_code,
        }
    ).encode()


class Courier:
    """Sends a job's events to its target in one thread of its own, in order, so that
    a hook that hangs or fails holds up nothing of the job; `finish` waits for the
    last of them (FINISH_WAIT_S at most).

    Args:
        target: the job's notify target.
        log: where each try that failed is told.
        told: where each send that worked is told, if anywhere.
    """

    def __init__(
        self,
        target: str,
        log: Callable[[str], None],
        told: Callable[[str], None] | None = None,
    ) -> None:
        import queue
        import threading

        self.target, self.log, self.told = target, log, told
        self.queue: queue.Queue[Event | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.sent: list[Event] = []

    def tell(self, event: Event) -> None:
        import threading

        self.queue.put(event)
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="notify", daemon=True)
            self.thread.start()

    def finish(self, wait_s: float = FINISH_WAIT_S) -> None:
        """Wait for what was told to be sent (or given up), `wait_s` at most."""
        if self.thread is None:
            return
        self.queue.put(None)
        self.thread.join(timeout=wait_s)
        if not self.thread.is_alive():
            self.thread = None  # what is told next starts another

    def _run(self) -> None:
        while True:
            event = self.queue.get()
            if event is None:
                return
            if send(self.target, event, self.log):
                self.sent.append(event)
                if self.told is not None:
                    self.told(
                        f"notify: told {event.event} of {event.job_id} to {redact(self.target)}"
                    )


class SendError(Exception):
    """One try failed; the message names no secret."""


def send(
    target: str,
    event: Event,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Tell `event` to `target`, trying TRIES times; each failure goes to `log`.

    Returns:
        Whether a try succeeded. Never raises.
    """
    for number in range(1, TRIES + 1):
        try:
            send_once(target, event)
            return True
        except SendError as exc:
            again = f"; again in {BACKOFF_S[number - 1]:.0f} s" if number < TRIES else ""
            log(
                f"notify: {event.event} of job {event.job_id} to {redact(target)}: "
                f"try {number} of {TRIES} failed: {exc}{again}"
            )
        except Exception as exc:  # a notification never ends the keeper, nor the submit
            log(f"notify: {event.event} of job {event.job_id}: {type(exc).__name__}")
            return False
        if number < TRIES:
            sleep(BACKOFF_S[number - 1])
    return False


def send_once(target: str, event: Event) -> None:
    """One try.

    Raises:
        SendError: it failed: the HTTP status, the network's error, or the command's
            exit status and the end of its stderr.
    """
    if is_webhook(target):
        _post(target.strip(), payload(event))
    else:
        _run(target, event)


def _post(url: str, body: bytes) -> None:
    import socket
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "orch-notify"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            answer.read(65536)
    except urllib.error.HTTPError as exc:  # its str names no URL, but be sure
        raise SendError(f"HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise SendError(_scrub(str(exc.reason), url)) from None
    except (socket.timeout, TimeoutError):  # noqa: UP041 - distinct before Python 3.10
        raise SendError(f"no answer in {TIMEOUT_S:.0f} s") from None
    except (OSError, ValueError) as exc:
        raise SendError(_scrub(f"{type(exc).__name__}: {exc}", url)) from None


def _scrub(text: str, url: str) -> str:
    """`text` without the URL or any piece of it past its host."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    for secret in (url, parts.path, parts.query, parts.netloc):
        if secret and secret not in ("/",):
            text = text.replace(secret, "…")
    return text


def _run(command: str, event: Event) -> None:
    import contextlib
    import signal
    import subprocess

    child = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **environment(event)},
        start_new_session=True,  # its own group: a timeout stops all it started
    )
    try:
        _, err = child.communicate((event.text + "\n").encode(), timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise SendError(f"the command ran past {COMMAND_TIMEOUT_S:.0f} s") from None
    if child.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        said = f": {' / '.join(tail)}" if tail else ""
        raise SendError(f"the command exited with {child.returncode}{said}")
