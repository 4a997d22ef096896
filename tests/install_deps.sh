#!/bin/sh
# `make test-deps`, as root: the Debian packages the cluster tests need that this machine
# lacks, after one `apt-get update` (a fresh machine paid three, one for each group).
# openssh-server, iproute2 and iptables (which blocks a port between two test hosts) for
# the test hosts; chromium, which orch ui's browser tests drive; Slurm and munge for the
# Slurm test cluster, through install_slurm.sh, which keeps their daemons from starting.
set -eu
cd "$(dirname "$0")"

wanted=
[ -x /usr/sbin/sshd ] || wanted="$wanted openssh-server"
command -v ip >/dev/null || wanted="$wanted iproute2"
command -v iptables >/dev/null || wanted="$wanted iptables"
command -v chromium >/dev/null || wanted="$wanted chromium"
slurm=
command -v slurmctld >/dev/null || slurm=1
[ -n "$wanted$slurm" ] || exit 0

# No service starts while they install: openssh-server's would start an sshd on this
# machine, outside the test namespaces, whose hosts run their own. A policy-rc.d that
# refuses every start (exit 101), unless one is there already; install_slurm.sh keeps it.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# orch test-deps: no service starts while the test packages install\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

apt-get update -qq
if [ -n "$wanted" ]; then
    echo "installing$wanted"
    # shellcheck disable=SC2086  # one word a package
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $wanted >/dev/null
fi
if [ -n "$slurm" ]; then
    ORCH_APT_UPDATED=1 sh ./install_slurm.sh
fi
