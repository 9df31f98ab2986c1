#!/bin/sh
# tests/install/run.sh - `make install` and `make uninstall` into temporary DESTDIRs.
#
# Installs with the default PREFIX and with PREFIX=/opt/baton, and checks: every file
# lands under DESTDIR/PREFIX; the installed batond and baton run (--version, --help);
# a small C program built only from the installed header, library and baton.pc
# (PKG_CONFIG_PATH into the DESTDIR; pkg-config --static, libbaton.a being static) opens
# an engine on a temporary database and runs, under umask 022, and the database and a
# backup copy it takes are 0600;
# the man pages hold every option of --help and name where README.md and openapi.yaml were
# installed (the documentation directory, PREFIX/share/doc/baton); the systemd unit runs the installed batond
# with its hardening, restarts without a start limit, and passes `systemd-analyze verify`
# (which finds a misspelt key);
# `make uninstall` removes exactly what install wrote and leaves other files alone.
# Closes with "N passed, N failed" (scripts/run-tests.sh). Run from the source tree.
set -u
# The default build, whatever the calling make had (SAN=... objects would need the
# sanitizer's runtime to link the test program), and none of its flags.
unset MAKEFLAGS MFLAGS MAKELEVEL
MAKE="${MAKE:-make} SAN= -j2"
passed=0
failed=0
work=$(mktemp -d "${TMPDIR:-/tmp}/baton-install-XXXXXX")
trap 'rm -rf "$work"' EXIT

ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
check() { # check WHAT COMMAND...: passes when COMMAND succeeds
	what=$1
	shift
	if "$@" >"$work/out" 2>&1; then ok "$what"; else bad "$what"; sed 's/^/  /' "$work/out"; fi
}

# The files install writes under DESTDIR, relative to PREFIX.
FILES="bin/batond bin/baton lib/libbaton.a include/baton.h lib/pkgconfig/baton.pc
share/man/man1/baton.1 share/man/man8/batond.8 lib/systemd/system/batond.service
share/doc/baton/README.md share/doc/baton/openapi.yaml"

# A program that includes baton.h and uses the engine (jansson, SQLite, threads).
cat >"$work/prog.c" <<'PROG'
#include <baton.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	baton_engine_config cfg = {.db_path = argv[1], .threads = 1, .readers = 1};
	baton_engine *e = NULL;
	baton_error err;
	json_t *doc = NULL;

	memset(&err, 0, sizeof err);
	if (argc != 2 || baton_engine_open(&cfg, &e, &err) != BATON_OK) {
		fprintf(stderr, "open: %s\n", err.msg);
		return 1;
	}
	if (baton_decode_json("{\"ok\": true}", 12, &doc, &err) != BATON_OK)
		return 1;
	printf("baton %s ready %d %s\n", BATON_VERSION, baton_engine_ready(e),
	       json_is_true(json_object_get(doc, "ok")) ? "json" : "?");
	json_decref(doc);
	char copy[4096];
	snprintf(copy, sizeof copy, "%s.copy", argv[1]);
	if (baton_engine_backup(e, copy, &err) != BATON_OK) {
		fprintf(stderr, "backup: %s\n", err.msg);
		return 1;
	}
	baton_engine_close(e, 0);
	return 0;
}
PROG

