#!/usr/bin/env bash
# tests/docker/run.sh - builds docker/Dockerfile and proves the image does what the
# README says: it serves on its published port, runs a workflow, stops cleanly on
# SIGTERM (exit 0, running step drained), keeps its workflows on the /data volume across
# a restart and a brand-new container, runs as non-root, ships baton, and its
# HEALTHCHECK (baton health) works. Then the cluster of docker/cluster.yaml:
# docker/postgres.Dockerfile built and started, three batond nodes on it, GET /nodes
# shows the three, a workflow posted to node 1, the node that drives its resource killed
# (SIGKILL) in the middle of a step, and the workflow finished by another node, read
# through the survivors. Those containers are started one by one as the file describes
# them (tests/docker/compose-args.py reads it), on a network of their own (the nodes find
# postgres through --add-host, see start_nodes), with BATON_LEASE_MS=3000 so that the
# takeover takes seconds; only the nodes' ports are published, on 127.0.0.1. Last, both
# compose files through the engine's compose tool, as README gives the commands
# (podman-compose with podman, docker compose with docker; compose_checks). The cluster
# adds about 20 s with a warm build cache (the first build of the PostgreSQL image, about
# 35 s more), the compose tool about 20 s.
#
#   bash tests/docker/run.sh            (as root where only podman can be set up)
#
# Engine, first that works: `docker` (a reachable daemon); else, as root, rootful podman
# set up by tests/docker/podman-setup.sh (Debian's podman and runc, and a
# debian:bookworm-slim made locally with debootstrap, for machines with no Docker engine
# and no registry: the builds then use that image and the host's network); else a
# working `podman`. BATON_TEST_ENGINE=docker|podman forces one. The engine's layer cache
# is kept, as after any build, so that reruns are fast.
#
# Skips (exit 0, "0 passed, 0 failed, 1 skipped") only when container tooling cannot
# start here: podman-setup.sh's exit 3, or no engine and not root.
# A failed build or check is a failure. All traffic goes to 127.0.0.1, every wait is
# bounded, and the containers, the volumes, the network and the images are removed at
# the end, also on failure (trap). Last line: "N passed, N failed"; exit status non-zero on any failure.

set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RUN_ID=baton-dtest-$(date +%Y%m%d%H%M%S)-$$
CTR=$RUN_ID
VOL=$RUN_ID-data
IMAGE=localhost/baton-dtest:$RUN_ID
TOKEN=dtest-$RANDOM$RANDOM$RANDOM
CPORT=8080
STOP_TIMEOUT=40 # > batond's 30 s shutdown timeout: SIGTERM must never become SIGKILL
STOP_LIMIT=15   # the longest step here is 2.5 s: a clean stop takes far less than this
# The cluster: containers $RUN_ID-postgres and $RUN_ID-batond-1..3, named as the
# services of docker/cluster.yaml, on the network $NET; volume $RUN_ID-baton-pg-data.
COMPOSE=$ROOT/docker/cluster.yaml
NET=$RUN_ID-net
PG_IMAGE=localhost/baton-dtest-pg:$RUN_ID
PG_CTR=$RUN_ID-postgres
PG_VOL=$RUN_ID-baton-pg-data
PG_PASSWORD=dtest${RANDOM}x$RANDOM
NODES=(1 2 3)
LEASE_MS=3000 # batond's minimum is 500; 3 s keeps a takeover short and lease renewal
# (every second) safe on a loaded CI machine
TMP=$(mktemp -d)
ENG="" LOCAL_BASE=0 IMAGE_OURS=0 PG_IMAGE_OURS=0 PORT="" CLEANED=0
declare -A NPORT=() # node number -> its published port on 127.0.0.1
pass=0 fail=0
NODE_CTRS=()
for n in "${NODES[@]}"; do NODE_CTRS+=("$RUN_ID-batond-$n"); done
T0=$(date +%s.%N)

say() { printf '[docker-test %(%H:%M:%S)T] %s\n' -1 "$*"; }
secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
ok() {
	pass=$((pass + 1))
	echo "ok   $*"
}
not_ok() {
	fail=$((fail + 1))
	echo "FAIL $*"
}
# check DESCRIPTION COMMAND...: one counted assertion.
check() {
	local what=$1
	shift
	if "$@"; then ok "$what"; else not_ok "$what"; fi
}
# Every engine call is bounded, so a wedged engine fails the test instead of hanging it.
eng() { timeout 300 "$ENG" "$@"; }
# quiet ENGINE-ARGS...: stderr only on failure (podman without systemd says "unable to
# get systemd connection" on every start of an image with a HEALTHCHECK; harmless).
quiet() {
	eng "$@" >/dev/null 2>"$TMP/engine.err" && return 0
	grep -v 'unable to get systemd connection' "$TMP/engine.err" | sed 's/^/    /'
	return 1
}

summary() {
	say "total $(secs "$T0")s"
	echo "$pass passed, $fail failed"
	((fail == 0))
}

skip() {
	echo "SKIP: $*"
	echo "SKIP: container tooling cannot start on this machine; the image was not tested"
	echo "0 passed, 0 failed, 1 skipped"
	exit 0
}

remove_all() {
	[[ -n $ENG ]] || return 0
	eng rm -f -v "$CTR" "$CTR-2" >/dev/null 2>&1
	eng rm -f -v -t 0 "${NODE_CTRS[@]}" "$PG_CTR" >/dev/null 2>&1 ||
		eng rm -f -v "${NODE_CTRS[@]}" "$PG_CTR" >/dev/null 2>&1
	eng volume rm -f "$VOL" "$PG_VOL" >/dev/null 2>&1
	eng network rm "$NET" >/dev/null 2>&1
	remove_project "$CPROJ"
	remove_project "$CLPROJ"
	# --no-prune: the tags go, the layers stay as the engine's build cache.
	((IMAGE_OURS)) && eng rmi -f --no-prune "$IMAGE" >/dev/null 2>&1
	((PG_IMAGE_OURS)) && eng rmi -f --no-prune "$PG_IMAGE" >/dev/null 2>&1
	return 0
}

on_exit() {
	local rc=$?
	((CLEANED)) || remove_all
	rm -rf "$TMP"
	exit "$rc"
}
trap on_exit EXIT
trap 'echo "interrupted"; exit 130' INT TERM

