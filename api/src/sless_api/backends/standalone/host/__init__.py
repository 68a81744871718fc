"""The standalone backend's process host: sandboxed runtime processes (bubblewrap, cgroups, seccomp, their own
network), their supervision, health checks and the pool of spare processes."""