# Every --option of a program's --help appears in its man page (help2man writes \-).
options_in_man() { # options_in_man PROGRAM MANPAGE
	for opt in $("$1" --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
		sed 's/\\-/-/g' "$2" | grep -q -- "$opt" || { echo "$2 lacks $opt"; return 1; }
	done
}

# systemd-analyze verify (systemd 252 on Debian 12; scripts/install-deps.sh installs it)
# runs without a running systemd, as root in a plain shell or a container. It exits 0
# on a key it does not know or a value it cannot parse ("..., ignoring"), so any line
# it prints is a complaint. --man=no: Documentation='s page is not where man looks.
unit_verifies() {
	systemd-analyze verify --man=no "$1" >"$work/verify" 2>&1 || { cat "$work/verify"; return 1; }
	if grep . "$work/verify"; then return 1; fi
	return 0
}

not() { ! "$@"; }

# The value of KEY in [SECTION] of a unit file, empty when it has none.
unit_value() { # unit_value FILE SECTION KEY
	awk -v sec="[$2]" -v key="$3" '/^\[/ { in_sec = ($0 == sec) }
		in_sec && index($0, key "=") == 1 { v = substr($0, length(key) + 2) }
		END { print v }' "$1"
}

# one_prefix PREFIX: install, use, uninstall under a fresh DESTDIR.
one_prefix() {
	prefix=$1
	dest="$work/dest$(echo "$prefix" | tr / _)"
	root="$dest$prefix"
	mkdir -p "$root/bin"
	echo keep >"$root/bin/other-tool" # not ours: uninstall must leave it
	if ! $MAKE -s install DESTDIR="$dest" PREFIX="$prefix" >"$work/install.log" 2>&1; then
		bad "make install PREFIX=$prefix"
		sed 's/^/  /' "$work/install.log"
		return
	fi
	ok "make install PREFIX=$prefix"
	missing=""
	for f in $FILES; do [ -f "$root/$f" ] || missing="$missing $f"; done
	[ -z "$missing" ] && ok "all files under DESTDIR$prefix" || bad "missing:$missing"
	extra=$(cd "$dest" && find . -type f ! -path "./${prefix#/}/bin/other-tool" | wc -l)
	[ "$extra" -eq 10 ] && ok "nothing else written" || bad "install wrote $extra files, not 10"
	[ -x "$root/bin/batond" ] && [ -x "$root/bin/baton" ] && ok "programs executable" ||
		bad "programs not executable"

	v=$(grep '^#define BATON_VERSION' lib/baton.h | sed 's/.*"\(.*\)"/\1/')
	check "batond --version" sh -c "[ \"\$('$root/bin/batond' --version)\" = 'batond $v' ]"
	check "baton --version" sh -c "[ \"\$('$root/bin/baton' --version)\" = 'baton $v' ]"
	check "batond --help" sh -c "'$root/bin/batond' --help | grep -q '^usage: batond'"
	check "baton --help" sh -c "'$root/bin/baton' --help | grep -q '^usage: baton'"
	check "batond.8 true to --help" options_in_man "$root/bin/batond" "$root/share/man/man8/batond.8"
	check "baton.1 true to --help" options_in_man "$root/bin/baton" "$root/share/man/man1/baton.1"
	check "man pages are roff" sh -c "head -c 2000 '$root/share/man/man8/batond.8' | grep -q '^\.TH BATOND \"8\"'"
	for page in "$root/share/man/man1/baton.1" "$root/share/man/man8/batond.8"; do
		for section in '"EXIT STATUS"' SIGNALS ENVIRONMENT FILES '"SEE ALSO"'; do
			check "${page##*/} has the section $section" grep -qx ".SH $section" "$page"
		done
	done
	# The man pages send readers to the README and openapi.yaml: installed, as written.
	check "README.md installed as in the tree" cmp README.md "$root/share/doc/baton/README.md"
	check "openapi.yaml installed as in the tree" cmp openapi.yaml "$root/share/doc/baton/openapi.yaml"
	for page in "$root/share/man/man1/baton.1" "$root/share/man/man8/batond.8"; do
		check "${page##*/} names the installed README" grep -qF "$prefix/share/doc/baton/README.md" "$page"
	done
	check "baton.1: exit statuses 75 and 76 are items of their own" sh -c \
	    "grep -A1 -x '.TP' '$root/share/man/man1/baton.1' | grep -qx '.B 75' &&
	     grep -A1 -x '.TP' '$root/share/man/man1/baton.1' | grep -qx '.B 76'"

	pc="$root/lib/pkgconfig/baton.pc"
	check "baton.pc prefix=$prefix" grep -qx "prefix=$prefix" "$pc"
	check "baton.pc Requires: jansson" grep -qx "Requires: jansson" "$pc"
	want="Libs.private: $(echo $(pkg-config --libs sqlite3 libpq)) -lpthread -lm -ldl"
	check "baton.pc $want" grep -qxF "$want" "$pc"
	check "baton.pc has no Requires.private" sh -c "! grep -q '^Requires.private' '$pc'"
	# The installed tree only: pkg-config finds baton.pc in the DESTDIR and its prefix
	# is moved there (the files are not at PREFIX yet).
	export PKG_CONFIG_PATH="$root/lib/pkgconfig"
	pcv="pkg-config --define-variable=prefix=$root"
	check "pkg-config --modversion baton" sh -c "[ \"\$(pkg-config --modversion baton)\" = '$v' ]"
	if ${CC:-cc} -std=c11 $($pcv --cflags baton) -o "$work/prog" "$work/prog.c" \
		$($pcv --static --libs baton) >"$work/out" 2>&1; then
		ok "a program builds with pkg-config --cflags / --static --libs baton"
		check "it runs against libbaton.a" sh -c \
			"umask 022 && '$work/prog' '$work/prog.db' | grep -qx 'baton $v ready 1 json'"
		# Under umask 022 still its owner's only: the database and a backup copy.
		check "the database and its copy are 0600" sh -c \
			"[ \"\$(stat -c %a '$work/prog.db' '$work/prog.db.copy' | tr '\\n' ' ')\" = '600 600 ' ]"
	else
		bad "a program builds with pkg-config"
		sed 's/^/  /' "$work/out"
	fi
	unset PKG_CONFIG_PATH
	rm -f "$work/prog" "$work/prog.db"*

	unit="$root/lib/systemd/system/batond.service"
	check "unit runs the installed batond" grep -qx "ExecStart=$prefix/bin/batond" "$unit"
	lacks=""
	for k in DynamicUser=yes StateDirectory=baton NoNewPrivileges=yes ProtectSystem=strict \
		ProtectHome=yes PrivateTmp=yes Environment=BATON_DB=/var/lib/baton/baton.db; do
		grep -qx "$k" "$unit" || lacks="$lacks $k"
	done
	[ -z "$lacks" ] && ok "unit hardening" || bad "unit lacks$lacks"
	# batond exits 1 at once when PostgreSQL refuses it, for systemd to start it again:
	# no start limit, or systemd's default (5 starts in 10 s) would leave the unit failed
	# some 5 s into a database outage.
	restart="$(unit_value "$unit" Service Restart) $(unit_value "$unit" Service RestartSec)"
	restart="$restart $(unit_value "$unit" Unit StartLimitIntervalSec)"
	check "unit restarts on failure, every second, without a start limit" \
		test "$restart" = "on-failure 1 0"
	sed "s|^ExecStart=.*|ExecStart=$root/bin/batond|" "$unit" >"$work/batond.service"
	check "systemd-analyze verify: no complaint" unit_verifies "$work/batond.service"
	# The check can fail: a misspelt key is a complaint.
	sed 's/^StartLimitIntervalSec=/StartLimitIntervalSecs=/; s/^Restart=/Restartt=/' \
		"$work/batond.service" >"$work/broken.service"
	check "systemd-analyze verify: a misspelt key is a complaint" \
		not unit_verifies "$work/broken.service"

	if $MAKE -s uninstall DESTDIR="$dest" PREFIX="$prefix" >"$work/install.log" 2>&1; then
		left=$(cd "$dest" && find . -type f | sort)
		[ "$left" = "./${prefix#/}/bin/other-tool" ] && ok "uninstall removes exactly those" ||
			bad "after uninstall: $left"
	else
		bad "make uninstall"
		sed 's/^/  /' "$work/install.log"
	fi
}

one_prefix /usr/local
one_prefix /opt/baton
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
