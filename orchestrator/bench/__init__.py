"""`orch bench`: measuring the cluster as a job sees it, by running jobs."""