need_tools() {
	local missing=()
	command -v curl >/dev/null || missing+=(curl)
	command -v jq >/dev/null || missing+=(jq)
	((${#missing[@]})) || return 0
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
		say "installing ${missing[*]} with apt-get"
		{ timeout 600 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
			apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } || true
	fi
	for t in "${missing[@]}"; do
		command -v "$t" >/dev/null || {
			not_ok "the test needs $t on the host"
			summary
			exit 1
		}
	done
}

# ------------------------------------------------------------------ engine and build
engine_works() { command -v "$1" >/dev/null && timeout 20 "$1" info >/dev/null 2>&1; }

# Sets KIND: docker or podman; skips when neither can work here.
pick_engine() {
	KIND=${BATON_TEST_ENGINE:-}
	[[ -z $KIND ]] || return 0
	local conf
	if engine_works docker; then
		KIND=docker
	elif [[ $(id -u) == 0 ]]; then
		say "setting podman up: bash tests/docker/podman-setup.sh"
		conf=$(bash "$ROOT/tests/docker/podman-setup.sh") ||
			skip "tests/docker/podman-setup.sh could not set podman up (exit 3)"
		export CONTAINERS_CONF=$conf
		KIND=podman LOCAL_BASE=1
	elif engine_works podman; then
		KIND=podman
	else
		skip "no working docker or podman, and not root to set podman up"
	fi
}

# The build's options: podman keeps HEALTHCHECK only in the docker format; with the base
# image made here, nothing is pulled, and the build's apt-get uses the host's network.
build_args() {
	BUILD_ARGS=()
	[[ $ENG == podman ]] && BUILD_ARGS=(--format docker)
	((LOCAL_BASE)) && BUILD_ARGS+=(--pull=never --network host)
	return 0
}

build_direct() {
	local t log=$TMP/build.log
	t=$(date +%s.%N)
	build_args
	say "building: $ENG build ${BUILD_ARGS[*]}${BUILD_ARGS[*]:+ }-f docker/Dockerfile -t $IMAGE $ROOT"
	IMAGE_OURS=1
	if ! timeout 1800 "$ENG" build "${BUILD_ARGS[@]}" -f "$ROOT/docker/Dockerfile" -t "$IMAGE" \
		"$ROOT" >"$log" 2>&1; then
		tail -n 40 "$log" | sed 's/^/    /'
		not_ok "image builds ($ENG build)"
		return 1
	fi
	ok "image builds ($ENG build, $(secs "$t")s)"
}

# ------------------------------------------------------------------ helpers
# api METHOD PATH [BODY] [--no-token]: sets CODE, the answer is in $TMP/body.
api() {
	local method=$1 path=$2 body=${3:-} auth=(-H "Authorization: Bearer $TOKEN")
	[[ ${4:-} == --no-token ]] && auth=()
	local args=(-s -o "$TMP/body" -w '%{http_code}' --max-time 10 -X "$method" "${auth[@]}")
	[[ -n $body ]] && args+=(-H 'Content-Type: application/json' --data-binary "$body")
	CODE=$(curl "${args[@]}" "http://127.0.0.1:$PORT$path" 2>/dev/null) || CODE=000
}

running() { [[ $(eng inspect -f '{{.State.Running}}' "$1" 2>/dev/null) == true ]]; }

# wait_stopped CTR SECONDS: the container is no longer running.
wait_stopped() {
	local deadline=$(($(date +%s) + $2))
	while running "$1"; do
		(($(date +%s) < deadline)) || return 1
		sleep 0.1
	done
}

show_logs() {
	echo "    --- last lines of $1's log:"
	eng logs --tail 30 "$1" 2>&1 | sed 's/^/    /'
}

# The host port the engine picked for 127.0.0.1::8080 (re-read after every start).
read_port() {
	PORT=$(eng port "$1" "$CPORT/tcp" 2>/dev/null | sed -n '1s/.*://p')
	[[ $PORT =~ ^[0-9]+$ ]]
}

# wait_healthy CTR SECONDS: /healthz answers 200 through the published port.
wait_healthy() {
	local deadline=$(($(date +%s) + $2))
	read_port "$1" || return 1
	while (($(date +%s) < deadline)); do
		running "$1" || return 1
		api GET /healthz "" --no-token
		[[ $CODE == 200 ]] && return 0
		sleep 0.3
	done
	return 1
}

# wait_workflow ID SECONDS: polls until the workflow is finished; its JSON in $TMP/body.
wait_workflow() {
	local deadline=$(($(date +%s) + $2)) status
	while (($(date +%s) < deadline)); do
		api GET "/workflows/$1"
		status=$(jq -r .status "$TMP/body" 2>/dev/null)
		[[ $CODE == 200 && $status =~ ^(completed|failed|cancelled)$ ]] && return 0
		sleep 0.2
	done
	echo "    workflow $1 not finished after $2 s: HTTP $CODE $(head -c 400 "$TMP/body")"
	return 1
}

# wait_step_running ID INDEX SECONDS
wait_step_running() {
	local deadline=$(($(date +%s) + $3))
	while (($(date +%s) < deadline)); do
		api GET "/workflows/$1"
		[[ $CODE == 200 ]] && jq -e --argjson i "$2" '.steps[$i].status == "running"' \
			"$TMP/body" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}

jq_true() { jq -e "$@" >/dev/null 2>&1; }

# The HEALTHCHECK the container got from the image, run inside it with extra exec args.
# (Read from the container: podman's Docker-compatible API leaves it out of image
# inspect.)
# HC_JSON names the file that holds it ($TMP/hc.json by default).
run_healthcheck() {
	local ctr=$1
	shift
	local kind cmd=() hc=${HC_JSON:-$TMP/hc.json}
	kind=$(jq -r '.Test[0]' "$hc" 2>/dev/null)
	mapfile -t cmd < <(jq -r '.Test[1:][]' "$hc" 2>/dev/null)
	case $kind in
	CMD) eng exec "$@" "$ctr" "${cmd[@]}" ;;
	CMD-SHELL) eng exec "$@" "$ctr" /bin/sh -c "${cmd[0]}" ;;
	*) return 2 ;;
	esac
}

# A test that cannot fail is worse than none: the probe must notice a dead port.
healthcheck_fails_elsewhere() {
	! run_healthcheck "$CTR" -e BATON_LISTEN=0.0.0.0:1 >/dev/null 2>&1
}

