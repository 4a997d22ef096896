"""A cluster of real SSH hosts on one Linux machine, for integration tests.

Each host is a network namespace joined to the bridge ``orchbr0`` by a veth pair,
running its own ``sshd`` as PID 1 of a private pid/mount/uts namespace: it has its
own address, process table, hostname and home directory. CONTRIBUTING.md ("Tests") says
what the tests need to run it; the rooms below say how each part is built.

    with Cluster(3) as cluster:
        cluster.write_inventory(tmp / "inventory.yaml")
        subprocess.run(["orch", "check"], env=cluster.env(inventory=tmp / "inventory.yaml"))
        cluster.crash(2)

Everything is created under fixed names (``orchbr0``, ``orch-node{i}``, ``orchv{i}``),
so one cluster exists per network at a time; a lock makes a second session on the same
network wait. ``ORCH_TEST_NET=N`` (and each pytest-xdist worker) picks another network:
``orchbrN``, ``orchN-node{i}``, ``orchvNx{i}`` and 10.77.N.0/24. Traffic only ever goes
to the addresses of these namespaces.

Public surface, for ``tests/`` and ``bench/`` alike: the names in ``__all__``, listed
below and imported here. Every other name in the package's rooms (constants, module
functions, ``Host`` fields not listed) is how the harness builds the hosts, and may
change without notice; only the harness's own tests look at them.

- ``Cluster``: ``start``/``stop`` (or ``with``); its ``hosts`` (``Host``),
  ``client_key`` and ``host_ca`` (the CA that signed every host's certificate, a
  ``HostCertificate`` its sshd offers to clients that ask for one); faults (``crash``, ``restart``, ``partition``, ``heal``, ``cut_controller``,
  ``limit_controller`` (a slow link from this machine, as a laptop's),
  ``reconnect_controller``,
  ``ensure_healthy``); other shapes, each a ``with`` block that undoes itself on exit
  (``password_user(i, password)``: a user with a password and no key, ``PasswordLogin``;
  ``shared_home(hosts)``: one ``/root`` for several hosts, NFS-style;
  ``extra_hosts(n)``: node4.. beside the session's hosts, which a ``new_controller()``
  made inside the block trusts); looking inside a host (``host``, ``home``, ``exec_on``,
  ``host_pids``, ``ssh``); the controller side (``write_inventory``, ``new_controller``,
  ``env``); a second cable between two hosts (``add_link``, ``route_via_link``,
  ``remove_link``), firewalls (``block_port``, ``unblock_port``) and leftover
  listeners (``hold_port``, ``release_port``).
- ``Host``: read ``index``, ``name``, ``address``, ``home`` (its ``/root``, as seen
  from this machine: the shared one inside ``shared_home``) and ``known_hosts_line()``;
  its other fields are the harness's bookkeeping, which only the harness's own tests
  look at.
- ``Controller``: a machine running ``orch``: ``home``, ``known_hosts``, ``state_dir``
  and ``env()``. ``OrchRunner`` runs the real CLI as one.
- ``orch_command()``, ``repo_python()``, ``REPO_ROOT``: the CLI, the hosts' interpreter
  and the repository this harness belongs to.
- ``require_cluster_support()``, ``skip_or_fail()``, ``cluster_unavailable_reason()``:
  skip (in CI, fail) where the cluster cannot run; ``ClusterError`` when it breaks.
- ``BRIDGE``, ``SUBNET``, ``ROOT_HOME``: the bridge's name, the first three octets of
  the hosts' addresses, and the home directory every host hides.
- ``POLICY_FILE``: where every host's agent reads its line policy (sshd sets
  ``ORCH_POLICY_FILE``: on the host's own ``/run/lock``, absent until a test writes it).
- ``SlurmCluster``: a Slurm cluster (login node, compute nodes, one shared home) on a
  ``Cluster``'s hosts, its partition ``PARTITION``, and ``slurm_unavailable_reason()``.

Rooms, each one module:

- ``network``: the network's number (``ORCH_TEST_NET``) and the names and addresses
  made from it, the lock, the ARP table limits, leftovers of a crashed run.
- ``hosts``: a ``Host``, its keys, sshd config and PID 1; booting and killing it.
- ``links``: the bridge, namespaces and veth pairs; extra links and firewalls.
- ``inside``: ``exec_on``, ``host_pids``, ``ssh`` and leftover listeners.
- ``faults``: crashes, partitions, this machine cut off or slowed, and their undoing.
- ``shapes``: shared homes and extra hosts. ``users``: other users on a host.
- ``controller`` and ``controller_side``: the machine running ``orch``, and what the
  cluster gives it (inventory, known hosts, environment).
- ``lifecycle``: ``Cluster`` itself, made of the rooms above; ``availability``:
  skip or fail where the cluster cannot run; ``commands``: setup commands, the error.
- ``slurm``: ``SlurmCluster``, slurmctld, slurmd and munged on the hosts.
"""

from tests.cluster.availability import (
    cluster_unavailable_reason,
    require_cluster_support,
    skip_or_fail,
)
from tests.cluster.commands import ClusterError
from tests.cluster.controller import REPO_ROOT, Controller, OrchRunner, orch_command, repo_python
from tests.cluster.hosts import POLICY_FILE, ROOT_HOME, Host
from tests.cluster.lifecycle import Cluster
from tests.cluster.network import BRIDGE, SUBNET
from tests.cluster.slurm import PARTITION, SlurmCluster, slurm_unavailable_reason
from tests.cluster.users import PasswordLogin

__all__ = [
    "BRIDGE",
    "PARTITION",
    "POLICY_FILE",
    "REPO_ROOT",
    "ROOT_HOME",
    "SUBNET",
    "Cluster",
    "ClusterError",
    "Controller",
    "Host",
    "OrchRunner",
    "PasswordLogin",
    "SlurmCluster",
    "cluster_unavailable_reason",
    "orch_command",
    "repo_python",
    "require_cluster_support",
    "skip_or_fail",
    "slurm_unavailable_reason",
]
