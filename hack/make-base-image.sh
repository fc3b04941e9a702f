#!/usr/bin/env bash
# Make a local stand-in for the operator image's base image (the Dockerfile's PYTHON_IMAGE,
# python:3.11.14-slim-bookworm) and import it into containers-storage under that exact name, so that
# hack/build-image.sh can build the unchanged Dockerfile with buildah on a machine that reaches no container registry
# (only Debian's packages and PyPI).
#
#   hack/make-base-image.sh [IMAGE]      (default: the Dockerfile's ARG PYTHON_IMAGE, as docker.io/library/...)
#
# A release builds from the real image; this one is for the test bed only. It is what the real one is, as far as the
# Dockerfile can tell: Debian 12 (bookworm, its slim variant's dpkg excludes and apt settings), apt sources for
# bookworm, -updates and -security, ca-certificates, netbase and tzdata, Python's C headers, and /usr/local a Python
# 3.11 environment (a venv of Debian's python3.11, so `python`, `python3` and `pip` are /usr/local/bin's, PEP 668 does
# not apply, and `pip install --prefix=/install` puts packages and console scripts where `COPY /install /usr/local`
# makes them work). It differs in what the Dockerfile does not see: Debian's Python 3.11.2 rather than a source-built
# 3.11.14, and what it takes from this host so that apt-get and pip work inside the build as they do on the host: its
# apt settings (/etc/apt/apt.conf.d/99artifact-registry, any apt proxy) and the certificate authorities it adds to
# Debian's (/usr/local/share/ca-certificates: an egress proxy's), with an /etc/pip.conf pointing pip at the system's
# bundle. The image carries the label io.capi-libvirt.stand-in=<recipe hash>.
#
# Cached: the root file system is made once per recipe (the sha256 of this file, hack/debian-root.sh, the image name
# and what it takes from this host), from hack/debian-root.sh's cached bookworm minbase root, into
# $CAPI_LIBVIRT_CACHE/image/base-<hash>/rootfs.tar (default cache ~/.cache/capi-libvirt);
# an image already in containers-storage with the current recipe's label returns at once, and a fresh
# containers-storage re-imports the tarball in about a second. An image of that name without the label (a real one,
# pulled) is left alone. The build happens in a temporary folder renamed into place once complete, so an interrupted
# build leaves nothing that looks finished. Needs root (chroot) and podman. Prints the image name.
set -euo pipefail

: "${CAPI_LIBVIRT_CACHE:=$HOME/.cache/capi-libvirt}"
: "${DEBIAN_MIRROR:=http://deb.debian.org/debian}"
: "${DEBIAN_SECURITY_MIRROR:=http://deb.debian.org/debian-security}"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script="$here/$(basename "${BASH_SOURCE[0]}")"
repo=$(dirname "$here")
debian_root="$here/debian-root.sh"
label=io.capi-libvirt.stand-in

log() { printf '[make-base-image] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if [ $# -ge 1 ]; then
  image=$1
else
  image=$(sed -n 's/^ARG PYTHON_IMAGE=\(.*\)$/\1/p' "$repo/Dockerfile" | head -n1)
  [ -n "$image" ] || die "no ARG PYTHON_IMAGE=... in $repo/Dockerfile"
fi
# The fully qualified name (as registries.conf's alias "python" = docker.io/library/python resolves the short one).
case "$image" in
  */*/*) ;;
  */*) image="docker.io/$image" ;;
  *) image="docker.io/library/$image" ;;
esac
command -v podman >/dev/null || die "podman is missing (hack/install-system-deps.sh, or apt-get install podman buildah)"

# The recipe: this file, the root's, the image name, and what it takes from this host (mirrors, apt settings, local
# CAs).
recipe=$({
  cat "$script" "$debian_root"
  printf 'image=%s\nmirror=%s\nsecurity=%s\n' "$image" "$DEBIAN_MIRROR" "$DEBIAN_SECURITY_MIRROR"
  cat /etc/apt/apt.conf.d/99artifact-registry 2>/dev/null || true
  apt-config dump | grep -E '^Acquire::(https?|ftp)::Proxy' || true
  find /usr/local/share/ca-certificates -type f -exec cat {} + 2>/dev/null || true
} | sha256sum | cut -c1-16)
out="$CAPI_LIBVIRT_CACHE/image/base-$recipe"
tarball="$out/rootfs.tar"

old=
if podman image exists "$image"; then
  old=$(podman image inspect --format '{{.Id}}' "$image")
  have=$(podman image inspect --format "{{index .Labels \"$label\"}}" "$image")
  if [ "$have" = "$recipe" ]; then
    echo "$image"
    exit 0
  fi
  case "$have" in
    ""|"<no value>") log "$image is already in containers-storage and is no stand-in: using it as it is"
                     echo "$image"; exit 0 ;;
  esac
  log "$image is a stand-in of another recipe ($have): replacing it"
fi

