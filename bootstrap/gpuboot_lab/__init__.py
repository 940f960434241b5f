"""The local lab: real test hosts (systemd containers with sshd) on this machine."""
