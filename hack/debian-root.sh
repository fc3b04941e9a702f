#!/usr/bin/env bash
# The Debian 12 (bookworm) root file system the bookworm images start from (the minimal and node guest images and the
# operator image's base stand-in), debootstrapped once rather than once per image:
#
#   hack/debian-root.sh [PACKAGES]                       build the root if missing; print its tarball
#   hack/debian-root.sh --into DIR [PACKAGES [MORE]]     ... and extract it into DIR (a new folder), ready for apt
#
# The root is bookworm's minbase; with PACKAGES (comma-separated) it is that minbase root plus PACKAGES, installed by
# apt without Recommends, and cached as well, so images sharing a package set share its root (the minimal and node
# images: the guest packages). MORE (comma-separated) is installed on top into DIR only, not cached (the node image's
# own packages). Installed packages never start a service (policy-rc.d), and the root's apt sources are bookworm's
# on $DEBIAN_MIRROR, as debootstrap writes them.
#
# Each root is a tarball, $CAPI_LIBVIRT_CACHE/roots/bookworm-<recipe hash>/root.tar (default cache
# ~/.cache/capi-libvirt), the hash being the start of the sha256 of this file, the mirror and PACKAGES; an unchanged
# recipe only checks the cache. The images' own recipe hashes cover this file too, so a change here makes new images.
# The tarball holds nothing of this host and no apt caches: no resolv.conf or hostname (`--into` copies this host's,
# as debootstrap does, for apt to work in DIR; each image then sets its own), no package lists (run apt-get update
# before installing), no downloaded packages. Each root is built in a temporary folder beside it, under a lock of its
# own, and renamed into place with its READY marker, so an interrupted build leaves nothing that looks finished (the
# next build removes what it left). Needs root (debootstrap, chroot).
set -euo pipefail

: "${CAPI_LIBVIRT_CACHE:=$HOME/.cache/capi-libvirt}"
: "${DEBIAN_MIRROR:=http://deb.debian.org/debian}"

suite=bookworm
roots="$CAPI_LIBVIRT_CACHE/roots"
script=$(readlink -f "${BASH_SOURCE[0]}")

log() { printf '[debian-root] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
usage() { echo "usage: $0 [--into DIR] [PACKAGES [MORE]]" >&2; exit 2; }

into=
if [ "${1:-}" = --into ]; then
  [ $# -ge 2 ] || usage
  into=$2
  shift 2
fi
if [ $# -gt 2 ] || { [ -z "$into" ] && [ $# -eq 2 ]; }; then usage; fi
packages=${1:-}
more=${2:-}

# in_root ROOT COMMAND...: COMMAND chrooted into ROOT with /proc and /sys mounted (as debootstrap mounts them for the
# packages' scripts) in a mount namespace of its own: they go when it ends, so removing ROOT never reaches into them.
in_root() {
  local root=$1
  shift
  # shellcheck disable=SC2016
  unshare --mount --propagation private sh -c \
    'mount -t proc proc "$1/proc" && mount -t sysfs sysfs "$1/sys" && shift && exec chroot "$@"' \
    sh "$root" "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 "$@"
}

# install_packages ROOT PACKAGES: apt-get install them (comma-separated) without Recommends, from fresh package lists,
# the root's packages first brought to the mirror's versions (as a fresh debootstrap would have them).
install_packages() {
  local root=$1
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  in_root "$root" apt-get update -q
  in_root "$root" apt-get dist-upgrade -y -q
  # shellcheck disable=SC2046  # one word per package
  in_root "$root" apt-get install -y -q --no-install-recommends $(tr , ' ' <<<"$2")
  rm -f "$root/usr/sbin/policy-rc.d"
}

# unpack TARBALL DIR: the root in DIR (made here), with this host's resolver and host name as debootstrap copies them.
unpack() {
  mkdir "$2"
  chmod 0755 "$2"
  tar --numeric-owner -C "$2" -xf "$1"
  local file
  for file in /etc/resolv.conf /etc/hostname; do
    if [ -f "$file" ]; then cp "$file" "$2$file"; fi
  done
}

# ensure_root PACKAGES: the tarball of the root with PACKAGES (none: the minbase root), built if missing; prints it.
ensure_root() {
  local set=$1 recipe out base work
  recipe=$({ cat "$script"; printf 'suite=%s\nmirror=%s\npackages=%s\n' "$suite" "$DEBIAN_MIRROR" "$set"; } \
    | sha256sum | cut -c1-16)
  out="$roots/$suite-$recipe"
  if [ -f "$out/READY" ]; then
    echo "$out/root.tar"
    return
  fi
  [ "$(id -u)" -eq 0 ] || die "building a root file system needs root (debootstrap, chroot)"
  [ -z "$set" ] || base=$(ensure_root "")
  mkdir -p "$roots"
  # One builder per root at a time; a second caller waits, then finds it built.
  exec {lock}>"$roots/.build-$suite-$recipe.lock"
  flock "$lock"
  if [ ! -f "$out/READY" ]; then
    local stale
    for stale in "$roots/.build-$suite-$recipe".*; do
      if [ -d "$stale" ]; then
        log "removing stale build folder $stale"
        rm -rf --one-file-system "$stale"
      fi
    done
    work=$(mktemp -d "$roots/.build-$suite-$recipe.XXXXXX")
    # shellcheck disable=SC2064  # this build's folder, now
    trap "rm -rf --one-file-system '$work'" EXIT
    local started=$SECONDS
    if [ -z "$set" ]; then
      command -v debootstrap >/dev/null || die "debootstrap is missing (hack/install-system-deps.sh installs it)"
      log "debootstrap $suite (minbase) into $work/root (a minute or two)"
      unshare --mount --propagation private \
        debootstrap --variant=minbase "$suite" "$work/root" "$DEBIAN_MIRROR" >"$work/build.log" 2>&1 \
        || { tail -n 30 "$work/build.log" >&2; die "debootstrap failed"; }
    else
      log "installing $set into the $suite minbase root"
      unpack "$base" "$work/root"
      install_packages "$work/root" "$set" >"$work/build.log" 2>&1 \
        || { tail -n 30 "$work/build.log" >&2; die "apt-get in the root file system failed"; }
    fi
    rm -f "$work/root/etc/resolv.conf" "$work/root/etc/hostname"
    rm -rf "$work/root"/var/lib/apt/lists/* "$work/root"/var/cache/apt/*.bin "$work/root"/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$work/root" -cf "$work/root.tar" .
    rm -rf --one-file-system "$work/root" "$work/build.log"
    printf 'suite=%s\npackages=%s\nbuilt=%s\nseconds=%s\n' "$suite" "$set" "$(date -u +%FT%TZ)" \
      "$((SECONDS - started))" >"$work/READY"
    chmod 0755 "$work"
    rm -rf "$out"   # an unfinished folder of this hash cannot exist (rename is atomic), but be sure
    mv "$work" "$out"
    trap - EXIT
    log "root ready in $((SECONDS - started)) s: $out/root.tar ($(du -h "$out/root.tar" | cut -f1))"
  fi
  exec {lock}>&-
  echo "$out/root.tar"
}

tarball=$(ensure_root "$packages")
if [ -z "$into" ]; then
  echo "$tarball"
  exit 0
fi
unpack "$tarball" "$into"
if [ -n "$more" ]; then
  log "installing $more into $into"
  install_packages "$into" "$more"
fi
