#!/usr/bin/env bash
# Install the Debian packages the test bed and `make run` need (libvirt, QEMU, debootstrap, ...), once.
# Idempotent: when every package is already installed it returns in well under a second.
set -euo pipefail

packages=(
  libvirt-daemon-system libvirt-clients libvirt-dev pkg-config   # libvirtd, virsh, and headers for libvirt-python
  qemu-system-x86 qemu-utils                                     # the hypervisor (software emulation here) and qemu-img
  ovmf                                                           # UEFI firmware (firmware: uefi), found by libvirt's autoselection
  dnsmasq-base iptables iproute2                                 # the NAT network inside the test network namespaces
  iputils-ping                                                   # a bridged host pings its guests on the LAN (e2e)
  debootstrap e2fsprogs                                          # the guest images
  extlinux syslinux-common fdisk                                 # the node image's bootloader, MBR and partition
  gcc libc6-dev                                                  # the node image's sandbox (pause) program, static
  libxml2-utils                                                  # xmllint, behind virt-xml-validate (schema tests)
  apparmor                                                       # apparmor_parser: each guest's profile compiled as on Ubuntu
  openssl ca-certificates                                        # keys for the local kube-apiserver; test PKI
  openssh-server openssh-client                                  # qemu+ssh to test hosts (sshd in their namespace)
  ipxe                                                           # make bench: a guest that only takes a DHCP lease
  podman buildah runc uidmap                                     # make image: build the Dockerfile and run it, daemonless
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "install-system-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  echo "install-system-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

for tool in go python3 ip unshare; do
  command -v "$tool" >/dev/null || { echo "install-system-deps: missing prerequisite: $tool" >&2; exit 1; }
done
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "install-system-deps: python3 >= 3.11 required, found $(python3 -V)" >&2; exit 1; }
