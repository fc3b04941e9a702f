#!/usr/bin/env bash
# Build the upstream Go programs the test bed runs (etcd, kube-apiserver, kubelet, kubeadm, the Cluster API managers,
# clusterctl, ...) from the Go module proxy and fetch the modules whose files the test bed reads (Cluster API's CRDs). Everything is cached by version under
# $CAPI_LIBVIRT_CACHE (default ~/.cache/capi-libvirt), outside the work tree; a second run only checks the cache.
set -euo pipefail

: "${KUBERNETES_VERSION:=v1.35.4}"
: "${ETCD_VERSION:=v3.6.16}"
: "${CLUSTER_API_VERSION:=v1.12.8}"
: "${KUSTOMIZE_VERSION:=v5.8.1}"
: "${CLUSTER_AUTOSCALER_VERSION:=v0.0.0-20250613073258-1959f5f61f6c}"
# cert-manager: the version clusterctl $CLUSTER_API_VERSION installs by default (its CertManagerDefaultVersion); it is
# pinned by hack/cert-manager/go.mod, which this must name. helm: the version cert-manager's release pins to render it.
: "${CERT_MANAGER_VERSION:=v1.20.2}"
: "${HELM_VERSION:=v4.1.1}"
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

# module_field MODULE@VERSION FIELD: a field of `go mod download -json` (Dir: the unpacked source; GoMod: its go.mod).
module_field() {
  go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

# go_install PACKAGE VERSION OUTPUT LDFLAGS: `go install PACKAGE@VERSION` into a throw-away GOBIN; for modules whose
# go.mod has no replace directives (cluster-api).
go_install() {
  local package=$1 version=$2 output=$3 ldflags=$4
  local gobin; gobin=$(mktemp -d)
  GOBIN="$gobin" go install -trimpath -ldflags "-s -w $ldflags" "$package@$version"
  mv "$gobin"/* "$output"  # the one program built (named after the package, minus a /vN suffix)
  rm -rf "$gobin"
}

etcd="$bin/etcd-$ETCD_VERSION"
if [ ! -x "$etcd" ]; then
  log "building etcd $ETCD_VERSION (a few minutes on 2 cores, once)"
  go_build_in_scratch go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3 "$etcd" ""
fi

# build_kubernetes_command NAME OUTPUT: k8s.io/kubernetes/cmd/NAME at $KUBERNETES_VERSION, in a scratch module that
# copies the k8s.io staging replaces of kubernetes' go.mod, with the version stamp.
build_kubernetes_command() {
  local name=$1 output=$2
  local gomod; gomod=$(module_field "k8s.io/kubernetes@$KUBERNETES_VERSION" GoMod)
  local staging_version="v0.${KUBERNETES_VERSION#v1.}"
  local replaces; mapfile -t replaces < <(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1" => "$1" '"$staging_version"'"}' "$gomod")
  [ "${#replaces[@]}" -gt 0 ] || { log "no staging replaces found in $gomod"; exit 1; }
  # The version stamp: clients (clusterctl among them) check the server's version.
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local version_flags="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    version_flags+=" -X $pkg.gitTreeState=clean"
  done
  go_build_in_scratch k8s.io/kubernetes "$KUBERNETES_VERSION" "k8s.io/kubernetes/cmd/$name" "$output" \
    "$version_flags" "${replaces[@]}"
}

kustomize="$bin/kustomize-$KUSTOMIZE_VERSION"
if [ ! -x "$kustomize" ]; then
  log "building kustomize $KUSTOMIZE_VERSION (under a minute, once): the tests check config/ builds with it"
  go_install sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION" "$kustomize" ""
fi

apiserver="$bin/kube-apiserver-$KUBERNETES_VERSION"
if [ ! -x "$apiserver" ]; then
  log "building kube-apiserver $KUBERNETES_VERSION (10-20 minutes on 2 cores, once)"
  build_kubernetes_command kube-apiserver "$apiserver"
fi

# cluster_api_version_stamp: the -X flags that stamp $CLUSTER_API_VERSION into a Cluster API program.
cluster_api_version_stamp() {
  local minor=${CLUSTER_API_VERSION#v1.} pkg=sigs.k8s.io/cluster-api/version
  minor=${minor%%.*}
  echo "-X $pkg.gitVersion=$CLUSTER_API_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
}

clusterctl="$bin/clusterctl-$CLUSTER_API_VERSION"
if [ ! -x "$clusterctl" ]; then
  log "building clusterctl $CLUSTER_API_VERSION (a few minutes on 2 cores, once)"
  # The version stamp: clusterctl compares its own version with the providers' contracts and prints it.
  go_install sigs.k8s.io/cluster-api/cmd/clusterctl "$CLUSTER_API_VERSION" "$clusterctl" "$(cluster_api_version_stamp)"
fi

capi_manager="$bin/cluster-api-manager-$CLUSTER_API_VERSION"
if [ ! -x "$capi_manager" ]; then
  log "building the Cluster API core manager $CLUSTER_API_VERSION (a few minutes on 2 cores, once)"
  # The same version stamp as clusterctl's: the manager logs it at start ("Version: v1.12.8"). The root main.go of the
  # module; its go.mod has no replace directives, so `go install` builds it.
  go_install sigs.k8s.io/cluster-api "$CLUSTER_API_VERSION" "$capi_manager" "$(cluster_api_version_stamp)"
fi
ln -sfn "$capi_manager" "$bin/cluster-api-manager"

capi_dir=$(module_field "sigs.k8s.io/cluster-api@$CLUSTER_API_VERSION" Dir)
ln -sfn "$capi_dir" "$CAPI_LIBVIRT_CACHE/cluster-api-$CLUSTER_API_VERSION"
ln -sfn "$etcd" "$bin/etcd"
ln -sfn "$apiserver" "$bin/kube-apiserver"
ln -sfn "$clusterctl" "$bin/clusterctl"

scheduler="$bin/kube-scheduler-$KUBERNETES_VERSION"
if [ ! -x "$scheduler" ]; then
  log "building kube-scheduler $KUBERNETES_VERSION (about 5 minutes on 2 cores, 1 after kube-apiserver, once)"
  build_kubernetes_command kube-scheduler "$scheduler"
fi

# kube-controller-manager: the e2e runs only its node lifecycle controller (it lifts the not-ready taint the API server
# puts on every new Node once the Node is Ready), as a real cluster does.
controller_manager="$bin/kube-controller-manager-$KUBERNETES_VERSION"
if [ ! -x "$controller_manager" ]; then
  log "building kube-controller-manager $KUBERNETES_VERSION (a few minutes on 2 cores after kube-apiserver, once)"
  build_kubernetes_command kube-controller-manager "$controller_manager"
fi

# kubelet and kubeadm: the node image carries both (the same Kubernetes version as the test API server), and kubeadm's
# `init phase` commands prepare the test API server for joining nodes as `kubeadm init` would.
for command in kubelet kubeadm; do
  output="$bin/$command-$KUBERNETES_VERSION"
  if [ ! -x "$output" ]; then
    log "building $command $KUBERNETES_VERSION (a few minutes on 2 cores after kube-apiserver, once)"
    build_kubernetes_command "$command" "$output"
  fi
done
# The node image compiles the sandbox ("pause") program from the Kubernetes module's build/pause/linux/pause.c.
ln -sfn "$(module_field "k8s.io/kubernetes@$KUBERNETES_VERSION" Dir)" "$CAPI_LIBVIRT_CACHE/kubernetes-$KUBERNETES_VERSION"

# Cluster API's kubeadm bootstrap provider (CABPK): bootstrap/kubeadm/main.go of the same module as the core manager.
cabpk="$bin/cluster-api-kubeadm-bootstrap-manager-$CLUSTER_API_VERSION"
if [ ! -x "$cabpk" ]; then
  log "building the Cluster API kubeadm bootstrap manager $CLUSTER_API_VERSION (a few minutes on 2 cores, once)"
  go_install sigs.k8s.io/cluster-api/bootstrap/kubeadm "$CLUSTER_API_VERSION" "$cabpk" "$(cluster_api_version_stamp)"
fi

# cluster-autoscaler, with only the Cluster API cloud provider compiled in (build tag clusterapi). Its go.mod pins k8s.io
# staging modules with replace directives (copied into the scratch module) and replaces its nested module
# k8s.io/autoscaler/cluster-autoscaler/apis (the ProvisioningRequest API) with ./apis, which the proxy does not serve at
# this commit: the only version it serves (June 2024) has that API as v1beta1 only, so a copy of it renamed to v1 (plus
# the two v1 constants added since) stands in. The autoscaler only handles ProvisioningRequests when
# --enable-provisioning-requests is given. The proxy serves this pseudo-version, but the checksum database does not know
# it, hence GONOSUMDB for k8s.io/autoscaler only.
# The binary's name says it carries the backport below.
autoscaler="$bin/cluster-autoscaler-${CLUSTER_AUTOSCALER_VERSION##*-}-setsize0"
if [ ! -x "$autoscaler" ]; then
  log "building cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION (clusterapi provider only; 3-5 minutes on 2 cores, once)"
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
  [ "${#replaces[@]}" -gt 0 ] || { log "no replaces found in $gomod"; exit 1; }
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
  GONOSUMDB=$ca_sumdb GOFLAGS="$GOFLAGS -tags=clusterapi" go_build_in_scratch \
    "$ca_module" "$CLUSTER_AUTOSCALER_VERSION" "$ca_module" "$autoscaler" "" "${replaces[@]}"
  rm -rf "$apis_shim" "$ca_copy"
fi

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
if ! $cm_built || [ "$(cat "$cm_stamp" 2>/dev/null)" != "$cm_hash" ]; then
  log "building cert-manager $CERT_MANAGER_VERSION controller, cainjector and webhook (hack/cert-manager; 4-8 minutes on 2 cores, once)"
  cm_out=$(mktemp -d)
  (cd "$cm_src" && go build -trimpath -ldflags "-s -w" -o "$cm_out/" ./controller ./cainjector ./webhook)
  for component in controller cainjector webhook; do
    mv "$cm_out/$component" "$bin/cert-manager-$component-$CERT_MANAGER_VERSION"
  done
  rm -rf "$cm_out"
  echo "$cm_hash" > "$cm_stamp"
fi

# helm, only to render cert-manager.yaml from the chart in cert-manager's module with the release's own command.
helm="$bin/helm-$HELM_VERSION"
if [ ! -x "$helm" ]; then
  log "building helm $HELM_VERSION (3-8 minutes on 2 cores, once): it renders cert-manager.yaml"
  go_install helm.sh/helm/v4/cmd/helm "$HELM_VERSION" "$helm" ""
fi

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

log "ready in $bin: $(cd "$bin" && ls | tr '\n' ' ')"
log "cert-manager.yaml in $(dirname "$cm_yaml"), Cluster API components in $capi_components"
