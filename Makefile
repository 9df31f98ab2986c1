# baton: one non-recursive Makefile.
#
#   make                 lib/libbaton.a, server/batond, client/baton
#   make run             start batond on its embedded default (./data/baton.db)
#   make test            unit tests (cmocka) and HTTP tests against the real batond, the
#                        HTTP tests once on SQLite and once on a throwaway PostgreSQL
#   make test STORE=sqlite | STORE=postgres   one store only (torture and torture-ci too)
#   make SAN=address,undefined test     the same under ASan+UBSan (objects in build/SAN/)
#   make SAN=thread test                the same under TSan
#   make install         batond, baton, libbaton.a + baton.h + baton.pc, man pages and a
#                        systemd unit under $(DESTDIR)$(PREFIX); make uninstall removes them
#
# Every target first makes sure the Debian packages it needs are installed
# (scripts/install-deps.sh, apt-get as root or through sudo).

PREFIX  ?= /usr/local
DESTDIR ?=
CC      ?= cc
SAN     ?=
PKGS     = libmicrohttpd jansson sqlite3 libpq libcurl

# Where `make install` puts things (each under $(DESTDIR)).
BINDIR         ?= $(PREFIX)/bin
LIBDIR         ?= $(PREFIX)/lib
INCLUDEDIR     ?= $(PREFIX)/include
MANDIR         ?= $(PREFIX)/share/man
DOCDIR         ?= $(PREFIX)/share/doc/baton
PKGCONFIGDIR   ?= $(LIBDIR)/pkgconfig
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system

# libbaton.a's pkg-config dependencies, the one place to add a package to baton.pc.
# LIB_PKGS_PUBLIC are those whose headers lib/baton.h includes: baton.pc's Requires (a
# program that includes baton.h needs their flags and libraries). The others are only
# the library's own: they go to Libs.private, as the flags that link their shared
# libraries (pkg-config --libs, when baton.pc is made), with LIB_LIBS_PRIVATE. A program
# links libbaton.a with `pkg-config --static --libs baton`. Not Requires.private: --static
# would then also add libpq's own Libs.private (-lpgcommon -lpgport ...), meant for a
# static libpq that Debian does not ship, and the link would fail.
LIB_PKGS         = jansson sqlite3 libpq
LIB_PKGS_PUBLIC  = jansson
LIB_LIBS_PRIVATE = -lpthread -lm -ldl
VERSION := $(shell sed -n 's/^\#define BATON_VERSION[ \t]*"\(.*\)"/\1/p' lib/baton.h)

ifeq ($(SAN),)
BUILD   := build/default
OUT     :=
else
BUILD   := build/$(SAN)
OUT     := $(BUILD)/
endif

# Recursively expanded on purpose: pkg-config runs only after the deps stamp exists.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   = $(shell pkg-config --libs $(PKGS))
CMOCKA_LIBS = $(shell pkg-config --libs cmocka)
# The test harness reads PostgreSQL databases (tests/harness/pg.c, tests/torture/audit.c).
PQ_CFLAGS = $(shell pkg-config --cflags libpq)
PQ_LIBS   = $(shell pkg-config --libs libpq)

WARN     = -Wall -Wextra -Werror -Wformat=2 -Wshadow -Wstrict-prototypes -Wno-unused-parameter
OPT     ?= -O2
SANFLAGS = $(if $(SAN),-fsanitize=$(SAN) -fno-sanitize-recover=all -fno-omit-frame-pointer,)
ALL_CFLAGS  = -std=c11 -D_GNU_SOURCE $(WARN) $(OPT) -g -MMD -MP $(SANFLAGS) -Ilib $(PKG_CFLAGS) $(PQ_CFLAGS) $(CFLAGS)
ALL_LDFLAGS = $(SANFLAGS) $(LDFLAGS)
LIBS_ALL    = $(PKG_LIBS) -lpthread -lm
# batond loads libcurl only when HTTP steps are allowed (lib/call.c), so it does not link it.
BATOND_LIBS = $(shell pkg-config --libs libmicrohttpd jansson sqlite3) -lpthread -lm -ldl

