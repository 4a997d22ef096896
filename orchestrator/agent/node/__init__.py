"""One node of a job on this host, in its job directory: the supervisor that starts
torchrun (`start`), its state and `status`, `follow` of its logs, `kill`, each rank's
entry (`rank`), `setup`, `outputs`, and a `top` sample of its ranks; warm starts, the
ranks forked from an interpreter that imported torch already, in `warm/`."""
