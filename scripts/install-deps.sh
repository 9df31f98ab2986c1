#!/bin/sh
# Installs the Debian packages baton builds and tests with, when any is missing.
# Runs apt-get as root, or through sudo.
set -eu
pkgs="build-essential pkg-config libmicrohttpd-dev libjansson-dev libsqlite3-dev
      libcurl4-openssl-dev libcmocka-dev libpq-dev postgresql-15 sqlite3 curl python3 python3-yaml
      ${BATON_EXTRA_PKGS:-}"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing$missing" >&2
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
