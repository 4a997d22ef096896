"""A detached job's restarts, run on its hosts without the laptop: what the keeper
decides (`decisions`, pure), the keeper daemon and the `keeper` command (`daemon`),
each host's member (`member`), and the authenticated wire between them (`wire`)."""
