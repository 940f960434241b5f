#!/bin/sh
# mmdebstrap customize hook for the lab VM image (after customize-node.sh).
# $1 is the image root; GPUBOOT_VM_PUBKEY is the lab VM key's public half.
set -eu
root="$1"
printf '%s\n' "$GPUBOOT_VM_PUBKEY" > "$root/root/.ssh/authorized_keys"
chmod 600 "$root/root/.ssh/authorized_keys"
printf '/dev/vda / ext4 defaults 0 1\n' > "$root/etc/fstab"
cat > "$root/etc/systemd/network/10-eth0.network" <<'NET'
[Match]
Name=eth0

[Network]
DHCP=ipv4
NET
ln -sf /lib/systemd/system/systemd-networkd.service \
  "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
echo gpuboot-vm > "$root/etc/hostname"
# Lab-only: build initramfs images with the modules this VM uses, not every module. Under
# software emulation a full rebuild takes over 15 minutes; with MODULES=dep about a minute.
mkdir -p "$root/etc/initramfs-tools/conf.d"
echo MODULES=dep > "$root/etc/initramfs-tools/conf.d/gpuboot-lab.conf"
