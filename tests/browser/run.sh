#!/bin/sh
# The console's tests in a real browser (console.mjs), run once by make test, never under
# the sanitizers. Installs the npm packages that package-lock.json pins (npm ci) when
# node_modules is missing or older than the lock, then runs the tests against $BATOND.
# Without node, chromium or the packages the tests fail: they are never skipped.
# Closes with "N passed, N failed" and the stage's seconds.
set -u
here=$(cd "$(dirname "$0")" && pwd)
fail() {
	echo "FAILED: browser: $1"
	echo "0 passed, 1 failed"
	exit 1
}
[ -n "${BATOND:-}" ] || fail "BATOND is not set"
command -v node >/dev/null || fail "node is missing"
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] ||
	fail "no chromium at ${CHROMIUM:-/usr/bin/chromium} (scripts/install-deps.sh installs Debian's)"
t0=$(date +%s)
stamp="$here/node_modules/.package-lock.json"
if [ ! -f "$stamp" ] || [ "$here/package-lock.json" -nt "$stamp" ]; then
	(cd "$here" && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci failed"
fi
node "$here/console.mjs"
rc=$?
echo "browser: $(($(date +%s) - t0)) s"
exit $rc
