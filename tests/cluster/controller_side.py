"""What a ``Cluster`` gives the controller: an inventory of its hosts, fresh controllers
that trust them, and the environment to run ``orch`` in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controller import Controller, repo_python
from tests.cluster.hosts import HostsMixin


class ControllerSideMixin(HostsMixin):
    """``write_inventory``, ``new_controller`` and ``env``."""

    _controllers_made: int

    def write_inventory(
        self,
        path: Path,
        hosts: Sequence[int | str] | None = None,
        defaults: Mapping[str, Any] | None = None,
        **host_extras: Mapping[str, Any],
    ) -> Path:
        """Write an orch inventory of (some of) the hosts.

        Args:
            path: where to write the YAML.
            hosts: indices or names to include (default: all).
            defaults: keys merged over the default section; a None value removes a key.
            **host_extras: per host name, keys merged over its entry, e.g.
                ``node2={"slots": 2}``.

        Returns:
            ``path``.
        """
        unknown = set(host_extras) - {host.name for host in self.hosts}
        if unknown:
            raise ValueError(f"extras for unknown hosts: {sorted(unknown)}")
        selected = self.hosts if hosts is None else [self.host(h) for h in hosts]
        base = {"user": "root", "identity_file": str(self.client_key), "python": str(repo_python())}
        doc = {
            "defaults": _merged(base, defaults or {}),
            "hosts": [
                _merged(
                    {"name": host.name, "address": host.address}, host_extras.get(host.name, {})
                )
                for host in selected
            ],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def new_controller(self, trust_hosts: bool = True) -> Controller:
        """A fresh controller: empty HOME and job state, known_hosts as asked.

        Args:
            trust_hosts: pre-fill known_hosts with every host key (as after a first
                ``ssh`` by hand); False leaves it empty.
        """
        assert self.workdir is not None, "cluster not started"
        self._controllers_made += 1
        root = self.workdir / "controllers" / str(self._controllers_made)
        controller = Controller(
            home=root / "home", known_hosts=root / "known_hosts", state_dir=root / "state"
        )
        controller.home.mkdir(parents=True, mode=0o700)
        controller.state_dir.mkdir()
        lines = [host.known_hosts_line() for host in self.hosts] if trust_hosts else []
        controller.known_hosts.write_text("".join(lines))
        return controller

    def env(self, inventory: Path | None = None, **extra: str) -> dict[str, str]:
        """Environment for running ``orch`` as this cluster's default controller."""
        assert self._controller is not None, "cluster not started"
        return self._controller.env(inventory, **extra)


def _merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``overrides``, where a None override removes the key."""
    merged = {**base, **overrides}
    return {key: value for key, value in merged.items() if value is not None}
