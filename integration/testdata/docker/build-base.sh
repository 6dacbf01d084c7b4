#!/bin/sh
# build-base.sh IMAGE: make a Go builder image without any registry.
#
# No container registry is reachable on the test machines, so the public
# golang image cannot be pulled. This makes a stand-in from parts the host
# already has: a minimal Debian root filesystem (debootstrap minbase, from
# the host's own Debian mirror), the host's Go toolchain (/usr/local/go or
# $GOROOT) and the host's CA bundle. The Dockerfile then builds with
#   docker build --build-arg GO_IMAGE=IMAGE .
# The test calls this only when IMAGE does not exist yet (about 30 s).
set -eu

image=${1:-local/golang:bookworm}
suite=${SUITE:-bookworm}
goroot=${GOROOT:-/usr/local/go}
[ -x "$goroot/bin/go" ] || goroot=/usr/local/go
export PATH="$PATH:/usr/sbin:/sbin"

# The first non-security Debian mirror the host uses (deb822 or one-line
# format); $DEBIAN_MIRROR wins.
mirror=${DEBIAN_MIRROR:-$(
	{ grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
	  grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'
	} | grep -v security | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}

rootfs=$(mktemp -d "${TMPDIR:-/tmp}/greyrelay-base.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT

debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
	tail -n 30 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*

mkdir -p "$rootfs/usr/local" "$rootfs/etc/ssl/certs" "$rootfs/go"
cp -a "$goroot" "$rootfs/usr/local/go"
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"

# The same environment the public golang image sets, plus GOTOOLCHAIN=local:
# the toolchain must never try to download another one.
tar -C "$rootfs" -c . | docker import \
	--change 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV GOPATH=/go' \
	--change 'ENV GOTOOLCHAIN=local' \
	--change 'WORKDIR /go' \
	--change 'CMD ["bash"]' \
	- "$image" >/dev/null
echo "built $image from debootstrap $suite ($mirror) and $("$goroot/bin/go" version)"
