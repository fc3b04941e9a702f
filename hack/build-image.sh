#!/usr/bin/env bash
# Build the operator image from the Dockerfile with buildah (daemonless; no Docker engine needed), tagged with the image
# that config/manager/manager.yaml deploys, and print its reference and size.
#
#   hack/build-image.sh [BUILDAH BUILD ARGS...]        e.g. --no-cache
#
# The base image comes from hack/make-base-image.sh: the real one when containers-storage already has it, else a local
# stand-in of the same name (no container registry is reachable here). Nothing is pulled (--pull=never).
# Every build step uses the host's network (--network host): podman's default bridge network is a private range.
# Layers are cached (--layers): a rebuild with unchanged sources takes seconds.
# Needs root, buildah, podman and runc (see the package list in hack/install-system-deps.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

log() { printf '[build-image] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

for tool in buildah podman runc; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install buildah podman runc)"
done
manifest="$repo/config/manager/manager.yaml"
image=$(sed -n 's/^[[:space:]]*image:[[:space:]]*\([^[:space:]]*\).*$/\1/p' "$manifest" | head -n1)
[ -n "$image" ] || die "no image: in $manifest"

base=$("$here/make-base-image.sh")

# runc, not crun: crun (1.8, Debian 12) refuses hosts whose cgroups are hybrid (v1 controllers plus a cgroup2 with a
# controller left in it), as this test bed's are. Resource limits: the runtime sets RLIMIT_NOFILE and RLIMIT_NPROC in
# the container, and without CAP_SYS_RESOURCE (this test bed) it cannot raise them past what it has, which podman caps
# to pid_max for processes. So ask for exactly that; on an ordinary host the same values are harmless.
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max)
if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; then nproc=$pid_max; fi
nofile=$(ulimit -Hn)
run_flags=(--runtime runc --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")

log "building $image from $base"
started=$SECONDS
buildah build \
  --network host \
  --pull=never \
  --layers \
  "${run_flags[@]}" \
  --build-arg "PYTHON_IMAGE=$base" \
  --file "$repo/Dockerfile" \
  --tag "$image" \
  "$@" \
  "$repo" >&2
log "built in $((SECONDS - started)) s; run it with:"
log "  podman ${run_flags[*]:0:2} run --rm --network host ${run_flags[*]:2} $image --help"

size=$(podman image inspect --format '{{.Size}}' "$image")
echo "$image $(numfmt --to=si --suffix=B "$size")"