# stop_clean CTR: SIGTERM (the image's STOPSIGNAL), then exit code 0 and a clean
# shutdown in the log, well inside the stop timeout (no SIGKILL).
stop_clean() {
	local t code el before
	before=$(eng logs "$1" 2>&1 | wc -l)
	t=$(date +%s.%N)
	eng stop -t "$STOP_TIMEOUT" "$1" >/dev/null 2>&1
	el=$(secs "$t")
	code=$(eng inspect -f '{{.State.ExitCode}}' "$1" 2>/dev/null)
	say "$1 stopped in ${el}s with exit code $code"
	check "$2: stop (SIGTERM) exits 0 within ${STOP_LIMIT}s (exit ${code:-?}, ${el}s)" \
		test "${code:-x}" = 0 -a "${el%.*}" -lt "$STOP_LIMIT"
	eng logs "$1" 2>&1 | tail -n +"$((before + 1))" >"$TMP/stoplog"
	check "$2: batond logged a clean SIGTERM shutdown" clean_shutdown_logged
	clean_shutdown_logged || sed 's/^/    /' "$TMP/stoplog" | tail -n 10
}

# The log lines of this run of the container end with batond's own shutdown.
clean_shutdown_logged() {
	grep -q 'SIGTERM: shutting down' "$TMP/stoplog" &&
		tail -n 1 "$TMP/stoplog" | grep -q 'INFO  stopped$'
}

# ------------------------------------------------------------------ the checks
check_image_config() {
	local cfg=$TMP/config.json
	eng image inspect -f '{{json .Config}}' "$IMAGE" >"$cfg" 2>/dev/null
	check "image: runs as a non-root user ($(jq -r .User "$cfg"))" \
		jq_true '(.User // "") as $u | $u != "" and ($u | test("^(0|root)(:|$)") | not)' "$cfg"
	check "image: ENTRYPOINT is batond, STOPSIGNAL SIGTERM" \
		jq_true '.Entrypoint == ["batond"] and ((.StopSignal // "SIGTERM") | ascii_upcase | test("^(SIGTERM|TERM|15)$"))' "$cfg"
	check "image: VOLUME /data, EXPOSE 8080" \
		jq_true '(.Volumes | has("/data")) and (.ExposedPorts | has("8080/tcp"))' "$cfg"
	check "image: BATON_LISTEN=0.0.0.0:8080 and BATON_DB=/data/baton.db" \
		jq_true '(.Env | index("BATON_LISTEN=0.0.0.0:8080")) and (.Env | index("BATON_DB=/data/baton.db"))' "$cfg"
}

# The compose files are validated where Compose v2 is installed (not on every machine).
check_compose_file() {
	if ! timeout 20 docker compose version >/dev/null 2>&1; then
		say "note: no 'docker compose' here; docker/compose.yaml and cluster.yaml not validated"
		return 0
	fi
	check "docker/compose.yaml is valid (docker compose config)" \
		timeout 60 docker compose -f "$ROOT/docker/compose.yaml" config -q
	check "docker/cluster.yaml is valid (docker compose config)" \
		env BATON_PG_PASSWORD=x timeout 60 docker compose -f "$ROOT/docker/cluster.yaml" config -q
}

start_first() {
	local t
	t=$(date +%s.%N)
	if ! eng volume create "$VOL" >/dev/null; then
		not_ok "volume $VOL created"
		return 1
	fi
	if ! quiet run -d --name "$CTR" -v "$VOL:/data" -p "127.0.0.1::$CPORT" \
		-e "BATON_TOKEN=$TOKEN" --stop-timeout "$STOP_TIMEOUT" "$IMAGE"; then
		not_ok "container starts with a named volume and a published port"
		return 1
	fi
	if ! wait_healthy "$CTR" 60; then
		not_ok "/healthz answers 200 on 127.0.0.1:${PORT:-?} within 60 s"
		show_logs "$CTR"
		return 1
	fi
	ok "container up, /healthz 200 on 127.0.0.1:$PORT without a token ($(secs "$t")s)"
}

check_runtime() {
	local status
	status=$(eng exec "$CTR" cat /proc/1/status 2>/dev/null)
	check "PID 1 is batond" [ "$(eng exec "$CTR" cat /proc/1/comm 2>/dev/null)" = batond ]
	check "PID 1 runs as non-root ($(awk '/^Uid:/ { print $2 "/" $3 }' <<<"$status"))" \
		awk '/^Uid:/ { u = ($2 != 0 && $3 != 0 && $4 != 0) } END { exit !u }' <<<"$status"
	check "PID 1 has no effective capabilities" \
		grep -Eq '^CapEff:[[:space:]]+0+$' <<<"$status"
	check "the database lives on the volume (/data/baton.db)" \
		eng exec "$CTR" test -s /data/baton.db
	eng container inspect -f '{{json .Config.Healthcheck}}' "$CTR" >"$TMP/hc.json" 2>/dev/null
	check "the image has a HEALTHCHECK ($(jq -c '.Test[0:2]' "$TMP/hc.json" 2>/dev/null)...)" \
		jq_true '(.Test | length > 1) and .Test[0] != "NONE"' "$TMP/hc.json"
	check "the image's HEALTHCHECK is baton health" \
		jq_true '.Test | tostring | test("baton .*health")' "$TMP/hc.json"
	check "the image ships baton, with BATON_URL at this batond" \
		eng exec "$CTR" baton health
	check "the image's HEALTHCHECK command passes" run_healthcheck "$CTR"
	check "the HEALTHCHECK command fails when nothing listens (BATON_LISTEN port 1)" \
		healthcheck_fails_elsewhere
	api GET /workflows "" --no-token
	check "BATON_TOKEN is enforced: /workflows without it answers 401 (got $CODE)" \
		[ "$CODE" = 401 ]
}

WF1='{"id": "docker-wf-1", "resource": "payment-gateway",
      "workers": [{"name": "worker-A", "work_ms": 50}, {"name": "worker-B", "work_ms": 50},
                  {"name": "worker-C", "work_ms": 50}]}'
# worker-A is still running when the container is stopped: SIGTERM must drain it.
WF2='{"id": "docker-wf-2", "resource": "payment-gateway",
      "workers": [{"name": "worker-A", "work_ms": 2500}, {"name": "worker-B", "work_ms": 50}]}'
