#!/usr/bin/env bash
# Build the upstream Go programs the test bed runs (etcd, kube-apiserver, clusterctl) from the Go module proxy and
# fetch the Cluster API module whose CRDs the test API server installs. Everything is cached by version under
# $CAPI_LIBVIRT_CACHE (default ~/.cache/capi-libvirt), outside the work tree; a second run only checks the cache.
set -euo pipefail

: "${KUBERNETES_VERSION:=v1.35.4}"
: "${ETCD_VERSION:=v3.6.16}"
: "${CLUSTER_API_VERSION:=v1.12.8}"
: "${CAPI_LIBVIRT_CACHE:=$HOME/.cache/capi-libvirt}"

bin="$CAPI_LIBVIRT_CACHE/bin"
mkdir -p "$bin"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false" CGO_ENABLED=0

log() { printf '[build-upstream] %s\n' "$*" >&2; }

# go_build_in_scratch MODULE VERSION PACKAGE OUTPUT LDFLAGS [REPLACES...]: a throw-away module requiring MODULE@VERSION
# builds PACKAGE; this is how modules whose own go.mod has replace directives (etcd, kubernetes) are built.
go_build_in_scratch() {
  local module=$1 version=$2 package=$3 output=$4 ldflags=$5; shift 5
  local scratch; scratch=$(mktemp -d)
  (
    cd "$scratch"
    go mod init capi-libvirt.local/build >/dev/null 2>&1
    for r in "$@"; do echo "replace $r" >> go.mod; done
    go mod edit -require="$module@$version"
    go mod tidy >/dev/null 2>&1 || true
    go get "$package@$version" >/dev/null
    go build -trimpath -ldflags "-s -w $ldflags" -o "$output.tmp" "$package"
    mv "$output.tmp" "$output"
  )
  rm -rf "$scratch"
}

# go_install PACKAGE VERSION OUTPUT LDFLAGS: `go install PACKAGE@VERSION` into a throw-away GOBIN; for modules whose
# go.mod has no replace directives (cluster-api).
go_install() {
  local package=$1 version=$2 output=$3 ldflags=$4
  local gobin; gobin=$(mktemp -d)
  GOBIN="$gobin" go install -trimpath -ldflags "-s -w $ldflags" "$package@$version"
  mv "$gobin/${package##*/}" "$output"
  rm -rf "$gobin"
}

etcd="$bin/etcd-$ETCD_VERSION"
if [ ! -x "$etcd" ]; then
  log "building etcd $ETCD_VERSION (a few minutes on 2 cores, once)"
  go_build_in_scratch go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3 "$etcd" ""
fi

apiserver="$bin/kube-apiserver-$KUBERNETES_VERSION"
if [ ! -x "$apiserver" ]; then
  log "building kube-apiserver $KUBERNETES_VERSION (10-20 minutes on 2 cores, once)"
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  staging_version="v0.${KUBERNETES_VERSION#v1.}"
  mapfile -t replaces < <(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1" => "$1" '"$staging_version"'"}' "$gomod")
  [ "${#replaces[@]}" -gt 0 ] || { log "no staging replaces found in $gomod"; exit 1; }
  # The version stamp: clients (clusterctl among them) check the server's version.
  minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  version_flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    version_flags+=" -X $pkg.gitTreeState=clean"
  done
  go_build_in_scratch k8s.io/kubernetes "$KUBERNETES_VERSION" k8s.io/kubernetes/cmd/kube-apiserver "$apiserver" \
    "$version_flags" "${replaces[@]}"
fi

clusterctl="$bin/clusterctl-$CLUSTER_API_VERSION"
if [ ! -x "$clusterctl" ]; then
  log "building clusterctl $CLUSTER_API_VERSION (a few minutes on 2 cores, once)"
  # The version stamp: clusterctl compares its own version with the providers' contracts and prints it.
  capi_minor=${CLUSTER_API_VERSION#v1.}; capi_minor=${capi_minor%%.*}
  pkg=sigs.k8s.io/cluster-api/version
  go_install sigs.k8s.io/cluster-api/cmd/clusterctl "$CLUSTER_API_VERSION" "$clusterctl" \
    "-X $pkg.gitVersion=$CLUSTER_API_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$capi_minor -X $pkg.gitTreeState=clean"
fi

capi_dir=$(go mod download -json "sigs.k8s.io/cluster-api@$CLUSTER_API_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
ln -sfn "$capi_dir" "$CAPI_LIBVIRT_CACHE/cluster-api-$CLUSTER_API_VERSION"
ln -sfn "$etcd" "$bin/etcd"
ln -sfn "$apiserver" "$bin/kube-apiserver"
ln -sfn "$clusterctl" "$bin/clusterctl"
log "ready: $etcd $apiserver $clusterctl $CAPI_LIBVIRT_CACHE/cluster-api-$CLUSTER_API_VERSION"
