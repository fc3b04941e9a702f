#!/usr/bin/env bash
# Build a Debian guest image the libvirt test hosts boot, in one of two flavors:
#
#   hack/build-guest-image.sh [--folder] [minimal|node]      (default: minimal)
#
# minimal: a bookworm root file system with cloud-init and the QEMU guest agent, as a compressed qcow2 whose whole
#   disk is the ext4 root (/dev/vda), plus the kernel and initrd beside it for direct kernel boot.
# node: a Kubernetes node image in the manner of image-builder's: the same root plus containerd, runc, the CNI
#   plugins, kubelet and kubeadm (from $CAPI_LIBVIRT_CACHE/bin, built by hack/build-upstream.sh), configured as a
#   kubeadm-based node (a kubelet that waits for `kubeadm init` or `join`, containerd on the systemd cgroup driver, a
#   bridge CNI network), with every image `kubeadm config images list` names already in containerd's store: the
#   sandbox, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, etcd and CoreDNS, each built here from
#   the sources of the test bed's programs (hack/image-archive.py) and imported at build time, so nothing is pulled at
#   run time. keepalived is installed (not enabled) for a control-plane endpoint held as a virtual IP. It boots from
#   its own disk: an MBR disk with one bootable ext4 partition labelled root, syslinux's MBR and extlinux in
#   /boot/extlinux. No file besides the disk.
# Both start from hack/debian-root.sh's cached root of bookworm's minbase and the guest packages (made once, shared by
# the two flavors); the node flavor installs its own packages on top.
#
# Each image lands in $CAPI_LIBVIRT_CACHE/images/ (default cache ~/.cache/capi-libvirt): minimal in <recipe-hash>/,
# node in node-<recipe-hash>/. The minimal recipe hash is the start of the sha256 of this very file and
# hack/debian-root.sh; the node one is that of this file, hack/debian-root.sh and hack/image-archive.py followed by
# the lines `flannel=<version> <image> <CNI plugin image>` (the pod network's images, as
# src/capi_libvirt/api/pod_network.py names them: an edit of its manifest builds no new image), `flavor=node` and
# `kubernetes=$KUBERNETES_VERSION`,
# so a new Kubernetes version builds a new image. Any change to the recipe below builds new images; an unchanged recipe only checks the
# cache. src/capi_libvirt/devenv/guest_image.py computes the same hashes. `--folder` prints the folder of the current
# recipe and builds nothing.
# The build happens in a temporary folder beside the result and is renamed into place only once complete (with the
# marker file written last), so an interrupted build leaves nothing that looks finished. Prints the image folder.
set -euo pipefail

: "${CAPI_LIBVIRT_CACHE:=$HOME/.cache/capi-libvirt}"
: "${DEBIAN_MIRROR:=http://deb.debian.org/debian}"
: "${KUBERNETES_VERSION:=v1.35.4}"   # as hack/build-upstream.sh and src/capi_libvirt/devenv/paths.py

usage() { echo "usage: $0 [--folder] [minimal|node]" >&2; exit 2; }
flavor=minimal
print_folder=false
for arg in "$@"; do
  case "$arg" in
    --folder) print_folder=true ;;
    minimal|node) flavor=$arg ;;
    *) usage ;;
  esac
done

# python3-cffi-backend must be named: cloud-init needs it, and minbase does not pull it in.
packages=systemd-sysv,udev,dbus,kmod,linux-image-cloud-amd64,initramfs-tools,cloud-init,python3-cffi-backend
packages+=,qemu-guest-agent,netbase,iproute2
disk_size=2G     # sparse; the qcow2 holds only used blocks, and cloud-init grows the fs when a volume is larger
marker=READY     # written last; guest_image.py looks for it