WF1_OK='.id == "docker-wf-1" and .status == "completed" and .steps_completed == 3
	and ([.steps[].worker] == ["worker-A", "worker-B", "worker-C"])
	and ([.steps[].status] == ["completed", "completed", "completed"])
	and ([.steps[].attempts] == [1, 1, 1]) and ([.steps[].fencing_token] == [1, 2, 3])
	and .result.workersProcessed == 3'
WF2_OK='.id == "docker-wf-2" and .status == "completed" and .steps[0].attempts == 1
	and ([.steps[].status] == ["completed", "completed"])'

run_workflow() {
	local t
	t=$(date +%s.%N)
	api POST /workflows "$WF1"
	check "POST /workflows through the published port answers 201 (got $CODE)" [ "$CODE" = 201 ]
	if wait_workflow docker-wf-1 30 && jq_true "$WF1_OK" "$TMP/body"; then
		ok "docker-wf-1 completed: worker-A..C once each, fencing tokens 1..3 ($(secs "$t")s)"
		cp "$TMP/body" "$TMP/wf1.before"
	else
		not_ok "docker-wf-1 completed: worker-A..C once each, fencing tokens 1..3"
		head -c 1500 "$TMP/body" | sed 's/^/    /'
		echo
	fi
}

restart_same_container() {
	local t
	api POST /workflows "$WF2"
	check "POST docker-wf-2 answers 201 (got $CODE)" [ "$CODE" = 201 ]
	check "docker-wf-2's worker-A is running when the stop comes" \
		wait_step_running docker-wf-2 0 15
	stop_clean "$CTR" "restart"
	t=$(date +%s.%N)
	if ! quiet start "$CTR" || ! wait_healthy "$CTR" 60; then
		not_ok "the same container starts again on the same volume"
		show_logs "$CTR"
		return 1
	fi
	ok "the same container starts again, /healthz 200 on 127.0.0.1:$PORT ($(secs "$t")s)"
	check_survivors "after the restart"
	if wait_workflow docker-wf-2 30 && jq_true "$WF2_OK" "$TMP/body"; then
		ok "docker-wf-2 completed; the step running at SIGTERM was drained, not re-run"
	else
		not_ok "docker-wf-2 completed; the step running at SIGTERM was drained, not re-run"
		head -c 1500 "$TMP/body" | sed 's/^/    /'
		echo
	fi
}

# check_survivors WHEN: docker-wf-1 is still there, completed, and unchanged.
check_survivors() {
	api GET /workflows/docker-wf-1
	if [[ $CODE == 200 ]] && jq_true "$WF1_OK" "$TMP/body" && [[ -f $TMP/wf1.before ]] &&
		diff <(jq -S . "$TMP/wf1.before") <(jq -S . "$TMP/body") >/dev/null; then
		ok "$1: docker-wf-1 is still there, completed and unchanged"
	else
		not_ok "$1: docker-wf-1 is still there, completed and unchanged (HTTP $CODE)"
		head -c 1500 "$TMP/body" | sed 's/^/    /'
		echo
	fi
}

# A brand-new container on the same volume (the old one removed), hardened as the
# compose file runs it: the data lives in the volume, not in a container layer.
new_container_same_volume() {
	local t
	stop_clean "$CTR" "second stop"
	eng rm -f -v "$CTR" >/dev/null 2>&1
	t=$(date +%s.%N)
	if ! quiet run -d --name "$CTR-2" -v "$VOL:/data" -p "127.0.0.1::$CPORT" \
		-e "BATON_TOKEN=$TOKEN" --stop-timeout "$STOP_TIMEOUT" \
		--read-only --tmpfs /tmp --cap-drop=ALL --security-opt=no-new-privileges "$IMAGE" ||
		! wait_healthy "$CTR-2" 60; then
		not_ok "a new container (read-only root, no capabilities) starts on the same volume"
		show_logs "$CTR-2"
		return 1
	fi
	ok "a new container (read-only root, no capabilities) starts on the same volume ($(secs "$t")s)"
	check_survivors "in a new container"
	api GET '/workflows?resource=payment-gateway'
	check "the new container lists both workflows, completed" \
		jq_true '[.workflows[] | select(.status == "completed") | .id] | sort == ["docker-wf-1", "docker-wf-2"]' "$TMP/body"
	stop_clean "$CTR-2" "new container"
}

# ------------------------------------------------------------------ the cluster
# docker/postgres.Dockerfile, built as docker/cluster.yaml's postgres service builds it
# (context docker/).
build_pg_image() {
	local t log=$TMP/pg-build.log
	t=$(date +%s.%N)
	build_args
	say "building: $ENG build ${BUILD_ARGS[*]}${BUILD_ARGS[*]:+ }-f docker/postgres.Dockerfile -t $PG_IMAGE $ROOT/docker"
	PG_IMAGE_OURS=1
	if ! timeout 1800 "$ENG" build "${BUILD_ARGS[@]}" -f "$ROOT/docker/postgres.Dockerfile" \
		-t "$PG_IMAGE" "$ROOT/docker" >"$log" 2>&1; then
		tail -n 40 "$log" | sed 's/^/    /'
		not_ok "the PostgreSQL image builds ($ENG build docker/postgres.Dockerfile)"
		return 1
	fi
	ok "the PostgreSQL image builds (docker/postgres.Dockerfile, $(secs "$t")s)"
}

