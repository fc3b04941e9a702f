#!/usr/bin/env bash
# Build the upstream Go programs the test bed runs (etcd, kube-apiserver, kubelet, kubeadm, the Cluster API managers,
# clusterctl, ...) from the Go module proxy and fetch the modules whose files the test bed reads (Cluster API's CRDs).
# Everything is cached by version under $CAPI_LIBVIRT_CACHE (default ~/.cache/capi-libvirt), outside the work tree; a
# second run only checks the cache.
#
#   hack/build-upstream.sh [control-plane|kubernetes|rest|operator|all]      (default: all)
#
# `control-plane` is what `make run` and `make demo` need: etcd, kube-apiserver, kubeadm (its phases make the API
# server's certificates) and Cluster API's module (its CRDs). `kubernetes` builds what the node image needs first
# (kubelet and kubeadm, with the other Kubernetes commands in the same `go build`, then etcd, CoreDNS, flannel and
# agnhost), while `rest` builds the others (kustomize, Cluster API, cluster-autoscaler, cert-manager, helm) and
# `operator` the Cluster API Operator, beside it. Programs of one module
# are built by one `go build` (they share its compilation and link side by side). Each build prints one line when it
# starts and one when it ends; its output (`go: downloading ...`) goes to out/logs/build-<name>.log, whose end is
# printed if it fails. Each build's seconds and CPU seconds land in out/timing/setup.tsv (hack/timed.sh,
# tests/timing_report.py).
set -euo pipefail

group=${1:-all}
case "$group" in control-plane|kubernetes|rest|operator|all) ;; *) echo "usage: $0 [control-plane|kubernetes|rest|operator|all]" >&2; exit 2 ;; esac

: "${KUBERNETES_VERSION:=v1.35.4}"
# The control-plane images of the node image carry what kubeadm $KUBERNETES_VERSION asks for (`kubeadm config images
# list`): its etcd (constants.SupportedEtcdVersion, image tag 3.6.6-0) and CoreDNS (constants.CoreDNSVersion). The test
# bed's own etcd is the same build.
: "${ETCD_VERSION:=v3.6.6}"
: "${COREDNS_VERSION:=v1.13.1}"
: "${CLUSTER_API_VERSION:=v1.12.8}"
: "${KUSTOMIZE_VERSION:=v5.8.1}"
: "${CLUSTER_AUTOSCALER_VERSION:=v0.0.0-20250613073258-1959f5f61f6c}"
# cert-manager: the version clusterctl $CLUSTER_API_VERSION installs by default (its CertManagerDefaultVersion); it is
# pinned by hack/cert-manager/go.mod, which this must name. helm: the version cert-manager's release pins to render it.
: "${CERT_MANAGER_VERSION:=v1.20.2}"
: "${HELM_VERSION:=v4.1.1}"
# The Cluster API Operator, to install the provider as its InfrastructureProvider (tests/e2e/test_capi_operator.py).
: "${CLUSTER_API_OPERATOR_VERSION:=v0.29.0}"
: "${CAPI_LIBVIRT_CACHE:=$HOME/.cache/capi-libvirt}"

bin="$CAPI_LIBVIRT_CACHE/bin"
mkdir -p "$bin"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false" CGO_ENABLED=0
# The Go toolchain's own garbage collector runs a quarter as often (GOGC=400; the compiler allocates heavily): building
# client-go v0.35.8 from an empty build cache, two pairs on 2026-12-06, took 147 and 165 CPU s instead of 170 and 195
# (13-15 % less), its largest process 660 MB instead of 570. The build cache's keys do not include GOGC.
export GOGC="${CAPI_LIBVIRT_BUILD_GOGC:-400}"