if [ ! -f "$out/READY" ]; then
  [ "$(id -u)" -eq 0 ] || die "building the base image needs root (chroot)"
  mkdir -p "$CAPI_LIBVIRT_CACHE/image"
  tmp=$(mktemp -d "$CAPI_LIBVIRT_CACHE/image/.base-$recipe.XXXXXX")
  # Mounts (hack/debian-root.sh's /proc and /sys, ours) live in private mount namespaces (unshare -m) and vanish with them, so
  # removing the folder from here never reaches into a mounted /proc.
  trap 'rm -rf "$tmp"' EXIT
  root="$tmp/rootfs"
  started=$SECONDS

  log "the Debian minbase root into $root"
  "$debian_root" --into "$root"
  suite=$(sed -n 's/^VERSION_CODENAME=//p' "$root/etc/os-release")

  # The official image's apt sources (deb822, with -updates and -security), on this host's mirror.
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $DEBIAN_MIRROR
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $DEBIAN_SECURITY_MIRROR
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # This host's apt configuration (a mirror's validity settings, a proxy) so apt-get works inside the build.
  if [ -f /etc/apt/apt.conf.d/99artifact-registry ]; then
    cp /etc/apt/apt.conf.d/99artifact-registry "$root/etc/apt/apt.conf.d/"
  fi
  apt-config dump | grep -E '^Acquire::(https?|ftp)::Proxy' >"$root/etc/apt/apt.conf.d/98host-proxy" || true
  [ -s "$root/etc/apt/apt.conf.d/98host-proxy" ] || rm -f "$root/etc/apt/apt.conf.d/98host-proxy"
  # The slim variant, as debuerreotype makes debian:bookworm-slim: no documentation, manual pages or translations.
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
  # ... and its apt and dpkg settings for images: no package caches left in a layer, compressed indexes, no
  # translations, no fsync.
  echo 'force-unsafe-io' >"$root/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
  clean='rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true'
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<EOF
DPkg::Post-Invoke { "$clean"; };
APT::Update::Post-Invoke { "$clean"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::GzipIndexes "true";' >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
  echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"

  in_root() {
    # shellcheck disable=SC2016
    unshare --mount --propagation private sh -c 'mount -t proc proc "$1/proc" && shift && exec chroot "$@"' \
      sh "$root" "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
      LANG=C.UTF-8 "$@"
  }
  log "installing Python 3.11 and making /usr/local its environment"
  {
    in_root apt-get update -qq
    in_root apt-get dist-upgrade -y -qq
    in_root apt-get install -y -qq --no-install-recommends ca-certificates netbase tzdata python3.11 python3-venv
  } >"$tmp/apt.log" 2>&1 || { tail -n 30 "$tmp/apt.log" >&2; die "apt-get in the root file system failed"; }
  # The official image has Python's headers (C extensions such as libvirt-python compile against them), outside
  # dpkg's knowledge. Their package would pull in libc6-dev, zlib1g-dev and a static libpython: take the headers only.
  # shellcheck disable=SC2016
  in_root sh -c 'cd /tmp && apt-get download -qq libpython3.11-dev && dpkg-deb --fsys-tarfile libpython3.11-dev_*.deb \
    | tar -x -C / ./usr/include && rm libpython3.11-dev_*.deb' >>"$tmp/apt.log" 2>&1 \
    || { tail -n 30 "$tmp/apt.log" >&2; die "could not add Python's headers"; }

  # The certificate authorities this host adds to Debian's (update-ca-certificates' local folder: an egress proxy's),
  # for pip and apt over https.
  if [ -n "$(ls -A /usr/local/share/ca-certificates 2>/dev/null)" ]; then
    log "adding this host's local certificate authorities: $(cd /usr/local/share/ca-certificates && echo *)"
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
    in_root update-ca-certificates >>"$tmp/apt.log" 2>&1
  fi
  # pip's own bundle (certifi) lacks them: point it at the system's, as this host does.
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"

  # /usr/local as the official image has it: python, python3, pip in /usr/local/bin, packages in
  # /usr/local/lib/python3.11/site-packages.
  in_root python3.11 -m venv /usr/local >>"$tmp/apt.log" 2>&1 || { tail -n 30 "$tmp/apt.log" >&2; die "venv failed"; }
  in_root /usr/local/bin/python -c 'import sys, ssl; assert sys.prefix == "/usr/local", sys.prefix'
  [ -f "$root/usr/include/python3.11/Python.h" ] || die "no Python.h in the root file system"
  rm -f "$root"/usr/local/bin/activate* "$root/usr/local/bin/Activate.ps1"   # a venv's, not the official image's

  # As the official image leaves it: no apt lists or caches, no host identity, no dpkg-excluded files.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  rm -f "$root"/var/log/*.log "$root"/var/log/apt/*
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/groff/* "$root"/usr/share/lintian/*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  : >"$root/etc/resolv.conf"
  : >"$root/etc/hostname"
  chmod 644 "$root/etc/resolv.conf" "$root/etc/hostname"
  rm -rf "${root:?}"/dev/* "${root:?}"/tmp/* "${root:?}"/run/*

  sed -n 's/^version *= *//p' "$root/usr/local/pyvenv.cfg" >"$tmp/python-version"
  tar --numeric-owner -C "$root" -cf "$tmp/rootfs.tar" .
  rm -rf "$root"
  touch "$tmp/READY"
  rm -rf "$out"
  mv "$tmp" "$out"
  trap - EXIT
  # Earlier recipes' root file systems are of no more use.
  find "$CAPI_LIBVIRT_CACHE/image" -mindepth 1 -maxdepth 1 -name 'base-*' ! -name "base-$recipe" -exec rm -rf {} +
  log "root file system ready in $((SECONDS - started)) s: $tarball ($(du -h "$tarball" | cut -f1))"
fi

log "importing $tarball as $image"
python_version=$(cat "$out/python-version")
podman import -q \
  --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "ENV PYTHON_VERSION=$python_version" \
  --change "LABEL $label=$recipe" \
  --change 'CMD ["python3"]' \
  --message "stand-in for $image, made by hack/make-base-image.sh" \
  "$tarball" "$image" >/dev/null
# The stand-in this one replaces, unless images built from it still need it.
[ -z "$old" ] || podman rmi "$old" >/dev/null 2>&1 || true
echo "$image"
