#!/bin/sh
# Installs Debian's Slurm (slurmctld, slurmd, slurm-client) and munge for the Slurm test
# cluster (tests/cluster/slurm.py), without leaving any system-wide daemon running: their
# postinst scripts would start slurmctld, slurmd and munged on this machine, outside the test
# namespaces. A policy-rc.d that refuses every start (exit 101) is put in place for the
# install, unless one is there already, and anything started anyway is stopped by PID.
set -eu

policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# orch test-deps: no service starts while slurm and munge install\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
    trap 'rm -f "$policy"' EXIT  # a failed install must not leave every start refused
fi
daemons() { for name in slurmctld slurmd munged; do pgrep -x "$name" || true; done; }
before=$(daemons)

echo "installing slurmctld, slurmd, slurm-client and munge"
[ -n "${ORCH_APT_UPDATED:-}" ] || apt-get update -qq  # install_deps.sh ran it
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null

[ -n "$own_policy" ] && rm -f "$policy"
# The packages enable their services for the next boot; the test cluster starts its own.
for service in slurmctld slurmd munge; do
    command -v update-rc.d >/dev/null && update-rc.d -f "$service" disable >/dev/null 2>&1 || true
    command -v systemctl >/dev/null && systemctl disable "$service" >/dev/null 2>&1 || true
done
for pid in $(daemons); do
    case " $before " in *" $pid "*) continue ;; esac
    echo "stopping $(cat /proc/"$pid"/comm 2>/dev/null) ($pid), started by the install"
    kill "$pid" 2>/dev/null || true
done