log() { printf '[build-upstream] %s\n' "$*" >&2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
logs="$repo/out/logs"
timing="${CAPI_LIBVIRT_TIMING_DIR:-$repo/out/timing}"
mkdir -p "$logs" "$timing"
source "$repo/hack/children-cpu.sh"

# build NAME WHAT CMD...: run one build quietly (its output in out/logs/build-NAME.log), say when it starts and ends,
# record its seconds and CPU seconds as upstream/NAME in setup.tsv, and show the end of its log if it fails.
build() {
  local name=$1 what=$2; shift 2
  local output="$logs/build-$name.log" started=$SECONDS rc=0 cpu_before cpu
  children_cpu_ticks cpu_before
  log "$name: building $what"
  # A subshell in the foreground: `set -e` holds inside it (it would not in a command tested with ||), and Ctrl-C
  # reaches the build (a background job of a script ignores SIGINT).
  set +e
  ( set -e; "$@" ) >"$output" 2>&1
  rc=$?
  set -e
  cpu_seconds_since "$cpu_before" cpu
  if [ "$rc" -ne 0 ]; then
    log "$name: FAILED ($rc) after $((SECONDS - started)) s; the end of $output:"
    tail -n 40 "$output" >&2
    printf 'upstream/%s\t%s\tfailed\t%s\n' "$name" "$((SECONDS - started))" "$cpu" >>"$timing/setup.tsv"
    exit "$rc"
  fi
  log "$name: built in $((SECONDS - started)) s ($cpu s of CPU)"
  printf 'upstream/%s\t%s\tbuilt\t%s\n' "$name" "$((SECONDS - started))" "$cpu" >>"$timing/setup.tsv"
}

# go_build_in_scratch MODULE VERSION LDFLAGS OUTDIR PACKAGES... [-- REPLACES...]: a throw-away module requiring
# MODULE@VERSION builds the PACKAGES (one `go build`) into OUTDIR, each named after its last path element; this is how
# modules whose own go.mod has replace directives (etcd, kubernetes) are built.
go_build_in_scratch() {
  local module=$1 version=$2 ldflags=$3 outdir=$4; shift 4
  local packages=() replaces=()
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do packages+=("$1"); shift; done
  [ "$#" -gt 0 ] && shift
  replaces=("$@")
  local scratch; scratch=$(mktemp -d)
  (
    cd "$scratch"
    go mod init capi-libvirt.local/build
    for r in "${replaces[@]}"; do echo "replace $r" >> go.mod; done
    go mod edit -require="$module@$version"
    go mod tidy || true
    for package in "${packages[@]}"; do go get "$package@$version"; done
    go build -trimpath -ldflags "-s -w $ldflags" -o "$outdir/" "${packages[@]}"
  )
  rm -rf "$scratch"
}

# module_field MODULE@VERSION FIELD: a field of `go mod download -json` (Dir: the unpacked source; GoMod: its go.mod).
module_field() {
  go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

# go_install VERSION LDFLAGS OUTDIR PACKAGES...: `go install PACKAGE@VERSION...` (one build, packages of one module) into
# OUTDIR, each named after its package (minus a /vN suffix); for modules whose go.mod has no replace directives.
go_install() {
  local version=$1 ldflags=$2 outdir=$3; shift 3
  local package targets=()
  for package in "$@"; do targets+=("$package@$version"); done
  GOBIN="$outdir" go install -trimpath -ldflags "-s -w $ldflags" "${targets[@]}"
}

# install_from OUTDIR NAME OUTPUT: move the program NAME that a build left in OUTDIR to its cached name OUTPUT.
install_from() { mv "$1/$2" "$3"; }

# The Kubernetes commands, one `go build` of k8s.io/kubernetes at $KUBERNETES_VERSION in a scratch module that copies
# the k8s.io staging replaces of kubernetes' go.mod, with the version stamp (clients, clusterctl among them, check the
# server's version). kube-apiserver, kube-scheduler and kube-controller-manager run the test API server and the
# workload side of the e2e; kubelet and kubeadm go into the node image (the same version as the test API server), and
# kubeadm's `init phase` commands prepare the test API server for joining nodes as `kubeadm init` would.
# kube-proxy runs only in the node image's control-plane images (the kube-proxy DaemonSet of `kubeadm init`).
kube_commands=(kube-apiserver kube-scheduler kube-controller-manager kube-proxy kubelet kubeadm)
kubernetes_staging_replaces() {  # one line per k8s.io staging module: its replace by the released v0.x module
  local gomod; gomod=$(module_field "k8s.io/kubernetes@$KUBERNETES_VERSION" GoMod)
  local staging_version="v0.${KUBERNETES_VERSION#v1.}"
  awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1" => "$1" '"$staging_version"'"}' "$gomod"
}
build_kubernetes_commands() {
  local replaces; mapfile -t replaces < <(kubernetes_staging_replaces)
  [ "${#replaces[@]}" -gt 0 ] || { echo "no staging replaces found in k8s.io/kubernetes@$KUBERNETES_VERSION"; exit 1; }
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local version_flags="" pkg command packages=()
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    version_flags+=" -X $pkg.gitTreeState=clean"
  done
  for command in "$@"; do packages+=("k8s.io/kubernetes/cmd/$command"); done
  local out; out=$(mktemp -d)
  go_build_in_scratch k8s.io/kubernetes "$KUBERNETES_VERSION" "$version_flags" "$out" "${packages[@]}" -- "${replaces[@]}"
  for command in "$@"; do install_from "$out" "$command" "$bin/$command-$KUBERNETES_VERSION"; done
  rm -rf "$out"
}

build_kubernetes_group() {  # build_kubernetes_group [COMMANDS...]: those of kube_commands missing (default: all)
  local command missing=()
  [ "$#" -gt 0 ] || set -- "${kube_commands[@]}"
  for command in "$@"; do
    [ -x "$bin/$command-$KUBERNETES_VERSION" ] || missing+=("$command")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    build kubernetes "${missing[*]} $KUBERNETES_VERSION (one go build; 10-20 minutes on 2 cores, once)" \
      build_kubernetes_commands "${missing[@]}"
  fi
  [ ! -x "$bin/kube-apiserver-$KUBERNETES_VERSION" ] || ln -sfn "$bin/kube-apiserver-$KUBERNETES_VERSION" "$bin/kube-apiserver"
  # The node image compiles the sandbox ("pause") program from the Kubernetes module's build/pause/linux/pause.c.
  ln -sfn "$(module_field "k8s.io/kubernetes@$KUBERNETES_VERSION" Dir)" "$CAPI_LIBVIRT_CACHE/kubernetes-$KUBERNETES_VERSION"
}

# cluster_api_version_stamp: the -X flags that stamp $CLUSTER_API_VERSION into a Cluster API program (clusterctl
# compares its own version with the providers' contracts; the managers log it at start, "Version: v1.12.8").
cluster_api_version_stamp() {
  local minor=${CLUSTER_API_VERSION#v1.} pkg=sigs.k8s.io/cluster-api/version
  minor=${minor%%.*}
  echo "-X $pkg.gitVersion=$CLUSTER_API_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
}

# Cluster API's programs, one `go install` of its module (its go.mod has no replace directives): the core manager (the
# module's root main.go), clusterctl, the kubeadm bootstrap provider (CABPK, bootstrap/kubeadm/main.go) and the kubeadm
# control-plane provider (KCP, controlplane/kubeadm/main.go).
capi_manager="$bin/cluster-api-manager-$CLUSTER_API_VERSION"
clusterctl="$bin/clusterctl-$CLUSTER_API_VERSION"
cabpk="$bin/cluster-api-kubeadm-bootstrap-manager-$CLUSTER_API_VERSION"
kcp="$bin/cluster-api-kubeadm-control-plane-manager-$CLUSTER_API_VERSION"
build_cluster_api() {
  local out; out=$(mktemp -d)
  # bootstrap/kubeadm and controlplane/kubeadm are both named kubeadm: two GOBINs.
  go_install "$CLUSTER_API_VERSION" "$(cluster_api_version_stamp)" "$out" \
    sigs.k8s.io/cluster-api sigs.k8s.io/cluster-api/cmd/clusterctl sigs.k8s.io/cluster-api/bootstrap/kubeadm
  install_from "$out" cluster-api "$capi_manager"
  install_from "$out" clusterctl "$clusterctl"
  install_from "$out" kubeadm "$cabpk"
  go_install "$CLUSTER_API_VERSION" "$(cluster_api_version_stamp)" "$out" sigs.k8s.io/cluster-api/controlplane/kubeadm
  install_from "$out" kubeadm "$kcp"
  rm -rf "$out"
}

build_single() {  # build_single OUTPUT BUILDER ARGS...: a builder that leaves one program in a folder of its own
  local output=$1 out; shift
  out=$(mktemp -d)
  "$@" "$out"
  mv "$out"/* "$output"
  rm -rf "$out"
}
etcd_build() { go_build_in_scratch go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "" "$1" go.etcd.io/etcd/server/v3; }
coredns_build() { go_install "$COREDNS_VERSION" "" "$1" github.com/coredns/coredns; }
kustomize_build() { go_install "$KUSTOMIZE_VERSION" "" "$1" sigs.k8s.io/kustomize/kustomize/v5; }
operator_build() { go_install "$CLUSTER_API_OPERATOR_VERSION" "" "$1" sigs.k8s.io/cluster-api-operator/cmd; }

build_etcd() {
  local etcd="$bin/etcd-$ETCD_VERSION"
  [ -x "$etcd" ] || build etcd "etcd $ETCD_VERSION (a minute or two on 2 cores, once)" build_single "$etcd" etcd_build
  ln -sfn "$etcd" "$bin/etcd"
}

# flannel, the shipped flavors' pod network, at the version src/capi_libvirt/api/pod_network.py names: flanneld and
# install-conf from its module, in a scratch module whose main.go is flannel's own minus two backends the flavors do
# not use: tencentvpc (the proxy refuses its Tencent Cloud SDK modules) and udp (its C proxy needs cgo; upstream's
# image links it with musl). Its CNI plugin: flannel-io/cni-plugin is refused by the proxy, so the same plugin from
# containernetworking/plugins v0.9.1, its home before it moved there (docs/book/src/development/stand-ins.md).
flannel_version=$(PYTHONPATH="$repo/src" python3 -c 'from capi_libvirt.api import pod_network; print(pod_network.FLANNEL_VERSION)')
flannel_cni_plugin_source=v0.9.1
flannel_build() {
  local out=$1 scratch module=github.com/flannel-io/flannel dir
  scratch=$(mktemp -d)
  dir=$(module_field "$module@$flannel_version" Dir)
  (
    cd "$scratch"
    go mod init capi-libvirt.local/flanneld
    go mod edit -require="$module@$flannel_version"
    grep -v -e '"github.com/flannel-io/flannel/pkg/backend/tencentvpc"' -e '"github.com/flannel-io/flannel/pkg/backend/udp"' \
      "$dir/main.go" >main.go
    go mod tidy
    go build -trimpath -ldflags "-s -w -X $module/pkg/version.Version=$flannel_version" -o "$out/flanneld" .
    go build -trimpath -ldflags "-s -w" -o "$out/install-conf" "$module/cmd/install_conf"
  )
  rm -rf "$scratch"
}
flannel_cni_plugin_build() {
  go_install "$flannel_cni_plugin_source" "" "$1" github.com/containernetworking/plugins/plugins/meta/flannel
}

# agnhost, Kubernetes' own e2e test program (test/images/agnhost of the same module): the whole cluster's pods that
# prove the pod network (`agnhost netexec`: an HTTP server whose /dial makes it call another pod or a Service).
agnhost_build() {
  local replaces; mapfile -t replaces < <(kubernetes_staging_replaces)
  go_build_in_scratch k8s.io/kubernetes "$KUBERNETES_VERSION" "" "$1" k8s.io/kubernetes/test/images/agnhost \
    -- "${replaces[@]}"
}

# What the node image's images carry besides the Kubernetes commands: etcd and CoreDNS at the versions kubeadm asks for,
# and flannel.
build_node_image_inputs() {
  local coredns="$bin/coredns-$COREDNS_VERSION"
  local flanneld="$bin/flanneld-$flannel_version" install_conf="$bin/flannel-install-conf-$flannel_version"
  local cni_plugin="$bin/flannel-cni-plugin-$flannel_cni_plugin_source" out
  if [ ! -x "$flanneld" ] || [ ! -x "$install_conf" ]; then
    out=$(mktemp -d)
    build flannel "flanneld and install-conf $flannel_version for the node image (a minute or two on 2 cores, once)" \
      flannel_build "$out"
    mv "$out/flanneld" "$flanneld"; mv "$out/install-conf" "$install_conf"; rm -rf "$out"
  fi
  [ -x "$cni_plugin" ] || build flannel-cni-plugin "the flannel CNI plugin (containernetworking/plugins $flannel_cni_plugin_source; seconds, once)" \
    build_single "$cni_plugin" flannel_cni_plugin_build
  ln -sfn "$cni_plugin" "$bin/flannel-cni-plugin"
  [ -x "$bin/agnhost-$KUBERNETES_VERSION" ] || build agnhost "agnhost of Kubernetes $KUBERNETES_VERSION for the node image (a few minutes on 2 cores, once)" \
    build_single "$bin/agnhost-$KUBERNETES_VERSION" agnhost_build
  build_etcd
  [ -x "$coredns" ] || build coredns "CoreDNS $COREDNS_VERSION for the node image (a few minutes on 2 cores, once)" \
    build_single "$coredns" coredns_build
}

# Cluster API's module: its CRDs and config, which the test bed reads (and its components are kustomized from).
link_cluster_api_module() {
  capi_dir=$(module_field "sigs.k8s.io/cluster-api@$CLUSTER_API_VERSION" Dir)
  ln -sfn "$capi_dir" "$CAPI_LIBVIRT_CACHE/cluster-api-$CLUSTER_API_VERSION"
}

# The Cluster API Operator's manager (its go.mod has no replace directives), and its module linked for its CRDs.
build_operator_group() {
operator="$bin/cluster-api-operator-$CLUSTER_API_OPERATOR_VERSION"
[ -x "$operator" ] || build cluster-api-operator \
  "the Cluster API Operator $CLUSTER_API_OPERATOR_VERSION (3-6 minutes on 2 cores, once)" \
  build_single "$operator" operator_build
ln -sfn "$(module_field "sigs.k8s.io/cluster-api-operator@$CLUSTER_API_OPERATOR_VERSION" Dir)" \
  "$CAPI_LIBVIRT_CACHE/cluster-api-operator-$CLUSTER_API_OPERATOR_VERSION"
}

build_rest_group() {
kustomize="$bin/kustomize-$KUSTOMIZE_VERSION"
# the tests check config/ builds with it
[ -x "$kustomize" ] || build kustomize "kustomize $KUSTOMIZE_VERSION (under a minute, once)" \
  build_single "$kustomize" kustomize_build

if [ ! -x "$capi_manager" ] || [ ! -x "$clusterctl" ] || [ ! -x "$cabpk" ] || [ ! -x "$kcp" ]; then
  build cluster-api "the Cluster API $CLUSTER_API_VERSION core manager, clusterctl, kubeadm bootstrap and control-plane managers (a few minutes on 2 cores, once)" \
    build_cluster_api
fi
ln -sfn "$capi_manager" "$bin/cluster-api-manager"
ln -sfn "$clusterctl" "$bin/clusterctl"
link_cluster_api_module

# cluster-autoscaler, with only the Cluster API cloud provider compiled in (build tag clusterapi). Its go.mod pins k8s.io
# staging modules with replace directives (copied into the scratch module) and replaces its nested module
# k8s.io/autoscaler/cluster-autoscaler/apis (the ProvisioningRequest API) with ./apis, which the proxy does not serve at
# this commit: the only version it serves (June 2024) has that API as v1beta1 only, so a copy of it renamed to v1 (plus
# the two v1 constants added since) stands in. The autoscaler only handles ProvisioningRequests when
# --enable-provisioning-requests is given. The proxy serves this pseudo-version, but the checksum database does not know
# it, hence GONOSUMDB for k8s.io/autoscaler only.
# The binary's name says it carries the backport below.
autoscaler="$bin/cluster-autoscaler-${CLUSTER_AUTOSCALER_VERSION##*-}-setsize0"
autoscaler_build() {
  local ca_module ca_sumdb gomod apis_version apis_dir apis_shim ca_dir ca_copy out replaces
  ca_module=k8s.io/autoscaler/cluster-autoscaler
  ca_sumdb="${GONOSUMDB:+$GONOSUMDB,}k8s.io/autoscaler"
  gomod=$(GONOSUMDB=$ca_sumdb module_field "$ca_module@$CLUSTER_AUTOSCALER_VERSION" GoMod)
  apis_version=$(awk '$1=="'"$ca_module"'/apis" && $2 ~ /^v/ {print $2}' "$gomod")
  apis_dir=$(GONOSUMDB=$ca_sumdb module_field "$ca_module/apis@$apis_version" Dir)
  apis_shim=$(mktemp -d)
  cp -r "$apis_dir/." "$apis_shim"; chmod -R u+w "$apis_shim"
  if [ ! -d "$apis_shim/provisioningrequest/autoscaling.x-k8s.io/v1" ]; then
    find "$apis_shim" -depth -type d -name v1beta1 -execdir mv v1beta1 v1 \;
    # Paths, package clauses, version strings and exported names go to v1; the Go qualifiers stay v1beta1 (bare imports
    # of the renamed packages get that as an alias), as v1 is already the generated code's alias of metav1.
    find "$apis_shim" -name '*.go' -exec sed -i \
      -e 's#^\(\s*\)\("k8s.io/autoscaler/cluster-autoscaler/apis/[^"]*/v1beta1"\)$#\1v1beta1 \2#' \
      -e 's#autoscaling.x-k8s.io/v1beta1#autoscaling.x-k8s.io/v1#g' -e 's/^package v1beta1/package v1/' \
      -e 's/"v1beta1"/"v1"/g' -e 's/V1beta1/V1/g' {} +
    cat >> "$apis_shim/provisioningrequest/autoscaling.x-k8s.io/v1/types.go" <<'EOF'

const (
	ProvisioningRequestPodAnnotationKey = "autoscaling.x-k8s.io/consume-provisioning-request"
	ProvisioningClassPodAnnotationKey   = "autoscaling.x-k8s.io/provisioning-class-name"
)
EOF
  fi
  mapfile -t replaces < <(awk '$1=="replace" && $3=="=>" {print $2" => "($4=="./apis" ? "'"$apis_shim"'" : $4" "$5)}' "$gomod")
  [ "${#replaces[@]}" -gt 0 ] || { echo "no replaces found in $gomod"; exit 1; }
  # Backport of upstream kubernetes/autoscaler#8412 (Aug 2025): SetSize marshals an autoscaling/v1 Scale whose replicas
  # is omitempty, so scaling a node group to 0 patched nothing. The fix writes the count explicitly.
  ca_dir=$(GONOSUMDB=$ca_sumdb module_field "$ca_module@$CLUSTER_AUTOSCALER_VERSION" Dir)
  ca_copy=$(mktemp -d)
  cp -r "$ca_dir/." "$ca_copy"; chmod -R u+w "$ca_copy"
  python3 - "$ca_copy/cloudprovider/clusterapi/clusterapi_unstructured.go" <<'PATCH'
import re, sys
path = sys.argv[1]
source = open(path).read()
broken = re.compile(r"\tspec := autoscalingv1\.Scale\{.*?could not marshal json patch for scaling: %w\", err\)\n\t\}\n", re.S)
fixed = '\tpatch := []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, nreplicas))\n'
source, count = broken.subn(fixed, source)
assert count == 1, "SetSize is not the code the backport expects"
source = source.replace('\t"encoding/json"\n', "").replace('\tautoscalingv1 "k8s.io/api/autoscaling/v1"\n', "")
open(path, "w").write(source)
PATCH
  replaces+=("$ca_module => $ca_copy")
  out=$(mktemp -d)
  GONOSUMDB=$ca_sumdb GOFLAGS="$GOFLAGS -tags=clusterapi" go_build_in_scratch \
    "$ca_module" "$CLUSTER_AUTOSCALER_VERSION" "" "$out" "$ca_module" -- "${replaces[@]}"
  install_from "$out" cluster-autoscaler "$autoscaler"
  rm -rf "$apis_shim" "$ca_copy" "$out"
}
[ -x "$autoscaler" ] || build cluster-autoscaler \
  "cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION (clusterapi provider only; 3-5 minutes on 2 cores, once)" autoscaler_build

# cert-manager's controller, cainjector and webhook for `clusterctl init` in the test bed: thin mains of our own
# (hack/cert-manager, a Go module requiring the root module github.com/cert-manager/cert-manager at
# $CERT_MANAGER_VERSION), since the Go module proxy does not serve upstream's cmd/* modules. Rebuilt when the mains'
# sources change (their hash is kept beside the binaries).
cm_src="$(cd "$(dirname "$0")" && pwd)/cert-manager"
grep -q "github.com/cert-manager/cert-manager $CERT_MANAGER_VERSION\$" "$cm_src/go.mod" \
  || { log "$cm_src/go.mod does not require cert-manager $CERT_MANAGER_VERSION"; exit 1; }
cm_hash=$(cd "$cm_src" && cat go.mod go.sum */main.go | sha256sum | cut -c1-16)
cm_stamp="$bin/cert-manager-$CERT_MANAGER_VERSION.sources"
cm_built=true
for component in controller cainjector webhook; do
  [ -x "$bin/cert-manager-$component-$CERT_MANAGER_VERSION" ] || cm_built=false
done
cert_manager_build() {
  local cm_out component
  cm_out=$(mktemp -d)
  (cd "$cm_src" && go build -trimpath -ldflags "-s -w" -o "$cm_out/" ./controller ./cainjector ./webhook)
  for component in controller cainjector webhook; do
    mv "$cm_out/$component" "$bin/cert-manager-$component-$CERT_MANAGER_VERSION"
  done
  rm -rf "$cm_out"
  echo "$cm_hash" > "$cm_stamp"
}
if ! $cm_built || [ "$(cat "$cm_stamp" 2>/dev/null)" != "$cm_hash" ]; then
  build cert-manager "cert-manager $CERT_MANAGER_VERSION controller, cainjector and webhook (hack/cert-manager, one go build; 4-8 minutes on 2 cores, once)" \
    cert_manager_build
fi

# helm, only to render cert-manager.yaml from the chart in cert-manager's module with the release's own command.
helm="$bin/helm-$HELM_VERSION"
helm_build() { go_install "$HELM_VERSION" "" "$1" helm.sh/helm/v4/cmd/helm; }
[ -x "$helm" ] || build helm "helm $HELM_VERSION (3-8 minutes on 2 cores, once): it renders cert-manager.yaml" \
  build_single "$helm" helm_build

# cert-manager.yaml as cert-manager's release makes it (make/manifests.mk): `helm template` of deploy/charts/cert-manager
# from the module, the namespace first, then the CRDs (from the crds-enabled render), then the rest. Cached by version.
cm_yaml="$CAPI_LIBVIRT_CACHE/cert-manager-$CERT_MANAGER_VERSION/cert-manager.yaml"
if [ ! -s "$cm_yaml" ]; then
  log "rendering cert-manager.yaml $CERT_MANAGER_VERSION (helm template of the module's chart)"
  cm_dir=$(module_field "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION" Dir)
  work=$(mktemp -d)
  cp -r "$cm_dir/deploy/charts/cert-manager" "$work/chart"; chmod -R u+w "$work/chart"
  # Chart.yaml as the release's: version and appVersion are the release (the image tags default to appVersion).
  sed -e "s/^version: v0.0.0/version: $CERT_MANAGER_VERSION/" -e "s/^appVersion: v0.0.0/appVersion: $CERT_MANAGER_VERSION/" \
      -e 's/"{{IS_PRERELEASE}}"/"false"/' "$work/chart/Chart.template.yaml" > "$work/chart/Chart.yaml"
  rm "$work/chart/Chart.template.yaml" "$work/chart/README.template.md"
  helm_args=(--kube-version=1.29.0 --api-versions= --namespace=cert-manager --set=creator=static
             --set=startupapicheck.enabled=false)
  "$helm" template "${helm_args[@]}" --set=crds.enabled=true cert-manager "$work/chart" > "$work/all.yaml"
  "$helm" template "${helm_args[@]}" cert-manager "$work/chart" > "$work/noncrd.yaml"
  # The CRDs of the crds-enabled render (upstream's hack/extractcrd), by their top-level kind; no YAML library needed.
  python3 - "$work/all.yaml" > "$work/crds.yaml" <<'PY'
import re, sys
docs = re.split(r"\n---", open(sys.argv[1]).read())
print("\n---\n".join(d.strip("\n") for d in docs if re.search(r"^kind: CustomResourceDefinition$", d, re.M)))
PY
  mkdir -p "$(dirname "$cm_yaml")"
  { cat "$cm_dir/deploy/manifests/namespace.yaml"; echo; echo "---"; cat "$work/crds.yaml"; echo; echo "---"
    sed -e '1{/^---$/d;}' "$work/noncrd.yaml"; } > "$cm_yaml.tmp"
  mv "$cm_yaml.tmp" "$cm_yaml"
  rm -rf "$work"
fi

# The Cluster API components clusterctl installs (core, kubeadm bootstrap, kubeadm control plane), as Cluster API's
# `make release-manifests` builds them: kustomize build of each config/default of the module, the images named as the
# release names them (nothing pulls them here), the module's metadata.yaml beside them. Cached by version.
capi_components="$CAPI_LIBVIRT_CACHE/cluster-api-components-$CLUSTER_API_VERSION"
if [ ! -s "$capi_components/control-plane-components.yaml" ]; then
  log "building the Cluster API $CLUSTER_API_VERSION components (kustomize build of the module's config)"
  mkdir -p "$capi_components"
  for entry in "config/default core-components.yaml cluster-api-controller" \
               "bootstrap/kubeadm/config/default bootstrap-components.yaml kubeadm-bootstrap-controller" \
               "controlplane/kubeadm/config/default control-plane-components.yaml kubeadm-control-plane-controller"; do
    read -r config file image <<< "$entry"
    "$kustomize" build "$capi_dir/$config" \
      | sed -e "s#gcr.io/k8s-staging-cluster-api/$image:main#registry.k8s.io/cluster-api/$image:$CLUSTER_API_VERSION#" \
      > "$capi_components/$file.tmp"
    mv "$capi_components/$file.tmp" "$capi_components/$file"
  done
  install -m 644 "$capi_dir/metadata.yaml" "$capi_components/metadata.yaml"
fi

log "cert-manager.yaml in $(dirname "$cm_yaml"), Cluster API components in $capi_components"
}

case "$group" in
  control-plane) build_etcd; build_kubernetes_group kube-apiserver kubeadm; link_cluster_api_module ;;
  kubernetes) build_kubernetes_group; build_node_image_inputs ;;
  rest) build_rest_group ;;
  operator) build_operator_group ;;
  all) build_kubernetes_group; build_node_image_inputs; build_rest_group; build_operator_group ;;
esac
log "$group ready in $bin"
