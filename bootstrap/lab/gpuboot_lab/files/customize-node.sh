#!/bin/sh
# mmdebstrap customize hook for the gpuboot lab node image.
# $1 is the root of the image being built. Runs on the build host.
set -eu
root="$1"

# SSH: no keys baked in. Each node generates its own host keys at first boot,
# and the lab bind-mounts authorized_keys at run time.
rm -f "$root"/etc/ssh/ssh_host_*
cat > "$root/etc/systemd/system/gpuboot-hostkeys.service" <<'UNIT'
[Unit]
Description=Generate this node's own SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/gpuboot-hostkeys.service \
  "$root/etc/systemd/system/multi-user.target.wants/gpuboot-hostkeys.service"
mkdir -p "$root/root/.ssh"
chmod 700 "$root/root/.ssh"
printf 'PasswordAuthentication no\nPermitRootLogin prohibit-password\nUseDNS no\n' \
  > "$root/etc/ssh/sshd_config.d/gpuboot-lab.conf"

# Mounts shared, as systemd leaves them on a host: the container runtime starts with them
# private, and NVIDIA's operands (HostToContainer and Bidirectional propagation on /run/nvidia
# and /) are refused on a private mount ("is mounted on /run but it is not a shared or slave
# mount", seen in the lab). kind does the same at its nodes' start.
cat > "$root/etc/systemd/system/gpuboot-shared-mounts.service" <<'UNIT'
[Unit]
Description=Make every mount shared, as on a host
DefaultDependencies=no
Before=local-fs.target containerd.service

[Service]
Type=oneshot
ExecStart=/bin/mount --make-rshared /

[Install]
WantedBy=local-fs.target
UNIT
mkdir -p "$root/etc/systemd/system/local-fs.target.wants"
ln -sf /etc/systemd/system/gpuboot-shared-mounts.service \
  "$root/etc/systemd/system/local-fs.target.wants/gpuboot-shared-mounts.service"

# A sudo user, as most bare-metal inventories use one instead of root.
chroot "$root" useradd --create-home --shell /bin/bash gpuboot
mkdir -p "$root/home/gpuboot/.ssh"
chroot "$root" chown -R gpuboot:gpuboot /home/gpuboot/.ssh
chmod 700 "$root/home/gpuboot/.ssh"
echo 'gpuboot ALL=(ALL) NOPASSWD:ALL' > "$root/etc/sudoers.d/gpuboot"
chmod 0440 "$root/etc/sudoers.d/gpuboot"

# Packages come through the apt cache on the lab's gateway, whatever bridge it is.
cat > "$root/usr/local/bin/gpuboot-apt-proxy" <<'SH'
#!/bin/sh
gw=$(ip -4 route show default | awk '{print $3; exit}')
[ -n "$gw" ] && echo "http://$gw:3143" || echo DIRECT
SH
chmod 755 "$root/usr/local/bin/gpuboot-apt-proxy"
echo 'Acquire::http::Proxy-Auto-Detect "/usr/local/bin/gpuboot-apt-proxy";' \
  > "$root/etc/apt/apt.conf.d/01gpuboot-proxy"

# Units that cannot work in a container and only slow boot down.
for unit in systemd-resolved.service getty@tty1.service console-getty.service \
            systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done

# Every node gets its own machine-id at first boot.
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
