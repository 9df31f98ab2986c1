#!/usr/bin/env bash
# tests/docker/podman-setup.sh - makes rootful podman work on a Debian 12 machine with no
# Docker engine and no reachable container registry (only the Debian archive), for
# tests/docker/run.sh. Run as root; prints the CONTAINERS_CONF path to export.
#
#  1. Installs what is missing, from Debian, as scripts/install-deps.sh does for make test:
#     podman, podman-compose, runc, debootstrap, iptables, uidmap, fuse-overlayfs,
#     slirp4netns, curl.
#  2. Writes $STATE/containers.conf with what such a machine needs: runc, not crun (crun 1.8
#     refuses cgroup v1/v2 hybrid hosts), the cgroupfs manager, a file events logger, and
#     default rlimits no higher than the hard limits (podman asks for 1048576 open files,
#     which fails without CAP_SYS_RESOURCE). /etc is left alone.
#  3. Makes the base image the Dockerfiles start FROM, debian:bookworm-slim, when podman
#     has none: debootstrap --variant=minbase bookworm from the host's own Debian mirror,
#     slimmed as the official image is, imported with `podman import` (1-2 minutes, once;
#     cached in podman's store and in $STATE).
#
#   bash tests/docker/podman-setup.sh     (STATE: BATON_PODMAN_STATE, /var/lib/baton-podman)
#
# Exit status: 0 ready (the path printed on stdout), 3 it could not be set up (why on
# stderr): tests/docker/run.sh then skips.
set -Eeuo pipefail

STATE=${BATON_PODMAN_STATE:-/var/lib/baton-podman}
BASE=docker.io/library/debian:bookworm-slim

say() { echo "podman-setup: $*" >&2; }
die() {
	say "$*"
	exit 3
}

[[ $(id -u) == 0 ]] || die "needs root (rootful podman)"
mkdir -p "$STATE"

# ---- 1. packages
need=()
for tool in podman podman-compose runc debootstrap iptables curl; do
	command -v "$tool" >/dev/null || need+=("$tool")
done
if ((${#need[@]})); then
	say "installing ${need[*]} (apt-get)"
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		"${need[@]}" uidmap fuse-overlayfs slirp4netns >/dev/null; } ||
		die "apt-get install ${need[*]} failed"
fi

# ---- 2. settings
nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
[[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
conf=$STATE/containers.conf
cat >"$conf.tmp.$$" <<EOF
# written by tests/docker/podman-setup.sh
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
mv -f "$conf.tmp.$$" "$conf"
export CONTAINERS_CONF=$conf

# ---- 3. the base image
# The host's bookworm mirror, from its apt sources (deb822 or one-line).
mirror() {
	local f m=""
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] || continue
		m=${m:-$(awk 'BEGIN { RS = ""; FS = "\n" } /Suites:[^\n]*bookworm( |$|\n)/ {
			for (i = 1; i <= NF; i++) if ($i ~ /^URIs:/) {
				sub(/^URIs:[ \t]*/, "", $i); split($i, u, " "); print u[1]; exit } }' "$f")}
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -f $f ]] || continue
		m=${m:-$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) {
			if ($(i + 1) == "bookworm") { print $i; exit } break } }' "$f")}
	done
	[[ -n $m ]] || die "no bookworm mirror in the host's apt sources"
	echo "$m"
}

# debootstrap, then what the official -slim image leaves out.
make_base_tar() {
	local tar=$1 root=$STATE/rootfs.$$ main
	main=$(mirror)
	say "debootstrap --variant=minbase bookworm from $main (1-2 minutes, once)"
	rm -rf "$root"
	debootstrap --variant=minbase bookworm "$root" "$main" >"$STATE/debootstrap.log" 2>&1 ||
		{
			rm -rf "$root"
			die "debootstrap failed; see $STATE/debootstrap.log"
		}
	rm -f "$root/etc/apt/sources.list"
	cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $main
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${main%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
	echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
	echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99no-check-valid-until"
	echo 'force-unsafe-io' >"$root/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
	rm -rf "$root"/usr/share/{man,info,groff,linda,locale}/* "$root"/var/cache/apt/archives/*.deb \
		"$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* "$root"/var/log/*.log \
		"$root"/var/log/apt/* "$root/debootstrap"
	: >"$root/etc/hostname"
	: >"$root/etc/resolv.conf"
	tar --numeric-owner -C "$root" -cf "$tar.tmp.$$" . && mv -f "$tar.tmp.$$" "$tar"
	rm -rf "$root"
}

exec 9>"$STATE/base.lock"
flock 9 # one preparation at a time
if ! podman image exists "$BASE"; then
	tar=$STATE/debian-bookworm-slim.tar
	[[ -s $tar ]] || make_base_tar "$tar"
	podman import -q --change 'CMD ["bash"]' "$tar" "$BASE" >/dev/null ||
		die "podman import failed"
	say "imported $BASE"
fi
podman tag "$BASE" docker.io/library/debian:12-slim localhost/debian:bookworm-slim ||
	die "podman tag failed"
timeout 60 podman info >/dev/null 2>&1 || die "podman info fails with $conf"
echo "$conf"