LIB_SRC    := $(wildcard lib/*.c)
SERVER_SRC := $(wildcard server/*.c)
CLIENT_SRC := $(wildcard client/*.c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
HTTP_SRC   := $(wildcard tests/http/test_*.c)
HARNESS_SRC := $(wildcard tests/harness/*.c)
# What the client, the benchmarks (bench/run.sh) and the test harness share.
COMMON_SRC := $(wildcard common/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIBBATON := $(OUT)lib/libbaton.a
BATOND   := $(OUT)server/batond
CLIENT   := $(OUT)client/baton
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRC))
HTTP_BIN := $(patsubst tests/http/%.c,$(BUILD)/tests/http/%,$(HTTP_SRC))
DEPS_STAMP := build/.deps-ok

.PHONY: all run test check screenshots demo demo-crash install uninstall man FORCE clean format format-check format-check-counted deps fuzz valgrind-test torture torture-ci bench bench-smoke
all: $(LIBBATON) $(BATOND) $(CLIENT)

deps: $(DEPS_STAMP)
$(DEPS_STAMP): scripts/install-deps.sh
	@sh scripts/install-deps.sh
	@mkdir -p $(@D) && touch $@

$(BUILD)/obj/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(LIBBATON): $(call obj,$(LIB_SRC))
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# The console's files (ui/), carried in batond as C arrays (scripts/embed-ui.py).
UI_FILES := $(sort $(wildcard ui/*.html ui/*.css ui/*.js ui/*.svg))
UI_C     := $(BUILD)/gen/ui_files.c
UI_OBJ   := $(BUILD)/obj/gen/ui_files.o
$(UI_C): $(UI_FILES) scripts/embed-ui.py | $(DEPS_STAMP)
	@mkdir -p $(@D)
	python3 scripts/embed-ui.py $@ $(UI_FILES)
$(UI_OBJ): $(UI_C)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Iserver -c $< -o $@

$(BATOND): $(call obj,$(SERVER_SRC)) $(UI_OBJ) $(LIBBATON)
	@mkdir -p $(@D)
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(BATOND_LIBS)

$(CLIENT): $(call obj,$(CLIENT_SRC) $(COMMON_SRC)) $(LIBBATON)
	@mkdir -p $(@D)
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_ALL)

$(BUILD)/tests/unit/%: $(BUILD)/obj/tests/unit/%.o $(LIBBATON)
	@mkdir -p $(@D)
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_ALL) $(CMOCKA_LIBS)

# test_wait tests server/wait.c, so it links the server's objects (but its main).
$(BUILD)/tests/unit/test_wait: $(BUILD)/obj/tests/unit/test_wait.o \
  $(call obj,$(filter-out server/main.c,$(SERVER_SRC))) $(UI_OBJ) $(LIBBATON)
	@mkdir -p $(@D)
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(BATOND_LIBS) $(CMOCKA_LIBS)

$(BUILD)/tests/http/%: $(BUILD)/obj/tests/http/%.o $(call obj,$(HARNESS_SRC) $(COMMON_SRC)) $(LIBBATON)
	@mkdir -p $(@D)
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_ALL) $(PQ_LIBS) $(CMOCKA_LIBS)

# A libcurl.so.4 that refuses an option baton needs, as too old a libcurl does: batond
# must refuse --allow-call with it (test_call_policy finds it beside its own directory).
OLDCURL := $(BUILD)/tests/oldcurl/libcurl.so.4
$(OLDCURL): tests/http/oldcurl.c | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) -std=c11 $(WARN) -g -fPIC -shared -Wl,-soname,libcurl.so.4 $(PKG_CFLAGS) $< -o $@
$(BUILD)/tests/http/test_call_policy: | $(OLDCURL)

# Crash torture: many workflows while batond is SIGKILLed and restarted at random moments;
# on PostgreSQL then a cluster of 3 nodes, one of them SIGKILLed, SIGSTOPped past its lease
# or SIGTERMed each round (TORTURE_ROUNDS). TORTURE_SEED=N replays a run's workload.
TORTURE_SRC    := $(wildcard tests/torture/*.c)
TORTURE_BIN    := $(BUILD)/tests/torture/torture
TORTURE_KILLS  ?= 200
TORTURE_ROUNDS ?= 60
# Which stores the HTTP suites and the torture run on: sqlite, postgres or both
# (scripts/test-stores.sh starts and stops the PostgreSQL server).
STORE ?= both
$(TORTURE_BIN): $(call obj,$(TORTURE_SRC)) $(call obj,$(HARNESS_SRC) $(COMMON_SRC))
	@mkdir -p $(@D)
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_ALL) $(PQ_LIBS) $(CMOCKA_LIBS)
# The lock's fault-injection suite (tests/http/test_lockfaults.c) runs each fault once in
# make test, the nodes' and the clients' network's; here faults chosen at random among them
# and PostgreSQL failing over, on a primary and its synchronous standby that the suite
# starts itself, for LOCKFAULTS_MINUTES minutes of faults (LOCKFAULTS_ROUNDS=N stops after
# N faults instead; LOCKFAULTS_SEED=N replays).
LOCKFAULTS_MINUTES ?= 20
LOCKFAULTS_ROUNDS ?=
LOCKFAULTS_BIN := $(BUILD)/tests/http/test_lockfaults
torture: $(BATOND) $(CLIENT) $(TORTURE_BIN) $(LOCKFAULTS_BIN)
	@BATOND=$(abspath $(BATOND)) BATON_CLIENT=$(abspath $(CLIENT)) TORTURE_KILLS=$(TORTURE_KILLS) \
	  TORTURE_ROUNDS=$(TORTURE_ROUNDS) LOCKFAULTS_ROUNDS=$(LOCKFAULTS_ROUNDS) \
	  LOCKFAULTS_MINUTES=$(if $(LOCKFAULTS_ROUNDS),,$(LOCKFAULTS_MINUTES)) STORE=$(STORE) \
	  sh scripts/test-stores.sh -- ./$(TORTURE_BIN) ./$(LOCKFAULTS_BIN)
torture-ci: $(BATOND) $(TORTURE_BIN)
	@BATOND=$(abspath $(BATOND)) TORTURE_KILLS=20 TORTURE_ROUNDS=20 STORE=$(STORE) \
	  sh scripts/test-stores.sh -- ./$(TORTURE_BIN)

# Benchmarks (bench/README.md): each figure beside its floor measured in the same run.
bench: all
	@BATOND=$(BATOND) CC="$(CC)" sh bench/run.sh
bench-smoke: all
	@BATOND=$(BATOND) CC="$(CC)" sh bench/run.sh --smoke

# batond in the foreground on its defaults (BATON_LISTEN, BATON_DB ... apply), its pid in
# data/batond.pid for `kill "$$(cat data/batond.pid)"`, which batond writes once it
# listens and removes when it stops (--pid-file); baton is built beside it.
run: $(BATOND) $(CLIENT)
	@echo "run: server $(BATOND), client $(CLIENT) (not on the PATH); pid in data/batond.pid"
	@exec ./$(BATOND) --pid-file data/batond.pid

# The unit tests, the OpenAPI check and, in the plain build only, the console's tests in
# a real browser (tests/browser/run.sh: Debian's chromium, npm ci) once; the HTTP suites
# on each store of STORE. SUITES="test_ops test_start" runs those HTTP suites only, and
# the browser tests only when SUITES names test_browser.
SUITES ?=
TEST_HTTP = $(if $(SUITES),$(filter $(addprefix $(BUILD)/tests/http/,$(SUITES)),$(HTTP_BIN)),$(HTTP_BIN))
TEST_BROWSER = $(if $(SAN),,$(if $(SUITES),$(if $(filter test_browser,$(SUITES)),tests/browser/run.sh),tests/browser/run.sh))
test: all $(UNIT_BIN) $(TEST_HTTP)
	@BATOND=$(abspath $(BATOND)) BATON_CLIENT=$(abspath $(CLIENT)) STORE=$(STORE) \
	  sh scripts/test-stores.sh $(UNIT_BIN) scripts/check-openapi.py tests/install/run.sh \
	  tests/docker/check-files.sh $(TEST_BROWSER) -- $(TEST_HTTP)
check: test

# The README's pictures of the console (docs/console-*.png), taken by its browser tests.
screenshots: all
	@BATOND=$(abspath $(BATOND)) SCREENSHOTS=docs sh tests/browser/run.sh

# The HTTP suites once more with batond under valgrind (memory errors, definite leaks).
# SQLite only (STORE does not apply): at valgrind's speed the suites run once, on the
# default store. One test is left out: test_limits' 17 results of 1 MB each take valgrind
# about 230 s, more than any whole suite, through the same allocations as results of any
# size; the sanitizers' runs keep it (ASan's leak check included).
# Two suites are left out whole: test_tty and test_cli test the client `baton` (in a
# terminal; its output for scripts), against a batond that does nothing there the other
# suites do not do; they run in make test and under both sanitizers.
VALGRIND_SKIP ?= test_results_past_the_workflow_cap_fail_the_step
VALGRIND_BIN := $(filter-out %/test_tty %/test_cli,$(HTTP_BIN))
valgrind-test: all $(VALGRIND_BIN)
	@BATOND=$(abspath scripts/valgrind-batond.sh) VALGRIND_BATOND=$(abspath $(BATOND)) \
	  BATON_CLIENT=$(abspath $(CLIENT)) BATON_TEST_PG= BATON_TEST_PG_DIR= JOBS=2 \
	  BATON_TEST_SKIP=$(VALGRIND_SKIP) sh scripts/run-tests.sh $(VALGRIND_BIN)

demo:
	@$(MAKE) -s all >/dev/null
	@sh scripts/demo.sh $(BATOND) $(CLIENT)
demo-crash:
	@$(MAKE) -s all >/dev/null
	@sh scripts/demo.sh $(BATOND) $(CLIENT) --crash

# Man pages from the programs' own --help and --version (help2man), so they cannot
# drift from what the programs say.
MAN_PAGES = $(BUILD)/man/baton.1 $(BUILD)/man/batond.8
man: $(MAN_PAGES)
# The sections --help has no room for (EXIT STATUS, SIGNALS, ENVIRONMENT, FILES, SEE ALSO)
# come from man/*.h2m, with @DOCDIR@ replaced by where install puts README.md and
# openapi.yaml (rewritten only when that changes, so the pages follow PREFIX).
$(BUILD)/man/%.h2m: man/%.h2m FORCE
	@mkdir -p $(@D)
	@sed 's|@DOCDIR@|$(DOCDIR)|g' $< > $@.tmp && { cmp -s $@.tmp $@ || mv $@.tmp $@; }; rm -f $@.tmp
$(BUILD)/man/baton.1: $(CLIENT) $(BUILD)/man/baton.h2m
	@mkdir -p $(@D)
	help2man -N -s 1 -n "client of batond, the durable serializer of shared resources" \
	  -i $(BUILD)/man/baton.h2m -o $@ ./$(CLIENT)
$(BUILD)/man/batond.8: $(BATOND) $(BUILD)/man/batond.h2m
	@mkdir -p $(@D)
	help2man -N -s 8 -n "durable workflows whose steps take turns on shared resources" \
	  -i $(BUILD)/man/batond.h2m -o $@ ./$(BATOND)

# Generated at every install: they hold PREFIX and the directories. In baton.pc the
# directories under PREFIX are written ${prefix}/..., so that pkg-config can move them
# (--define-variable=prefix=..., --define-prefix).
under_prefix = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
$(BUILD)/baton.pc: FORCE | $(DEPS_STAMP)
	@mkdir -p $(@D)
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(call under_prefix,$(LIBDIR))' \
	  'includedir=$(call under_prefix,$(INCLUDEDIR))' '' \
	  'Name: baton' \
	  'Description: durable workflows whose steps take turns on shared resources' \
	  'Version: $(VERSION)' 'Requires: $(LIB_PKGS_PUBLIC)' \
	  'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lbaton' \
	  'Libs.private: $(strip $(shell pkg-config --libs $(filter-out \
	    $(LIB_PKGS_PUBLIC),$(LIB_PKGS))) $(LIB_LIBS_PRIVATE))' > $@
$(BUILD)/batond.service: systemd/batond.service.in FORCE
	@mkdir -p $(@D)
	sed 's|@BINDIR@|$(BINDIR)|g' $< > $@
FORCE:

# What install writes, as installed path = source; uninstall removes exactly these files.
INSTALL_FILES = \
	$(BINDIR)/batond=$(BATOND):755 $(BINDIR)/baton=$(CLIENT):755 \
	$(LIBDIR)/libbaton.a=$(LIBBATON):644 $(INCLUDEDIR)/baton.h=lib/baton.h:644 \
	$(PKGCONFIGDIR)/baton.pc=$(BUILD)/baton.pc:644 \
	$(MANDIR)/man1/baton.1=$(BUILD)/man/baton.1:644 \
	$(MANDIR)/man8/batond.8=$(BUILD)/man/batond.8:644 \
	$(SYSTEMDUNITDIR)/batond.service=$(BUILD)/batond.service:644 \
	$(DOCDIR)/README.md=README.md:644 $(DOCDIR)/openapi.yaml=openapi.yaml:644
install_src = $(word 1,$(subst :, ,$(word 2,$(subst =, ,$(1)))))
install_dst = $(word 1,$(subst =, ,$(1)))
install_mode = $(lastword $(subst :, ,$(1)))

install: all $(MAN_PAGES) $(BUILD)/baton.pc $(BUILD)/batond.service
	@$(foreach f,$(INSTALL_FILES),\
	  echo "install $(call install_src,$(f)) $(DESTDIR)$(call install_dst,$(f))" && \
	  install -D -m $(call install_mode,$(f)) $(call install_src,$(f)) \
	    $(DESTDIR)$(call install_dst,$(f)) &&) true

uninstall:
	@$(foreach f,$(INSTALL_FILES),\
	  echo "rm -f $(DESTDIR)$(call install_dst,$(f))" && \
	  rm -f $(DESTDIR)$(call install_dst,$(f)) &&) true

# libFuzzer targets (clang), under ASan+UBSan, each run for FUZZ_SECONDS on a copy of
# its seed corpus (tests/fuzz/corpus/NAME: seeds and regression cases found so far).
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_FLAGS    = -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -g -O1
FUZZ_LIB_SRC := $(LIB_SRC)
FUZZ_SRV_SRC := $(filter-out server/main.c,$(SERVER_SRC))
build/fuzz/fuzz_request: tests/fuzz/fuzz_request.c $(FUZZ_LIB_SRC) | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE $(FUZZ_FLAGS) -Ilib $(PKG_CFLAGS) $^ -o $@ $(LIBS_ALL)
build/fuzz/fuzz_route: tests/fuzz/fuzz_route.c $(FUZZ_SRV_SRC) $(UI_C) $(FUZZ_LIB_SRC) | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE $(FUZZ_FLAGS) -Ilib -Iserver $(PKG_CFLAGS) $^ -o $@ $(LIBS_ALL)
build/fuzz/fuzz_answer: tests/fuzz/fuzz_answer.c $(FUZZ_LIB_SRC) | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE $(FUZZ_FLAGS) -Ilib $(PKG_CFLAGS) $^ -o $@ $(LIBS_ALL)
fuzz: build/fuzz/fuzz_request build/fuzz/fuzz_route build/fuzz/fuzz_answer
	@sh scripts/fuzz.sh $(FUZZ_SECONDS) request route answer

FORMAT_SRC = $(wildcard lib/*.[ch] server/*.[ch] client/*.[ch] common/*.[ch] tests/*/*.[ch] bench/*.[ch])
format:
	clang-format -i $(FORMAT_SRC)
format-check:
	clang-format --dry-run --Werror $(FORMAT_SRC)
format-check-counted:
	@if clang-format --dry-run --Werror $(FORMAT_SRC); then echo "1 passed, 0 failed"; \
	else echo "0 passed, 1 failed"; exit 1; fi

clean:
	rm -rf build lib/libbaton.a server/batond client/baton

.SECONDARY:

-include $(shell find build -name '*.d' 2>/dev/null)
