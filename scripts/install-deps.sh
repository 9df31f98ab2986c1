#!/bin/sh
# Installs the Debian packages baton builds and tests with, when any is missing.
# Runs apt-get as root, or through sudo. Silent when everything is installed.
#
# postgresql-15 is the server the tests start themselves (scripts/pg.sh). Debian's
# postgresql-common would create and start a "main" cluster on port 5432 when it is first
# installed; it is told not to before postgresql-15 comes in, so no server runs that
# nobody started. faketime (libfaketime) steps batond's wall clock in test_clock. systemd
# brings systemd-analyze, with which tests/install/run.sh verifies the unit (it needs no
# running systemd). chromium is the browser of the console's tests (tests/browser/,
# driven by playwright-core from npm, with the machine's Node.js). BATON_BUILD_ONLY=1 (the
# image's build stage) leaves these out: building needs libpq's headers, not a server.
set -eu
testing="postgresql-15 faketime systemd chromium"
# Node.js and npm when the machine has none (the Debian packages; a Node.js installed
# otherwise brings its own npm, which Debian's would conflict with).
command -v node >/dev/null 2>&1 || testing="$testing nodejs npm"
[ "${BATON_BUILD_ONLY:-}" = 1 ] && testing=""
pkgs="build-essential pkg-config libmicrohttpd-dev libjansson-dev libsqlite3-dev
      libcurl4-openssl-dev libcmocka-dev sqlite3 curl python3 python3-yaml help2man
      libpq-dev $testing ${BATON_EXTRA_PKGS:-}"
conf=/etc/postgresql-common/createcluster.conf

installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=""
for p in $pkgs; do
	installed "$p" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing$missing" >&2
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
case " $missing " in
*" postgresql-15 "*)
	installed postgresql-common ||
		$sudo apt-get install -y -qq --no-install-recommends postgresql-common >/dev/null
	if ! grep -Eq '^[[:space:]]*create_main_cluster[[:space:]]*=[[:space:]]*false' "$conf"; then
		$sudo sed -i '/^[[:space:]]*create_main_cluster[[:space:]]*=/d' "$conf"
		echo "create_main_cluster = false" | $sudo tee -a "$conf" >/dev/null
	fi
	;;
esac
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
