#!/bin/sh
# tests/docker/check-files.sh - what the container files promise, checked without a
# container engine (fast: part of `make test`; tests/docker/run.sh tests the image):
#  - docker/compose.yaml passes every BATON_* variable of batond (server/config.c's
#    table) through from the environment, and keeps the image's listen address and
#    database path when they are unset;
#  - the Dockerfile ships baton and its HEALTHCHECK is `baton ... health`; that very
#    command, run here by sh against a real batond, passes, and fails when nothing
#    listens on the port of BATON_LISTEN.
# Needs BATOND and BATON_CLIENT (absolute paths); closes with "N passed, N failed".
set -u
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/baton-docker-files-XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

# The variables batond reads: {"name", "BATON_X"} lines of config.c's env_names.
sed -n 's/^[[:space:]]*{"[a-z-]*", "\(BATON_[A-Z_]*\)"},$/\1/p' server/config.c | sort >"$work/want"
[ "$(wc -l <"$work/want")" -ge 10 ] && ok "config.c lists $(wc -l <"$work/want") BATON_* variables" ||
	bad "could not read the BATON_* variables of server/config.c"

# compose.yaml's environment of batond, each as NAME=VALUE.
python3 - docker/compose.yaml >"$work/compose" <<'PY' || bad "docker/compose.yaml does not parse"
import sys, yaml
env = yaml.safe_load(open(sys.argv[1]))["services"]["batond"]["environment"]
if isinstance(env, list):
    env = dict((e.split("=", 1) + [""])[:2] for e in env)
for k, v in env.items():
    print(f"{k}={v}")
PY
missing=""
for v in $(cat "$work/want"); do
	grep -q "^$v=\${$v:-" "$work/compose" || missing="$missing $v"
done
[ -z "$missing" ] && ok "compose passes every BATON_* variable through (\${VAR:-...})" ||
	bad "compose does not pass through:$missing"
grep -qx 'BATON_LISTEN=${BATON_LISTEN:-0.0.0.0:8080}' "$work/compose" &&
	grep -qx 'BATON_DB=${BATON_DB:-/data/baton.db}' "$work/compose" &&
	ok "compose keeps the image's listen address and database when unset" ||
	bad "compose's BATON_LISTEN / BATON_DB defaults"

grep -q '^COPY --from=build .*/bin/baton ' docker/Dockerfile && ok "the image ships baton" ||
	bad "the image does not ship baton"
# The HEALTHCHECK's CMD array, as one sh command line.
python3 - docker/Dockerfile >"$work/hc" <<'PY' || bad "no HEALTHCHECK CMD in the Dockerfile"
import json, re, sys
text = open(sys.argv[1]).read().replace("\\\n", " ")
cmd = json.loads(re.search(r"^HEALTHCHECK .*?CMD (\[.*\])$", text, re.M).group(1))
assert cmd[:2] == ["sh", "-c"], cmd
print(cmd[2])
PY
grep -q 'baton .*health' "$work/hc" && ok "HEALTHCHECK is baton health" ||
	bad "HEALTHCHECK does not use baton health: $(cat "$work/hc")"

# Run that command against a real batond, with baton on the PATH as in the image.
mkdir -p "$work/bin"
ln -s "$BATON_CLIENT" "$work/bin/baton"
"$BATOND" --listen 127.0.0.1:0 --db "$work/baton.db" 2>"$work/log" &
pid=$!
port=""
for _ in $(seq 1 200); do # 20 s at most
	port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/log")
	[ -n "$port" ] && break
	sleep 0.1
done
if [ -z "$port" ]; then
	bad "batond did not start: $(cat "$work/log")"
else
	PATH="$work/bin:$PATH" BATON_LISTEN="0.0.0.0:$port" timeout 10 sh -c "$(cat "$work/hc")" \
		>/dev/null 2>&1 && ok "the HEALTHCHECK passes against batond" ||
		bad "the HEALTHCHECK fails against a running batond"
	kill "$pid" && wait "$pid"
	pid=""
	PATH="$work/bin:$PATH" BATON_LISTEN="0.0.0.0:$port" timeout 10 sh -c "$(cat "$work/hc")" \
		>/dev/null 2>&1 && bad "the HEALTHCHECK passes with nothing listening" ||
		ok "the HEALTHCHECK fails when nothing listens"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
