"""`orch ui`: a page on this machine with the jobs, a job's live log and curves, and the
hosts over time. A client of the API like the CLI (`orchestrator.api`, the one front
door): nothing new runs on the hosts.

```python
from orchestrator.ui import Server

server = Server([Path("cluster.yaml")], port=0)   # listening already: a port in use fails here
print(server.url)                                 # http://127.0.0.1:PORT/?token=TOKEN
server.run()                                      # until Ctrl-C
```

Parts: `guard` (who may ask: loopback, the token, same-origin actions), `server`
(Starlette routes, uvicorn), `state` (what is refreshed while a page looks), `board`
(the jobs), `feeds` (a job's lines and bars), `sampling` (hosts over time), `browser`
(opening the page without putting the token in a command line), `static/` (the page:
its script, its style, and uPlot, vendored with its license).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.ui.browser import open_page
from orchestrator.ui.guard import Guard, new_token

__all__ = ["Server"]


class Server:
    """The page's server, listening from the moment it is made.

    Args:
        inventories: whose hosts the page shows (none: the default inventory).
        port: on 127.0.0.1 (0: any free port).

    Raises:
        InputError: the port is in use.
    """

    def __init__(self, inventories: Sequence[Path], port: int = 0) -> None:
        from orchestrator.ui.server import bind

        self.inventories = list(inventories)
        self._socket = bind(port)
        self.port = int(self._socket.getsockname()[1])
        self.guard = Guard(new_token(), self.port)

    @property
    def url(self) -> str:
        """The page's address, with its token."""
        return f"http://127.0.0.1:{self.port}/?token={self.guard.token}"

    def open_browser(self) -> bool:
        """Open the page in a browser where there is a display; whether one was asked
        to. The browser is handed an owner-only file that leads to the page, never the
        address itself: a command line is readable by every user of the machine."""
        return open_page(self.url)

    def run(self) -> None:
        """Serve until Ctrl-C (KeyboardInterrupt) or SIGTERM."""
        import uvicorn

        from orchestrator.ui.server import make_app
        from orchestrator.ui.state import UiState

        state = UiState(self.inventories)
        state.start()
        config = uvicorn.Config(
            make_app(state, self.guard),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
            server_header=False,
        )
        try:
            uvicorn.Server(config).run(sockets=[self._socket])
        finally:
            state.close()
            self._socket.close()
