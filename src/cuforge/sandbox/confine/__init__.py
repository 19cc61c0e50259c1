"""The operating system's confinement: Landlock and seccomp, namespaces and limits, the pids cgroup."""
