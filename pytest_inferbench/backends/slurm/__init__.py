"""The `slurm` backend: servers run as `srun` steps of `salloc --no-shell` allocations.

- `commands`: the salloc / srun / scancel / scontrol argv and the parsing of their answers
  (pure: what the unit tests pin);
- `pyxis`: container mode, an enroot squashfs imported once per image and pyxis' srun options;
- `jobs`: the allocation's life (request, state, hosts, cancel) and the sweep of stale jobs;
- `steps`: the servers started inside an allocation, watched together with the job;
- `backend`: `SlurmBackend`, which puts them together for one server node.
"""
