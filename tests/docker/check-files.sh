#!/bin/sh
# tests/docker/check-files.sh - what the container files promise, checked without a
# container engine (fast: part of `make test`; tests/docker/run.sh tests the image):
#  - docker/compose.yaml passes every BATON_* variable of batond (server/config.c's
#    table) through from the environment, as a name without a value (set where compose
#    runs: passed; unset: unset in the container), and keeps the image's listen address
#    and database path when they are unset; neither compose file has a `${VAR:-}`
#    (podman-compose 1.0.3 passes an empty default through literally);
#  - docker/cluster.yaml (postgres, batond-1..3) is wired as documented there;
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
    print(k if v is None else f"{k}={v}")
PY
missing=""
for v in $(cat "$work/want"); do
	case $v in
	BATON_LISTEN | BATON_DB) grep -q "^$v=\${$v:-" "$work/compose" ;;
	*) grep -qx "$v" "$work/compose" ;;
	esac || missing="$missing $v"
done
[ -z "$missing" ] && ok "compose passes every BATON_* variable through (a name without a value)" ||
	bad "compose does not pass through:$missing"
grep -n '\${[A-Za-z_][A-Za-z0-9_]*:\{0,1\}-}' docker/compose.yaml docker/cluster.yaml >"$work/empty" &&
	bad "an empty \${VAR:-} default (podman-compose 1.0.3 passes it literally): $(head -n 3 "$work/empty")" ||
	ok "no \${VAR:-} with an empty default in docker/compose.yaml or docker/cluster.yaml"
grep -qx 'BATON_LISTEN=${BATON_LISTEN:-0.0.0.0:8080}' "$work/compose" &&
	grep -qx 'BATON_DB=${BATON_DB:-/data/baton.db}' "$work/compose" &&
	ok "compose keeps the image's listen address and database when unset" ||
	bad "compose's BATON_LISTEN / BATON_DB defaults"

# The cluster (docker/cluster.yaml): PostgreSQL built from docker/postgres.Dockerfile,
# three nodes with their own BATON_NODE_ID and BATON_ADVERTISE_URL (their service's name
# on the compose network, where the others pass them requests), BATON_DB at the postgres
# service with the (required) password PostgreSQL was given, every other BATON_* variable
# passed through as for the lone batond, and nothing published but the nodes' ports on
# 127.0.0.1. No profiles: podman-compose 1.0.3 takes no --profile.
python3 - docker/compose.yaml docker/cluster.yaml "$work/want" >"$work/cluster" 2>&1 <<'PY' &&
import sys, yaml
one = yaml.safe_load(open(sys.argv[1]))["services"]["batond"]
doc = yaml.safe_load(open(sys.argv[2]))
want = open(sys.argv[3]).read().split()
svc = doc["services"]
assert set(svc) == {"postgres", "batond-1", "batond-2", "batond-3"}, sorted(svc)
assert not any("profiles" in s for s in svc.values()), "a service has profiles"
pg = svc["postgres"]
assert pg["build"] == {"context": ".", "dockerfile": "postgres.Dockerfile"}, pg["build"]
assert "ports" not in pg, "postgres publishes a port"
pw = pg["environment"]["POSTGRES_PASSWORD"]
assert pw.startswith("${BATON_PG_PASSWORD:?"), f"POSTGRES_PASSWORD is {pw}"
ids = set()
for n in (1, 2, 3):
    node = svc[f"batond-{n}"]
    env = node["environment"]
    assert node["build"] == one["build"], f"batond-{n} builds another image"
    assert node["image"] == one["image"], f"batond-{n} runs another image"
    assert node["depends_on"]["postgres"]["condition"] == "service_healthy"
    ids.add(env["BATON_NODE_ID"])
    assert env["BATON_ADVERTISE_URL"] == f"http://batond-{n}:8080", env["BATON_ADVERTISE_URL"]
    db = "postgresql://baton:${BATON_PG_PASSWORD:?set BATON_PG_PASSWORD}@postgres:5432/baton"
    assert env["BATON_DB"] == db, env["BATON_DB"]
    assert env["BATON_LISTEN"] == "0.0.0.0:8080", env["BATON_LISTEN"]
    for v in want:
        if v not in ("BATON_NODE_ID", "BATON_DB", "BATON_LISTEN", "BATON_ADVERTISE_URL"):
            assert v in env and env[v] is None, f"batond-{n}: {v} is not passed through"
    port = f"127.0.0.1:${{BATON_PORT_{n}:-{8080 + n}}}:8080"
    assert node["ports"] == [port], node["ports"]
    assert "/data" in (node.get("tmpfs") or []), f"batond-{n}: /data is an anonymous volume"
    assert "volumes" not in node, f"batond-{n} has volumes"
assert ids == {"node-1", "node-2", "node-3"}, ids
print("ok")
PY
	ok "cluster.yaml: postgres unpublished, node-1..3 on 127.0.0.1:8081..8083, BATON_DB at postgres" ||
	bad "docker/cluster.yaml: $(tail -n 3 "$work/cluster")"
grep -q '^FROM debian:bookworm-slim$' docker/postgres.Dockerfile &&
	grep -q 'postgresql-15' docker/postgres.Dockerfile &&
	ok "docker/postgres.Dockerfile: Debian's postgresql-15 on debian:bookworm-slim" ||
	bad "docker/postgres.Dockerfile is not Debian's postgresql-15 on debian:bookworm-slim"

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
