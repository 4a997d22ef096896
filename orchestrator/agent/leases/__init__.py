"""Leases of a host's GPUs and slots, shared by every user of the host, and the line
that jobs wait in when they are busy. No daemon: each node's supervisor takes its
own lease, and a lease whose holder is gone counts for nothing.

**Where**: one local directory per host that every user can write
(`lease_dir`): /run/lock (a tmpfs: a reboot empties it), else /dev/shm, else
/var/tmp. It must be sticky (mode 1777): a user can then remove only their own
files. Each file is created O_EXCL by its owner, 0644, and holds no job env, only
who holds what: job id, user, pids, since when.

    (the directory)        flock()ed around every look-and-take, with a deadline
                           (opened read-only: no file another user owns is in
                           the way); `.lock`, older agents' lock, is taken too
    L-UID-PID-START-R.json a lease: units held by the supervisor PID (START: its
                           start time, which names it for good; R: random, so
                           that no file can be put at the name beforehand)
    T-UID-PID-START-R.json a ticket: a supervisor waiting in line
    C-UID-PID-START-R.json its claim: touched by whoever drives the ticket; made
                           before the ticket names it, so nobody could put a
                           file there first

Any user can put any file there: a record counts only when it is a regular file
of at most 64 KiB whose fields check, and whose `uid` owns it; the rest is
ignored with a warning that names the owner (storage.py).

**A lease lives** while its supervisor or its torchrun runs (pid and start time,
on this boot of this host); any other lease is stale: it holds nothing, and its
owner's next look removes it. A host that reboots forgets its pids (the boot id
is recorded). A ticket lives while its supervisor does.

**The line**: tickets order by (time of submit, job id), the same key on every
host of a job; a ticket's time is taken as no earlier than 5 s before its file's
ctime, which its owner cannot set back (policy.LINE_SLACK_S). A ticket may take units when the free ones, less what every older
ticket of the same kind wants, still leave enough: first come, first served, and
a job that needs a whole host is never overtaken by a stream of small ones. A ticket keeps units back only while it is claimed: whoever drives it touches
its claim file (its supervisor at each look, a node of several its controller's
rounds), and a ticket whose claim is older than policy.CLAIM_S (10 s) keeps its
place but holds nothing back. A ticket nobody drives (a file a co-tenant left
with a live process behind it, a stopped supervisor, a controller gone silent)
then cannot stall the line: the jobs behind it start on the free units, and it is
still first for what frees once it is claimed again. A timeout on the ticket
itself would be wrong: a job of several nodes waits on each host, claimed, for as
long as another host is busy. Who keeps claiming a ticket that never takes holds
no more than a lease of theirs would, and is named as ahead in every `queued:`
line. Jobs
of one node take their lease as soon as their turn comes (`self_start`). Jobs of
several nodes take them all or none: their controller asks each host whether the
turn came (`poll`), takes every lease (`take`), and if one host refused, gives
the others back (`untake`) and keeps waiting; the one global order of tickets
means the oldest job always wins every host it waits for, so two jobs never
deadlock and neither holds a host while it waits for another.

GPUs that nvidia-smi shows in use by a process and that no live lease holds are
busy too (a process orch did not start); each comes with a warning naming it.

**The fair line** (fairness.py): tickets order by priority (raised by waiting), then
by what their users hold here, then as above; a user's limit keeps their ticket
waiting without holding anything back; the host's policy file (admin.py) says who
may use `high`, each user's limit and how fast waiting counts. Whatever a ticket
says of itself is read through this host's policy, and its user is its file's owner.

Its modules: `policy` (the rules above, pure), `fairness` (the fair line's, pure),
`admin` (the policy file), `storage` (the directory and its records), `gpus` (GPUs
busy outside orch, from nvidia-smi), `holder` (the supervisor's side) and
`commands` (the `lease` command).
"""
