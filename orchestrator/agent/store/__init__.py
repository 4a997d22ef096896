"""The host's content store and what is built from it: a push's receiver (`sync`),
which builds a job's snapshot, the relay that serves the store to the push's other
hosts, takeover of a snapshot shared over NFS, and gc."""