# run_service SERVICE CONTAINER [RUN-ARGS...]: `run -d` the service as docker/cluster.yaml
# says.
run_service() {
	local args=()
	if ! mapfile -d '' args < <(python3 "$ROOT/tests/docker/compose-args.py" \
		--set "BATON_TOKEN=$TOKEN" --set "BATON_LEASE_MS=$LEASE_MS" \
		--set "BATON_PG_PASSWORD=$PG_PASSWORD" --volume-prefix "$RUN_ID-" \
		--image "docker/Dockerfile=$IMAGE" --image "docker/postgres.Dockerfile=$PG_IMAGE" \
		"$COMPOSE" "$1") || ((${#args[@]} == 0)); then
		echo "    could not read service $1 of docker/cluster.yaml"
		return 1
	fi
	local svc=$1 ctr=$2
	shift 2
	# The service's name on the network, as compose gives it (a node's BATON_ADVERTISE_URL).
	quiet run -d --name "$ctr" --network "$NET" --network-alias "$svc" "$@" "${args[@]}"
}

# The image's own HEALTHCHECK (pg_isready on 127.0.0.1: the real server, not the one
# the first start sets up on the Unix socket only), until it passes.
pg_ready() {
	local deadline=$(($(date +%s) + $1))
	eng container inspect -f '{{json .Config.Healthcheck}}' "$PG_CTR" >"$TMP/pg-hc.json" 2>/dev/null
	while (($(date +%s) < deadline)); do
		running "$PG_CTR" || return 1
		HC_JSON=$TMP/pg-hc.json run_healthcheck "$PG_CTR" >/dev/null 2>&1 && return 0
		sleep 0.3
	done
	return 1
}

# pg_sql SQL [URL]: psql inside the PostgreSQL container, as postgres on its socket, or
# over TCP with URL (as batond connects).
pg_sql() { eng exec "$PG_CTR" psql -X -A -t -q -c "$1" ${2:+"$2"} 2>&1; }

start_postgres() {
	local t settings
	t=$(date +%s.%N)
	if ! quiet network create "$NET"; then
		not_ok "network $NET created"
		return 1
	fi
	if ! quiet volume create "$PG_VOL" || ! run_service postgres "$PG_CTR"; then
		not_ok "the postgres service starts (volume $PG_VOL, network $NET)"
		return 1
	fi
	if ! pg_ready 90; then
		not_ok "postgres: its HEALTHCHECK (pg_isready on 127.0.0.1:5432) passes within 90 s"
		show_logs "$PG_CTR"
		return 1
	fi
	ok "postgres up: initdb on its volume, HEALTHCHECK passes ($(secs "$t")s)"
	check "postgres: the cluster lives on the volume (PG_VERSION 15)" \
		[ "$(eng exec "$PG_CTR" cat /var/lib/postgresql/data/PG_VERSION 2>/dev/null)" = 15 ]
	settings=$(pg_sql "SELECT concat_ws(' ', current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('full_page_writes'),
		current_setting('listen_addresses'))")
	check "postgres: fsync, synchronous_commit, full_page_writes on; listens on * ($settings)" \
		[ "$settings" = "on on on *" ]
	check "postgres: baton logs in over TCP with its password (scram-sha-256)" \
		[ "$(pg_sql 'SELECT current_user' "postgresql://baton:$PG_PASSWORD@127.0.0.1:5432/baton")" = baton ]
	check "postgres: a wrong password is refused" \
		grep -q 'password authentication failed' \
		<<<"$(pg_sql 'SELECT 1' "postgresql://baton:wrong$PG_PASSWORD@127.0.0.1:5432/baton")"
	check "postgres: the superuser cannot log in over TCP" \
		grep -q 'rejects connection' \
		<<<"$(pg_sql 'SELECT 1' 'postgresql://postgres@127.0.0.1:5432/postgres')"
	check "postgres: no port published (got: $(eng port "$PG_CTR" 2>/dev/null | tr '\n' ' '))" \
		[ -z "$(eng port "$PG_CTR" 2>/dev/null)" ]
}

# The nodes find postgres by name, as in compose, but through /etc/hosts: podman 4.3's
# aardvark-dns drops lookups while containers join or leave the network (a lookup of
# postgres then takes 20-40 s of resolver timeouts), and batond connects lazily, on its
# engine thread, which that stalls (no inbox poll, no hand-over) for as long.
start_nodes() {
	local n t ctr ports pg_ip
	t=$(date +%s.%N)
	pg_ip=$(eng inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$PG_CTR" 2>/dev/null)
	if [[ ! $pg_ip =~ ^[0-9.]+$ ]]; then
		not_ok "postgres has an address on $NET (got '$pg_ip')"
		return 1
	fi
	for n in "${NODES[@]}"; do
		ctr=$RUN_ID-batond-$n
		if ! run_service "batond-$n" "$ctr" --add-host "postgres:$pg_ip" ||
			! wait_healthy "$ctr" 60; then
			not_ok "batond-$n starts on PostgreSQL, /healthz 200 within 60 s"
			show_logs "$ctr"
			return 1
		fi
		NPORT[$n]=$PORT
	done
	ok "three nodes up on PostgreSQL, /healthz 200 on 127.0.0.1:${NPORT[*]} ($(secs "$t")s)"
	ports=$(for n in "${NODES[@]}"; do eng port "$RUN_ID-batond-$n"; done 2>/dev/null)
	check "the nodes publish only 8080/tcp, only on 127.0.0.1" \
		awk 'NF { n++; if ($0 !~ /^8080\/tcp -> 127\.0\.0\.1:[0-9]+$/) bad = 1 }
			END { exit bad || n != 3 }' <<<"$ports"
}

# nodes_are N "IDS" SECONDS: GET /nodes through node N lists exactly IDS (sorted, space
# separated), whose partitions add up to all 64, each node at its fair share
# (ceil(64 / nodes)) or below.
nodes_are() {
	local deadline=$(($(date +%s) + $3))
	PORT=${NPORT[$1]}
	while (($(date +%s) < deadline)); do
		api GET /nodes
		[[ $CODE == 200 ]] && jq_true --arg ids "$2" \
			'([.nodes[].id] | sort | join(" ")) == $ids and ([.nodes[].partitions] | add) == 64
			and ((64 + (.nodes | length) - 1) / (.nodes | length) | floor) as $share
			| all(.nodes[]; .partitions <= $share)' \
			"$TMP/body" && return 0
		sleep 0.2
	done
	echo "    GET /nodes on node $1: HTTP $CODE $(jq -c '[.nodes[]? | [.id, .partitions]]' "$TMP/body" 2>/dev/null)"
	return 1
}

# What the cluster looked like, for a failed check: each live node's view of the nodes,
# the resource and the workflow, the partitions table, and the nodes' logs.
cluster_diag() {
	local n
	echo "    --- cluster state ($1)"
	for n in "${NODES[@]}"; do
		running "$RUN_ID-batond-$n" || continue
		PORT=${NPORT[$n]}
		api GET /nodes
		echo "    node-$n GET /nodes: $(jq -c '[.nodes[]? | [.id, .partitions, .resources, .running_steps]]' "$TMP/body" 2>/dev/null)"
		api GET /resources/cluster-ledger
		echo "    node-$n GET /resources/cluster-ledger: $(jq -c '{node, holder, waiters}' "$TMP/body" 2>/dev/null)"
		api GET /workflows/docker-cluster-wf
		echo "    node-$n GET /workflows/docker-cluster-wf: $(jq -c '[.status, [.steps[]? | [.status, .attempts, .fencing_token, .node]]]' "$TMP/body" 2>/dev/null)"
	done
	echo "    partitions (id:owner:epoch): $(pg_sql 'SELECT string_agg(id || $$:$$ || coalesce(owner, $$-$$) || $$:$$ || epoch, $$ $$ ORDER BY id) FROM partitions' "postgresql://baton:$PG_PASSWORD@127.0.0.1:5432/baton")"
	for n in "${NODES[@]}"; do show_logs "$RUN_ID-batond-$n"; done
}

WF3='{"id": "docker-cluster-wf", "resource": "cluster-ledger",
      "workers": [{"name": "step-0", "work_ms": 1500}, {"name": "step-1", "work_ms": 1500},
                  {"name": "step-2", "work_ms": 1500}, {"name": "step-3", "work_ms": 1500}]}'

# The workflow as the database holds it when the node that drove it died, and at the end:
# steps done before the kill are kept as they were; the step that was running runs again,
# as a new attempt with a higher fencing token, on a node that is alive; so does the rest.
FAILOVER_OK='($before[0]) as $b
	| ($b.steps | map(.status == "running") | index(true)) as $k
	| def kept: [.[] | {worker, attempts, fencing_token, node}];
	.status == "completed" and ([.steps[].status] | all(. == "completed"))
	and ([.steps[].fencing_token] as $f | [range(1; $f | length) | $f[.] > $f[. - 1]] | all)
	and $k != null
	and (.steps[:$k] | kept) == ($b.steps[:$k] | kept)
	and .steps[$k].attempts == $b.steps[$k].attempts + 1
	and .steps[$k].fencing_token > $b.steps[$k].fencing_token
	and ([.steps[$k:][].node] | all(. != $victim and . != null))'

cluster_failover() {
	local t k victim survivor other n
	PORT=${NPORT[1]}
	api POST /workflows "$WF3"
	check "POST the cluster workflow (4 steps of 1.5 s) to node 1 answers 201 (got $CODE)" \
		[ "$CODE" = 201 ]
	if ! wait_step_running docker-cluster-wf 1 30; then
		not_ok "the cluster workflow's step-1 is running within 30 s (read on node 1)"
		cluster_diag "step-1 not running"
		return 1
	fi
	api GET /resources/cluster-ledger
	victim=$(jq -r '.node // empty' "$TMP/body" 2>/dev/null)
	k=${victim#node-}
	if [[ ! " ${NODES[*]} " == *" $k "* ]]; then
		not_ok "GET /resources/cluster-ledger names the node that drives it (got ${victim:-none})"
		return 1
	fi
	api GET /workflows/docker-cluster-wf
	check "step-1 runs on $victim, the node GET /resources/cluster-ledger names" \
		jq_true --arg v "$victim" '.steps[1].node == $v' "$TMP/body"
	t=$(date +%s.%N)
	quiet kill "$RUN_ID-batond-$k"
	if ! wait_stopped "$RUN_ID-batond-$k" 20; then
		not_ok "podman kill stops $victim (batond-$k)"
		return 1
	fi
	ok "$victim (batond-$k, drives cluster-ledger, step-1 running) killed with SIGKILL"
	survivor="" other=""
	for n in "${NODES[@]}"; do
		((n == k)) && continue
		if [[ -z $survivor ]]; then survivor=$n; else other=$n; fi
	done
	PORT=${NPORT[$survivor]}
	api GET /workflows/docker-cluster-wf
	cp "$TMP/body" "$TMP/wf3.before"
	if wait_workflow docker-cluster-wf 90 &&
		jq_true --slurpfile before "$TMP/wf3.before" --arg victim "$victim" \
			"$FAILOVER_OK" "$TMP/body"; then
		ok "the workflow completed on node-$survivor/node-$other $(secs "$t")s after the kill:" \
			"steps done before it kept, the running one re-run with a higher fencing token"
	else
		not_ok "the workflow completed after the kill: steps done before it kept, the" \
			"running one re-run with a higher fencing token on a live node"
		echo "    at the kill: $(jq -c '[.steps[] | [.worker, .status, .attempts, .fencing_token, .node]]' "$TMP/wf3.before" 2>/dev/null)"
		echo "    now:         $(jq -c '[.status, [.steps[] | [.worker, .status, .attempts, .fencing_token, .node]]]' "$TMP/body" 2>/dev/null)"
		cluster_diag "after the kill of $victim"
	fi
	jq -S . "$TMP/body" >"$TMP/wf3.survivor" 2>/dev/null
	PORT=${NPORT[$other]}
	api GET /workflows/docker-cluster-wf
	check "node-$other reads the same finished workflow as node-$survivor" \
		diff <(jq -S . "$TMP/body" 2>/dev/null) "$TMP/wf3.survivor"
	api GET /resources/cluster-ledger
	check "GET /resources/cluster-ledger names a live node ($(jq -r .node "$TMP/body" 2>/dev/null))" \
		jq_true --arg v "$victim" '.node != null and .node != $v' "$TMP/body"
	check "GET /nodes on node-$survivor: the two live nodes share all 64 partitions (32 each)" \
		nodes_are "$survivor" "node-$survivor node-$other" 30
}

# SIGTERM for the nodes (exit 0, running steps drained), SIGINT (the image's STOPSIGNAL,
# a fast shutdown) for PostgreSQL, with the nodes gone or not.
stop_cluster() {
	local n code el t
	for n in "${NODES[@]}"; do
		running "$RUN_ID-batond-$n" && stop_clean "$RUN_ID-batond-$n" "batond-$n"
	done
	t=$(date +%s.%N)
	eng stop -t 30 "$PG_CTR" >/dev/null 2>&1
	el=$(secs "$t")
	code=$(eng inspect -f '{{.State.ExitCode}}' "$PG_CTR" 2>/dev/null)
	check "postgres: stop (SIGINT, fast shutdown) exits 0 within ${STOP_LIMIT}s (exit ${code:-?}, ${el}s)" \
		test "${code:-x}" = 0 -a "${el%.*}" -lt "$STOP_LIMIT"
}

cluster_checks() {
	local t
	t=$(date +%s.%N)
	build_pg_image || return 1
	start_postgres || return 1
	start_nodes || return 1
	if nodes_are 1 "node-1 node-2 node-3" 60; then
		ok "GET /nodes on node-1 lists node-1, node-2, node-3, sharing all 64 partitions (<= 22 each)"
	else
		not_ok "GET /nodes on node-1 lists node-1, node-2, node-3, sharing all 64 partitions (<= 22 each)"
		cluster_diag "three nodes started"
	fi
	cluster_failover
	stop_cluster
	say "cluster checks took $(secs "$t")s"
}

# ------------------------------------------------------------------ the compose tool
# README's compose commands as a user runs them: the engine's compose tool (Debian 12's
# podman-compose 1.0.3 with podman, Compose v2 with docker) on docker/compose.yaml and
# docker/cluster.yaml, with the images built above (BATON_IMAGE, BATON_PG_IMAGE: `up
# --no-build`), free ports on 127.0.0.1 (BATON_PORT*) and projects of this run's own.
CPROJ=$RUN_ID-one
CLPROJ=$RUN_ID-three
COMPOSE_CMD=()
CPORTS=()

pick_compose() {
	if [[ $ENG == podman ]] && command -v podman-compose >/dev/null; then
		COMPOSE_CMD=(podman-compose)
	elif [[ $ENG == docker ]] && timeout 20 docker compose version >/dev/null 2>&1; then
		COMPOSE_CMD=(docker compose)
	fi
	((${#COMPOSE_CMD[@]}))
}

# compose PROJECT FILE ARGS...: the compose tool, bounded, with this run's settings in
# its environment and nothing else of batond's (the test's shell may have BATON_*).
compose() {
	local proj=$1 file=$2
	shift 2
	(
		for v in $(compgen -e | grep '^BATON_'); do unset "$v"; done
		export BATON_IMAGE=$IMAGE BATON_PG_IMAGE=$PG_IMAGE BATON_PG_PASSWORD=$PG_PASSWORD \
			BATON_TOKEN=$TOKEN BATON_LEASE_MS=$LEASE_MS BATON_PORT=${CPORTS[0]} \
			BATON_PORT_1=${CPORTS[1]} BATON_PORT_2=${CPORTS[2]} BATON_PORT_3=${CPORTS[3]}
		timeout 300 "${COMPOSE_CMD[@]}" -p "$proj" -f "$ROOT/docker/$file" "$@"
	) >"$TMP/compose.log" 2>&1 && return 0
	grep -v 'unable to get systemd connection' "$TMP/compose.log" | tail -n 15 | sed 's/^/    /'
	return 1
}

# The container of SERVICE in PROJECT (both tools label them so).
compose_ctr() {
	eng ps -a --filter "label=com.docker.compose.project=$1" \
		--filter "label=com.docker.compose.service=$2" --format '{{.Names}}' 2>/dev/null |
		head -n 1
}

project_left() {
	eng ps -a -q --filter "label=com.docker.compose.project=$1" 2>/dev/null
	eng volume ls -q --filter "label=com.docker.compose.project=$1" 2>/dev/null
}

remove_project() {
	local ids
	ids=$(eng ps -a -q --filter "label=com.docker.compose.project=$1" 2>/dev/null)
	[[ -n $ids ]] && eng rm -f -v -t 0 $ids >/dev/null 2>&1
	ids=$(eng volume ls -q --filter "label=com.docker.compose.project=$1" 2>/dev/null)
	[[ -n $ids ]] && eng volume rm -f $ids >/dev/null 2>&1
	# podman-compose 1.0.3's down leaves the project's network.
	eng network rm "$1_default" >/dev/null 2>&1
	return 0
}

# Four ports that nothing listens on now, for BATON_PORT and BATON_PORT_1..3.
free_ports() {
	mapfile -t CPORTS < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(4)]
for s in ss:
    s.bind(("127.0.0.1", 0))
for s in ss:
    print(s.getsockname()[1])')
	((${#CPORTS[@]} == 4))
}

compose_down() {
	local t=(-t "$STOP_TIMEOUT")
	[[ ${COMPOSE_CMD[0]} == docker ]] && t=() # Compose v2 reads stop_grace_period
	compose "$1" "$2" down "${t[@]}"
}

compose_single() {
	local t ctr
	t=$(date +%s.%N)
	if ! compose "$CPROJ" compose.yaml up -d --no-build; then
		not_ok "${COMPOSE_CMD[*]} -f docker/compose.yaml up -d starts batond"
		return 1
	fi
	ctr=$(compose_ctr "$CPROJ" batond)
	if [[ -z $ctr ]] || ! wait_healthy "$ctr" 60 || [[ $PORT != "${CPORTS[0]}" ]]; then
		not_ok "${COMPOSE_CMD[*]} up: batond answers /healthz 200 on 127.0.0.1:\$BATON_PORT within 60 s"
		[[ -n $ctr ]] && show_logs "$ctr"
		return 1
	fi
	ok "${COMPOSE_CMD[*]} -f docker/compose.yaml up -d: /healthz 200 on 127.0.0.1:$PORT ($(secs "$t")s)"
	eng exec "$ctr" env >"$TMP/env" 2>/dev/null
	check "the variables set where compose ran reach batond, the unset ones stay unset" \
		jq_true -n --rawfile env "$TMP/env" --arg token "$TOKEN" '
			($env | split("\n") | map(select(startswith("BATON_")))) as $b
			| ($b | index("BATON_TOKEN=" + $token)) != null
			and (($b | any(startswith("BATON_THREADS") or startswith("BATON_NODE_ID"))) | not)'
	api GET /workflows "" --no-token
	local anon=$CODE
	api POST /workflows '{"id": "compose-wf", "resource": "compose-r", "workers": ["a", "b"]}'
	check "BATON_TOKEN is in force (GET /workflows without it: $anon), a workflow runs" \
		eval '[ "$anon" = 401 ] && [ "$CODE" = 201 ] && wait_workflow compose-wf 30 &&
			jq_true ".status == \"completed\"" "$TMP/body"'
	check "${COMPOSE_CMD[*]} down: batond gone, its volume kept" \
		eval 'compose_down "$CPROJ" compose.yaml && [ -z "$(compose_ctr "$CPROJ" batond)" ] &&
			eng volume inspect "${CPROJ}_baton-data" >/dev/null 2>&1'
	if compose "$CPROJ" compose.yaml up -d --no-build && ctr=$(compose_ctr "$CPROJ" batond) &&
		wait_healthy "$ctr" 60; then
		api GET /workflows/compose-wf
		check "up again on the same volume: the workflow is still there, completed" \
			jq_true '.status == "completed"' "$TMP/body"
	else
		not_ok "${COMPOSE_CMD[*]} up again on the same volume"
	fi
	compose_down "$CPROJ" compose.yaml >/dev/null
	remove_project "$CPROJ"
}

compose_cluster() {
	local t n ctr vols_before
	t=$(date +%s.%N)
	vols_before=$(eng volume ls -q 2>/dev/null | sort)
	if ! compose "$CLPROJ" cluster.yaml up -d --no-build; then
		not_ok "${COMPOSE_CMD[*]} -f docker/cluster.yaml up -d starts postgres and three nodes"
		return 1
	fi
	for n in "${NODES[@]}"; do NPORT[$n]=${CPORTS[$n]}; done
	# The nodes start before PostgreSQL accepts connections (podman-compose 1.0.3 does not
	# wait for service_healthy): they exit 1 and restart: until it does. They find it by
	# name, through podman's DNS, which can stall lookups for 20-40 s while containers
	# join the network (see start_nodes): a generous deadline.
	if nodes_are 1 "node-1 node-2 node-3" 180; then
		ok "${COMPOSE_CMD[*]} -f docker/cluster.yaml up -d: GET /nodes on node-1 lists node-1..3 ($(secs "$t")s)"
	else
		not_ok "${COMPOSE_CMD[*]} cluster: GET /nodes on node-1 lists node-1..3 within 180 s"
		for n in postgres batond-1 batond-2 batond-3; do
			ctr=$(compose_ctr "$CLPROJ" "$n")
			[[ -n $ctr ]] && show_logs "$ctr"
		done
		compose_down "$CLPROJ" cluster.yaml >/dev/null
		remove_project "$CLPROJ"
		return 1
	fi
	PORT=${NPORT[2]}
	api POST /workflows '{"id": "compose-cluster-wf", "resource": "compose-r", "workers": ["a", "b"]}'
	local posted=$CODE
	PORT=${NPORT[3]}
	check "a workflow posted to node-2 ($posted) completes, read on node-3" \
		eval '[ "$posted" = 201 ] && wait_workflow compose-cluster-wf 60 &&
			jq_true ".status == \"completed\"" "$TMP/body"'
	if compose_down "$CLPROJ" cluster.yaml; then
		check "${COMPOSE_CMD[*]} down: no container left, and no volume but ${CLPROJ}_baton-pg-data" \
			eval '[ -z "$(eng ps -a -q --filter label=com.docker.compose.project=$CLPROJ)" ] &&
				[ "$(comm -13 <(echo "$vols_before") <(eng volume ls -q | sort))" = "${CLPROJ}_baton-pg-data" ]'
	else
		not_ok "${COMPOSE_CMD[*]} -f docker/cluster.yaml down"
	fi
	remove_project "$CLPROJ"
}

compose_checks() {
	local t
	if ! pick_compose; then
		if [[ $ENG == podman ]]; then
			not_ok "podman-compose is installed (Debian's package podman-compose)"
		else
			say "note: no 'docker compose' here; the compose files were not run"
		fi
		return 0
	fi
	t=$(date +%s.%N)
	say "compose tool: ${COMPOSE_CMD[*]} ($("${COMPOSE_CMD[@]}" version 2>/dev/null | grep -i -m1 "compose.* version" | tr -s " "))"
	free_ports || {
		not_ok "four free ports on 127.0.0.1"
		return 0
	}
	compose_single
	if eng image inspect "$PG_IMAGE" >/dev/null 2>&1; then
		compose_cluster
	else
		not_ok "the cluster with ${COMPOSE_CMD[*]}: no PostgreSQL image was built"
	fi
	say "compose tool checks took $(secs "$t")s"
}

cleanup_checks() {
	remove_all
	CLEANED=1
	local left=()
	eng container inspect "$CTR" >/dev/null 2>&1 && left+=("$CTR")
	eng container inspect "$CTR-2" >/dev/null 2>&1 && left+=("$CTR-2")
	local c
	for c in "${NODE_CTRS[@]}" "$PG_CTR"; do
		eng container inspect "$c" >/dev/null 2>&1 && left+=("$c")
	done
	eng volume inspect "$VOL" >/dev/null 2>&1 && left+=("$VOL")
	eng volume inspect "$PG_VOL" >/dev/null 2>&1 && left+=("$PG_VOL")
	eng network inspect "$NET" >/dev/null 2>&1 && left+=("$NET")
	[[ -n $(project_left "$CPROJ") ]] && left+=("project $CPROJ")
	[[ -n $(project_left "$CLPROJ") ]] && left+=("project $CLPROJ")
	eng image inspect "$IMAGE" >/dev/null 2>&1 && left+=("$IMAGE")
	eng image inspect "$PG_IMAGE" >/dev/null 2>&1 && left+=("$PG_IMAGE")
	check "cleanup removed the containers, volumes, network and images${left:+ (left: ${left[*]})}" \
		[ ${#left[@]} = 0 ]
}

# ------------------------------------------------------------------ main
main() {
	need_tools
	pick_engine
	case $KIND in
	docker | podman)
		ENG=$KIND
		build_direct || {
			summary
			return
		}
		;;
	*)
		not_ok "BATON_TEST_ENGINE must be docker or podman, not \"$KIND\""
		summary
		return
		;;
	esac
	say "engine $ENG ($(eng --version 2>/dev/null | head -n 1)), image $IMAGE"
	check_compose_file
	check_image_config
	if start_first; then
		check_runtime
		run_workflow
		restart_same_container && new_container_same_volume
	fi
	cluster_checks
	compose_checks
	cleanup_checks
	summary
}

main "$@"
