"""Server backends: how a server node is served (simulated, containerized, local, external)."""