# The node flavor: what kubeadm and the kubelet expect on a node (conntrack, ethtool, socat, iptables), containerd and
# its runtime and CNI plugins, Jinja for the cloud-init that Cluster API's kubeadm bootstrap provider writes (it
# templates the node name from the meta-data), growpart (fdisk) to grow the root partition on a larger volume, and
# systemd-resolved: the kubelet needs a resolv.conf for pods (kubeadm points it at resolved's), and the node's own
# name must resolve (kubeadm's Hostname preflight check).
node_packages=containerd,runc,containernetworking-plugins,iptables,conntrack,ethtool,socat,ca-certificates
node_packages+=,python3-jinja2,cloud-guest-utils,fdisk,e2fsprogs,procps,mount,systemd-resolved,keepalived
node_disk_size=4G          # sparse: room for container images and logs
partition_start_sectors=2048   # 1 MiB
pause_version=3.10.1       # kubeadm 1.35's sandbox image (constants.PauseVersion); containerd's sandbox_image
sandbox_image="registry.k8s.io/pause:$pause_version"
: "${ETCD_VERSION:=v3.6.6}"    # kubeadm 1.35's etcd (constants.SupportedEtcdVersion), as hack/build-upstream.sh
: "${COREDNS_VERSION:=v1.13.1}"     # kubeadm 1.35's CoreDNS (constants.CoreDNSVersion), as hack/build-upstream.sh
etcd_image="registry.k8s.io/etcd:${ETCD_VERSION#v}-0"
coredns_image="registry.k8s.io/coredns/coredns:$COREDNS_VERSION"
pod_subnet=100.96.0.0/24   # the bridge stand-in's: not a private range; every node may use the same one
# extlinux (syslinux 6.04) reads ext4, but not these newer features of bookworm's mke2fs.
node_fs_features='^64bit,^metadata_csum_seed,^orphan_file'
mbr_code=/usr/lib/syslinux/mbr/mbr.bin

