"""A command on a host with this process's stdio (`orch ssh`): the host's terminal
where ours is one, its size followed, keys passed through as typed."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from typing import Any

import paramiko


def interactive(channel: paramiko.Channel, command: str) -> int:
    """Run `command` on `channel` with this process's stdio: where stdin is a
    terminal, on a terminal of the host's (its size followed), this one raw meanwhile
    so that keys go through as typed; else plain pipes. Returns the exit status."""
    import select
    import signal
    import termios
    import tty

    stdin = sys.stdin.fileno()
    terminal = os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if terminal else None
    if terminal:
        size = shutil.get_terminal_size()
        channel.get_pty(os.environ.get("TERM", "xterm"), size.columns, size.lines)
    channel.exec_command(command)
    previous = None
    if terminal:

        def resized(_signum: int, _frame: object) -> None:
            size = shutil.get_terminal_size()
            with contextlib.suppress(paramiko.SSHException, OSError):
                channel.resize_pty(size.columns, size.lines)

        previous = signal.signal(signal.SIGWINCH, resized)
        tty.setraw(stdin, termios.TCSANOW)  # not TCSAFLUSH: keep what was typed ahead
    try:
        open_stdin = True
        while True:
            watched: list[Any] = [channel, stdin] if open_stdin else [channel]
            ready = select.select(watched, [], [], 1.0)[0]
            if channel in ready or channel.recv_ready() or channel.recv_stderr_ready():
                if channel.recv_stderr_ready():
                    os.write(2, channel.recv_stderr(1 << 15))
                if channel.recv_ready():
                    data = channel.recv(1 << 15)
                    if data:
                        os.write(1, data)
            if stdin in ready:
                typed = os.read(stdin, 1 << 12)
                if typed:
                    channel.sendall(typed)
                else:  # EOF here: the command's stdin ends too
                    channel.shutdown_write()
                    open_stdin = False
            if ended(channel):
                break
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        if previous is not None:
            signal.signal(signal.SIGWINCH, previous)
    return int(channel.recv_exit_status())


def ended(channel: paramiko.Channel) -> bool:
    """Whether everything the command wrote has been received: the host's end of the
    channel (its EOF comes after the last of the output), nothing left unread. Its exit
    status alone is not enough: sshd may send it while a terminal's last output is
    still on its way (the line a typed command printed just before `exit`)."""
    done = bool(channel.eof_received) or channel.closed
    return done and not channel.recv_ready() and not channel.recv_stderr_ready()
