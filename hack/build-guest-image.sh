#!/usr/bin/env bash
# Build the Debian guest image the libvirt test hosts boot: a debootstrapped bookworm root file system with cloud-init
# and the QEMU guest agent, as a compressed qcow2 disk plus the kernel and initrd for direct kernel boot.
#
# The image lands in $CAPI_LIBVIRT_CACHE/images/<recipe-hash>/ (default cache ~/.cache/capi-libvirt), where the recipe
# hash is the start of the sha256 of this very file: any change to the recipe below builds a new image, an unchanged
# recipe only checks the cache. src/capi_libvirt/devenv/guest_image.py computes the same hash from this file.
# The build happens in a temporary folder beside the result and is renamed into place only once complete (with the
# marker file written last), so an interrupted build leaves nothing that looks finished. Prints the image folder.
set -euo pipefail

: "${CAPI_LIBVIRT_CACHE:=$HOME/.cache/capi-libvirt}"
: "${DEBIAN_MIRROR:=http://deb.debian.org/debian}"

suite=bookworm
# python3-cffi-backend must be named: cloud-init needs it, and minbase does not pull it in.
packages=systemd-sysv,udev,dbus,kmod,linux-image-cloud-amd64,initramfs-tools,cloud-init,python3-cffi-backend
packages+=,qemu-guest-agent,netbase,iproute2
disk_size=2G     # sparse; the qcow2 holds only used blocks, and cloud-init grows the fs when a volume is larger
marker=READY     # written last; guest_image.py looks for it

log() { printf '[build-guest-image] %s\n' "$*" >&2; }

script=$(readlink -f "${BASH_SOURCE[0]}")
recipe_hash=$(sha256sum "$script" | cut -c1-16)
images="$CAPI_LIBVIRT_CACHE/images"
out="$images/$recipe_hash"

if [ -f "$out/$marker" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$images"
# One builder at a time: a second caller waits, then finds the finished image.
exec 9>"$images/.build.lock"
flock 9
if [ -f "$out/$marker" ]; then
  echo "$out"
  exit 0
fi

# unmount_below DIR: debootstrap mounts /proc and /sys inside the root; an interrupted run may leave them mounted, and
# removing the folder must never walk into them.
unmount_below() {
  local dir=$1 target
  findmnt -rn -o TARGET | awk -v d="$dir/" 'index($0, d) == 1' | sort -r | while read -r target; do
    umount -l "$target" || true
  done
}

remove_build_dir() {
  local dir=$1
  unmount_below "$dir"
  rm -rf --one-file-system "$dir"
}

# Holding the lock, any leftover build folder is from a builder that was killed outright.
for stale in "$images"/.build-*; do
  if [ -d "$stale" ]; then
    log "removing stale build folder $stale"
    remove_build_dir "$stale"
  fi
done

# interruptible CMD...: run a long step as a job of its own process group (job control on for that one start) with
# its output in the build log, and wait for it. bash runs a trap only once a foreground command has ended; `wait`
# returns at once instead, so an interrupt ends the whole group (debootstrap's dpkg children included) before the
# build folder is removed.
step_pgid=
interruptible() {
  set -m
  "$@" >>"$build_log" 2>&1 &
  step_pgid=$!
  set +m
  local rc=0
  wait "$step_pgid" || rc=$?
  step_pgid=
  if [ "$rc" -ne 0 ]; then
    log "$1 failed ($rc); the end of its output:"
    tail -n 30 "$build_log" >&2
  fi
  return "$rc"
}

end_running_step() {
  [ -n "$step_pgid" ] || return 0
  kill -TERM -- "-$step_pgid" 2>/dev/null || true
  wait "$step_pgid" 2>/dev/null || true
  # Whatever of the group outlived its leader (a dpkg run by debootstrap) must not write into a folder being removed.
  kill -KILL -- "-$step_pgid" 2>/dev/null || true
}

work=$(mktemp -d "$images/.build-$recipe_hash.XXXXXX")
trap 'end_running_step; remove_build_dir "$work"' EXIT
trap 'log "interrupted; removing $work"; exit 130' INT TERM HUP
root="$work/root"
build_log="$work/build.log"

started=$SECONDS
log "debootstrap $suite into $root (a minute or two)"
interruptible debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$DEBIAN_MIRROR"
unmount_below "$root"

log "configuring the image"
echo '/dev/vda / ext4 defaults,errors=remount-ro 0 1' >"$root/etc/fstab"
# Empty machine-id: each guest gets its own on first boot.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
echo debian >"$root/etc/hostname"
# debootstrap copies the build machine's resolver; a guest must not inherit it.
rm -f "$root/etc/resolv.conf"

mkdir -p "$root/etc/systemd/network"
cat >"$root/etc/systemd/network/50-dhcp.network" <<'EOF'
[Match]
Name=en*

[Network]
DHCP=yes
EOF
chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1
# The guest agent is started by udev when its virtio port appears; enabling it as well does no harm where supported.
chroot "$root" systemctl enable qemu-guest-agent.service >/dev/null 2>&1 || true

cat >"$root/etc/cloud/cloud.cfg.d/90-capi-libvirt.cfg" <<'EOF'
# Only the NoCloud seed (a CD-ROM labelled cidata) is ever offered; do not probe clouds.
datasource_list: [NoCloud, None]
# minbase has no locales package: generating a locale would make cloud-init finish in error.
locale: false
EOF

# Keep the kernel and initrd beside the disk for direct kernel boot; /boot's copies are root-only.
kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n 1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -n 1)
install -m 0644 "$kernel" "$work/vmlinuz"
install -m 0644 "$initrd" "$work/initrd.img"

# Trim what a guest never needs to save space in the image.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log

log "making the file system and the qcow2 disk"
truncate -s "$disk_size" "$work/disk.raw"
interruptible mkfs.ext4 -q -L root -d "$root" "$work/disk.raw"
interruptible qemu-img convert -O qcow2 -c "$work/disk.raw" "$work/disk.qcow2"
rm -f "$work/disk.raw"
rm -rf --one-file-system "$root"
rm -f "$build_log"

printf 'recipe=%s\nsuite=%s\nbuilt=%s\nseconds=%s\n' "$recipe_hash" "$suite" "$(date -u +%FT%TZ)" \
  "$((SECONDS - started))" >"$work/$marker"
rm -rf "$out"   # an unfinished folder of this hash cannot exist (rename is atomic), but be sure
chmod 0755 "$work"
mv "$work" "$out"
trap - EXIT
log "ready in $((SECONDS - started)) s: $out"
echo "$out"
