"""The local lab: real test hosts (systemd containers with sshd) on this machine."""

# The release lab clusters, `gpuboot lab` and lab-bootstrap.sh build unless told otherwise.
LAB_RELEASE = "k8s-1.36"