log() { printf '[build-guest-image] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

script=$(readlink -f "${BASH_SOURCE[0]}")
debian_root="$(dirname "$script")/debian-root.sh"
image_archive="$(dirname "$script")/image-archive.py"
images="$CAPI_LIBVIRT_CACHE/images"
# The pod network's images carry the references the flavors' flannel manifest names (src/capi_libvirt/api/pod_network.py).
repo=$(cd "$(dirname "$script")/.." && pwd)
read -r flannel_version flannel_image cni_plugin_image < <(PYTHONPATH="$repo/src" python3 -c \
  'from capi_libvirt.api import pod_network as p; print(p.FLANNEL_VERSION, p.FLANNEL_IMAGE, p.CNI_PLUGIN_IMAGE)')
if [ "$flavor" = node ]; then
  recipe_hash=$({ cat "$script" "$debian_root" "$image_archive"
    printf 'flannel=%s %s %s\nflavor=node\nkubernetes=%s\n' "$flannel_version" "$flannel_image" "$cni_plugin_image" \
      "$KUBERNETES_VERSION"; } \
    | sha256sum | cut -c1-16)
  out="$images/node-$recipe_hash"
else
  recipe_hash=$(cat "$script" "$debian_root" | sha256sum | cut -c1-16)
  out="$images/$recipe_hash"
fi

if $print_folder || [ -f "$out/$marker" ]; then
  echo "$out"
  exit 0
fi

kubelet_binary="$CAPI_LIBVIRT_CACHE/bin/kubelet-$KUBERNETES_VERSION"
kubeadm_binary="$CAPI_LIBVIRT_CACHE/bin/kubeadm-$KUBERNETES_VERSION"
etcd_binary="$CAPI_LIBVIRT_CACHE/bin/etcd-$ETCD_VERSION"
coredns_binary="$CAPI_LIBVIRT_CACHE/bin/coredns-$COREDNS_VERSION"
flanneld_binary="$CAPI_LIBVIRT_CACHE/bin/flanneld-$flannel_version"
install_conf_binary="$CAPI_LIBVIRT_CACHE/bin/flannel-install-conf-$flannel_version"
cni_plugin_binary="$CAPI_LIBVIRT_CACHE/bin/flannel-cni-plugin"
agnhost_binary="$CAPI_LIBVIRT_CACHE/bin/agnhost-$KUBERNETES_VERSION"
agnhost_version_file="$CAPI_LIBVIRT_CACHE/kubernetes-$KUBERNETES_VERSION/test/images/agnhost/VERSION"
control_plane_binaries=()
for command in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
  control_plane_binaries+=("$CAPI_LIBVIRT_CACHE/bin/$command-$KUBERNETES_VERSION")
done
pause_source="$CAPI_LIBVIRT_CACHE/kubernetes-$KUBERNETES_VERSION/build/pause/linux/pause.c"
if [ "$flavor" = node ]; then
  # Fail before any work when an input is missing, and say where it comes from.
  missing=()
  for input in "$kubelet_binary" "$kubeadm_binary" "$etcd_binary" "$coredns_binary" "${control_plane_binaries[@]}" \
      "$flanneld_binary" "$install_conf_binary" "$cni_plugin_binary" "$agnhost_binary"; do
    [ -x "$input" ] || missing+=("$input (hack/build-upstream.sh builds it)")
  done
  for input in "$pause_source" "$agnhost_version_file"; do
    [ -f "$input" ] || missing+=("$input (hack/build-upstream.sh links the k8s.io/kubernetes module there)")
  done
  for tool in gcc extlinux sfdisk losetup; do
    command -v "$tool" >/dev/null || missing+=("$tool (hack/install-system-deps.sh installs it)")
  done
  [ -f "$mbr_code" ] || missing+=("$mbr_code (syslinux-common; hack/install-system-deps.sh installs it)")
  if [ "${#missing[@]}" -gt 0 ]; then
    log "cannot build the node image of Kubernetes $KUBERNETES_VERSION; missing:"
    printf '  %s\n' "${missing[@]}" >&2
    exit 1
  fi
  [ "$(id -u)" -eq 0 ] || die "the node image needs root (chroot, loop devices and a mount for extlinux)"
fi

mkdir -p "$images"
# One builder per flavor at a time (the two flavors build side by side): a second caller waits, then finds the
# finished image.
exec 9>"$images/.build-$flavor.lock"
flock 9
if [ -f "$out/$marker" ]; then
  echo "$out"
  exit 0
fi

# unmount_below DIR: the node flavor mounts its partition for extlinux; an interrupted run may leave it mounted, and
# removing the folder must never walk into it.
unmount_below() {
  local dir=$1 target
  findmnt -rn -o TARGET | awk -v d="$dir/" 'index($0, d) == 1' | sort -r | while read -r target; do
    umount -l "$target" || true
  done
}

# detach_loops_below DIR: the loop devices whose backing file lies in DIR (a deleted one is listed with " (deleted)").
detach_loops_below() {
  local dir=$1 device file
  command -v losetup >/dev/null || return 0
  losetup -n -l -O NAME,BACK-FILE 2>/dev/null | while read -r device file; do
    case "$file" in
      "$dir"/*) losetup -d "$device" 2>/dev/null || true ;;
    esac
  done
}

remove_build_dir() {
  local dir=$1
  unmount_below "$dir"
  detach_loops_below "$dir"
  rm -rf --one-file-system "$dir"
}

# Holding the flavor's lock, any leftover build folder of the flavor is from a builder that was killed outright
# (.build-<hash>.* ones are from the recipe before per-flavor locks).
for stale in "$images/.build-$flavor-"* "$images"/.build-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]*.*; do
  if [ -d "$stale" ]; then
    log "removing stale build folder $stale"
    remove_build_dir "$stale"
  fi
done

# interruptible CMD...: run a long step as a job of its own process group (job control on for that one start) with
# its output in the build log, and wait for it. bash runs a trap only once a foreground command has ended; `wait`
# returns at once instead, so an interrupt ends the whole group (apt's dpkg children included) before the build folder
# is removed.
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
  # Whatever of the group outlived its leader (a dpkg run by apt) must not write into a folder being removed.
  kill -KILL -- "-$step_pgid" 2>/dev/null || true
}

# The node flavor's partition, while extlinux is installed into it: unmounted and detached on every way out.
loop_device=
partition_mount=
release_partition() {
  if [ -n "$partition_mount" ] && mountpoint -q "$partition_mount"; then
    umount "$partition_mount" || umount -l "$partition_mount" || true
  fi
  partition_mount=
  if [ -n "$loop_device" ]; then
    losetup -d "$loop_device" 2>/dev/null || true
  fi
  loop_device=
}

work=$(mktemp -d "$images/.build-$flavor-$recipe_hash.XXXXXX")
trap 'end_running_step; release_partition; remove_build_dir "$work"' EXIT
trap 'log "interrupted; removing $work"; exit 130' INT TERM HUP
root="$work/root"
build_log="$work/build.log"

started=$SECONDS
log "the Debian root with the $flavor packages into $root"
if [ "$flavor" = node ]; then
  interruptible "$debian_root" --into "$root" "$packages" "$node_packages"
else
  interruptible "$debian_root" --into "$root" "$packages"
fi
suite=$(sed -n 's/^VERSION_CODENAME=//p' "$root/etc/os-release")

log "configuring the image (the root took $((SECONDS - started)) s)"
if [ "$flavor" = node ]; then
  echo 'LABEL=root / ext4 defaults,errors=remount-ro 0 1' >"$root/etc/fstab"
else
  echo '/dev/vda / ext4 defaults,errors=remount-ro 0 1' >"$root/etc/fstab"
fi
# Empty machine-id: each guest gets its own on first boot.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
echo debian >"$root/etc/hostname"
# The root comes with the build machine's resolver (for apt); a guest must not inherit it.
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

kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n 1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -n 1)

# configure_node: everything that makes the root file system a kubeadm node. /boot/config-* stays (kubeadm's
# SystemVerification preflight reads the kernel's configuration there). No swap is ever set up.
configure_node() {
  # The resolver: systemd-resolved's stub, fed by systemd-networkd's DHCP leases.
  ln -sfn ../run/systemd/resolve/stub-resolv.conf "$root/etc/resolv.conf"
  chroot "$root" systemctl enable systemd-resolved.service >>"$build_log" 2>&1

  install -m 0755 "$kubelet_binary" "$root/usr/bin/kubelet"
  install -m 0755 "$kubeadm_binary" "$root/usr/bin/kubeadm"

  # The kubelet as the kubeadm packages set it up: a plain unit, and a drop-in that points it at the files
  # `kubeadm join` writes. Until then it exits at once and systemd starts it again.
  mkdir -p "$root/usr/lib/systemd/system/kubelet.service.d" "$root/etc/kubernetes/manifests" "$root/var/lib/kubelet"
  cat >"$root/usr/lib/systemd/system/kubelet.service" <<'EOF'
[Unit]
Description=kubelet, the Kubernetes node agent
Documentation=https://kubernetes.io/docs/reference/command-line-tools-reference/kubelet/
Wants=network-online.target containerd.service
After=network-online.target containerd.service
# Restarted forever: it has nothing to run until `kubeadm join` has written its configuration (which then restarts
# it at once). Every 10 s, as the kubeadm packages' unit: each start of the kubelet costs the guest CPU under TCG.
StartLimitIntervalSec=0

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
  cat >"$root/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf" <<'EOF'
# How kubeadm drives the kubelet. `kubeadm join` writes the bootstrap kubeconfig (TLS bootstrapping turns it into
# kubelet.conf), the kubelet's configuration file and kubeadm-flags.env (KUBELET_KUBEADM_ARGS); the administrator's
# own flags go into /etc/default/kubelet (KUBELET_EXTRA_ARGS), which wins by coming last.
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
EOF

  # containerd: the systemd cgroup driver (kubeadm configures the kubelet with it), the sandbox image this image
  # carries, the CNI plugins in /opt/cni/bin as image-builder's images have them (Debian's, linked there; a CNI add-on
  # puts its own plugin beside them). AppArmor off for containers: the image has no apparmor_parser to load
  # containerd's default profile with.
  mkdir -p "$root/opt/cni/bin"
  for plugin in "$root"/usr/lib/cni/*; do ln -sfn "/usr/lib/cni/$(basename "$plugin")" "$root/opt/cni/bin/"; done
  mkdir -p "$root/etc/containerd"
  cat >"$root/etc/containerd/config.toml" <<EOF
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$sandbox_image"
  disable_apparmor = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
EOF

  # No CNI configuration in /etc/cni/net.d, as on image-builder's images: the cluster's CNI add-on writes it (the
  # flavors' flannel). For the test bed's clusters that have none (their control plane is the test API server), a
  # node-local bridge network they copy there (tests/kubeadm_workers.py): containerd then reports the pod network
  # ready, so the Node becomes Ready. Pods reach the outside masqueraded behind the node's address.
  mkdir -p "$root/etc/cni/net.d" "$root/etc/capi-libvirt"
  cat >"$root/etc/capi-libvirt/bridge-cni.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "capi-libvirt-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$pod_subnet"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

  # Kernel settings kubeadm's preflight and the bridge network need.
  cat >"$root/etc/modules-load.d/kubernetes.conf" <<'EOF'
overlay
br_netfilter
EOF
  cat >"$root/etc/sysctl.d/90-kubernetes.conf" <<'EOF'
net.ipv4.ip_forward = 1
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
EOF

  # The images kubeadm runs, built here (nothing is pulled at run time) and imported into containerd's store now.
  make_node_images

  chroot "$root" systemctl enable containerd.service kubelet.service >>"$build_log" 2>&1
  # keepalived holds a virtual IP only where a machine's bootstrap data configures and starts it.
  chroot "$root" systemctl disable keepalived.service >>"$build_log" 2>&1 || true

  # The bootloader's configuration; extlinux itself is installed once the file system exists.
  mkdir -p "$root/boot/extlinux"
  cat >"$root/boot/extlinux/extlinux.conf" <<EOF
SERIAL 0 115200
DEFAULT debian
PROMPT 0
TIMEOUT 0

LABEL debian
  LINUX /boot/${kernel##*/}
  INITRD /boot/${initrd##*/}
  APPEND root=LABEL=root rw console=ttyS0
EOF
}

# make_node_images: the sandbox image (pause.c of the Kubernetes module, linked statically) and the control-plane
# images (the test bed's own Kubernetes commands, etcd and CoreDNS at kubeadm's versions: static Go programs in
# /usr/local/bin as upstream's images have them; kube-proxy with the node root's iptables, xtables-nft as Debian's
# default, and conntrack), as one-layer archives, then imported into the root's /var/lib/containerd by the root's own
# containerd run on this machine (its CRI plugin off; the k8s.io namespace is the one the kubelet's CRI reads), so
# the guest's containerd starts with them unpacked and a boot spends nothing on them.
make_node_images() {
  local archives="$work/image-archives" bin="$CAPI_LIBVIRT_CACHE/bin" command name copies=()
  mkdir -p "$archives"
  if ! gcc -Os -Wall -static "-DVERSION=$pause_version" -o "$work/pause" "$pause_source" >>"$build_log" 2>&1; then
    tail -n 30 "$build_log" >&2
    die "compiling $pause_source failed"
  fi
  strip "$work/pause"
  node_image "$archives/pause.tar" "$sandbox_image" --add "$work/pause=/pause" --entrypoint '["/pause"]' \
    --user 65535:65535
  for command in kube-apiserver kube-controller-manager kube-scheduler; do
    node_image "$archives/$command.tar" "registry.k8s.io/$command:$KUBERNETES_VERSION" \
      --add "$bin/$command-$KUBERNETES_VERSION=/usr/local/bin/$command" --entrypoint "[\"/usr/local/bin/$command\"]"
  done
  for name in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    copies+=(--copy "/usr/sbin/$name" --copy "/usr/sbin/${name/tables/tables-nft}" \
             --copy "/usr/sbin/${name/tables/tables-legacy}")
  done
  node_image "$archives/kube-proxy.tar" "registry.k8s.io/kube-proxy:$KUBERNETES_VERSION" \
    --add "$bin/kube-proxy-$KUBERNETES_VERSION=/usr/local/bin/kube-proxy" --entrypoint '["/usr/local/bin/kube-proxy"]' \
    --root "$root" "${copies[@]}" --copy /usr/sbin/conntrack --copy /etc/protocols \
    --copy-dir /usr/lib/x86_64-linux-gnu/xtables
  node_image "$archives/etcd.tar" "$etcd_image" --add "$etcd_binary=/usr/local/bin/etcd" \
    --entrypoint '["/usr/local/bin/etcd"]'
  # CoreDNS runs as root here: upstream's image is non-root with cap_net_bind_service on the binary, a file
  # capability this layer does not carry (kubeadm's Deployment adds NET_BIND_SERVICE either way).
  node_image "$archives/coredns.tar" "$coredns_image" --add "$coredns_binary=/coredns" --entrypoint '["/coredns"]'
  # flannel as its images lay it out: flanneld and install-conf in /opt/bin, iptables (as kube-proxy's) for its
  # masquerading; the CNI plugin image holds /flannel and the `cp` its init container runs.
  node_image "$archives/flannel.tar" "$flannel_image" --add "$flanneld_binary=/opt/bin/flanneld" \
    --add "$install_conf_binary=/opt/bin/install-conf" --entrypoint '["/opt/bin/flanneld"]' \
    --root "$root" "${copies[@]}" --copy /etc/protocols --copy-dir /usr/lib/x86_64-linux-gnu/xtables
  node_image "$archives/flannel-cni-plugin.tar" "$cni_plugin_image" --add "$cni_plugin_binary=/flannel" \
    --root "$root" --copy /usr/bin/cp --entrypoint '["/usr/bin/cp"]'
  # agnhost, for the tests' pods (netexec) that prove the pod network and Services, tagged as Kubernetes' e2e tests
  # name it (its VERSION file).
  node_image "$archives/agnhost.tar" "registry.k8s.io/e2e-test-images/agnhost:$(cat "$agnhost_version_file")" --add "$agnhost_binary=/agnhost" --entrypoint '["/agnhost"]'
  import_node_images "$archives"
  rm -rf "$archives" "$work/pause"
  log "images in the node image's containerd: $(tr '\n' ' ' <"$work/images.txt")"
}

# node_image ARCHIVE REF ARGS...: one image archive (hack/image-archive.py), its line in the build log.
node_image() {
  if ! python3 "$image_archive" "$@" >>"$build_log" 2>&1; then
    tail -n 20 "$build_log" >&2
    die "making the image $2 failed"
  fi
}

# import_node_images FOLDER: `ctr images import` of every archive there into the root's containerd store; the refs
# it then lists go to $work/images.txt (and into the image's READY file).
import_node_images() {
  local state="$work/containerd" pid tries=0 archive
  mkdir -p "$state"
  {
    echo 'version = 2'
    echo "root = \"$root/var/lib/containerd\""
    echo "state = \"$state/run\""
    echo 'disabled_plugins = ["io.containerd.grpc.v1.cri"]'
    echo '[grpc]'
    echo "  address = \"$state/containerd.sock\""
  } >"$state/config.toml"
  "$root/usr/bin/containerd" --config "$state/config.toml" >>"$build_log" 2>&1 &
  pid=$!
  until "$root/usr/bin/ctr" --address "$state/containerd.sock" version >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -ge 120 ] || ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$build_log" >&2
      die "the node root's containerd did not start"
    fi
    sleep 0.5
  done
  for archive in "$1"/*.tar; do
    if ! "$root/usr/bin/ctr" --address "$state/containerd.sock" -n k8s.io images import "$archive" \
        >>"$build_log" 2>&1; then
      kill "$pid"; wait "$pid" || true
      tail -n 20 "$build_log" >&2
      die "importing $archive into the node root's containerd failed"
    fi
  done
  "$root/usr/bin/ctr" --address "$state/containerd.sock" -n k8s.io images ls -q | sort >"$work/images.txt"
  kill "$pid"; wait "$pid" || true
  rm -rf "$state"
}

# make_node_disk RAW: an MBR disk of one bootable partition from 1 MiB to the end, the ext4 root in it (made from
# the root folder, no mount needed), syslinux's MBR code, and extlinux installed into the mounted partition.
make_node_disk() {
  local raw=$1
  local offset=$((partition_start_sectors * 512))
  truncate -s "$node_disk_size" "$raw"
  local size=$(($(stat -c %s "$raw") - offset))
  sfdisk -q "$raw" >>"$build_log" 2>&1 <<EOF
label: dos
start=$partition_start_sectors, size=$((size / 512)), type=83, bootable
EOF
  interruptible mkfs.ext4 -q -L root -O "$node_fs_features" -E "offset=$offset" -d "$root" "$raw" "$((size / 1024))k"
  dd if="$mbr_code" of="$raw" bs=440 count=1 conv=notrunc status=none
  loop_device=$(losetup -o "$offset" --sizelimit "$size" --find --show "$raw")
  partition_mount="$work/mnt"
  mkdir -p "$partition_mount"
  mount -t ext4 "$loop_device" "$partition_mount"
  interruptible extlinux --install "$partition_mount/boot/extlinux"
  release_partition
}

if [ "$flavor" = node ]; then
  configure_node
else
  # Keep the kernel and initrd beside the disk for direct kernel boot; /boot's copies are root-only.
  install -m 0644 "$kernel" "$work/vmlinuz"
  install -m 0644 "$initrd" "$work/initrd.img"
fi

# Trim what a guest never needs to save space in the image.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* "$root"/var/log/*.log \
  "$root"/var/log/apt/*

log "making the file system and the qcow2 disk ($((SECONDS - started)) s so far)"
if [ "$flavor" = node ]; then
  make_node_disk "$work/disk.raw"
else
  truncate -s "$disk_size" "$work/disk.raw"
  interruptible mkfs.ext4 -q -L root -d "$root" "$work/disk.raw"
fi
interruptible qemu-img convert -O qcow2 -c "$work/disk.raw" "$work/disk.qcow2"
rm -f "$work/disk.raw"
rm -rf --one-file-system "$root" "$work/mnt"
rm -f "$build_log"

{
  printf 'flavor=%s\nrecipe=%s\nsuite=%s\n' "$flavor" "$recipe_hash" "$suite"
  if [ "$flavor" = node ]; then
    printf 'kubernetes=%s\nsandbox=%s\n' "$KUBERNETES_VERSION" "$sandbox_image"
    printf 'images=%s\n' "$(tr '\n' ' ' <"$work/images.txt")"
  fi
  rm -f "$work/images.txt"
  printf 'built=%s\nseconds=%s\n' "$(date -u +%FT%TZ)" "$((SECONDS - started))"
} >"$work/$marker"
rm -rf "$out"   # an unfinished folder of this hash cannot exist (rename is atomic), but be sure
chmod 0755 "$work"
mv "$work" "$out"
trap - EXIT
log "ready in $((SECONDS - started)) s: $out"
echo "$out"
