# ModuleHost: build, test, run, benchmark, install. `make help` lists the targets.
SHELL := /bin/bash
SWIFT ?= swift
CONFIG ?= debug
PREFIX ?= /usr/local
BUILD := $(CURDIR)/build
JOBS ?= 2
# Plugins build in parallel; the Swift build before them uses every core by itself.
MAKEFLAGS += -j$(JOBS)
# CI builds with warnings as errors.
SWIFTFLAGS ?= $(if $(CI),-Xswiftc -warnings-as-errors,)

PLUGINS := $(patsubst Plugins/%/Makefile,%,$(wildcard Plugins/*/Makefile))

.PHONY: all help deps swift-build build sdk plugins test run bench peer-programs release install deb clean fuzz fuzz-build fuzz-smoke abi-dump abi-check abi-baseline
all: plugins

help:
	@echo "make            build the SDK, modhostd, modhostctl and every plugin in Plugins/ into build/"
	@echo "make run        build (debug), then run modhostd on build/plugins (Ctrl-C stops it)"
	@echo "make test       build, then run every test"
	@echo "make bench      build in release mode and write build/bench/results.json (BENCH_ARGS=\"--only peer\": one group)"
	@echo "make fuzz       run every libFuzzer target FUZZ_SECONDS (default 300) each; crash inputs in build/fuzz/crashes"
	@echo "make abi-check  compare ModuleKit's binary interface with the committed baseline (run by make test)"
	@echo "make abi-baseline  record the current ModuleKit ABI as the baseline (release step, docs/abi.md)"
	@echo "make install    build in release mode and install into PREFIX (default /usr/local)"
	@echo "make deb        build in release mode and package it: build/modulehost_VERSION_ARCH.deb"
	@echo "make clean      remove build/ and .build/"

# C libraries and tools from Debian packages: installed when missing and running as root,
# otherwise the exact command is printed.
# Optional: libpeas (GNOME's plugin engine), which make bench's peer rows compare modhostd
# with. Installed the same way, but never required: without it those rows are skipped.
BENCH_PEER_DEB := libpeas-dev
BENCH_PEER_PC := libpeas-1.0
deps:
	@missing=""; \
	pkg-config --exists libffi 2>/dev/null || missing="$$missing libffi-dev"; \
	command -v pkg-config >/dev/null || missing="$$missing pkg-config"; \
	command -v objcopy >/dev/null || missing="$$missing binutils"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v cc >/dev/null || missing="$$missing gcc"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "missing Debian packages:$$missing"; echo "run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi
	@pkg-config --exists $(BENCH_PEER_PC) 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing: $(BENCH_PEER_DEB) (optional: make bench's peer rows)"; \
	    { DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(BENCH_PEER_DEB); } \
	      || echo "could not install $(BENCH_PEER_DEB): make bench skips its peer rows"; \
	  else \
	    echo "optional Debian package missing: $(BENCH_PEER_DEB) (without it make bench skips its peer rows)"; \
	    echo "run: sudo apt-get install -y --no-install-recommends $(BENCH_PEER_DEB)"; \
	  fi; \
	}

# `make test` also builds the test bundle here, in the same step, so that the
# libModuleKit.so the tests load is the one the plugins were built against.
SWIFT_BUILD_TESTS := $(if $(filter test,$(MAKECMDGOALS)),--build-tests,)

swift-build: deps
	$(SWIFT) build -c $(CONFIG) $(SWIFT_BUILD_TESTS) $(SWIFTFLAGS)

build: sdk

BIN = $(shell $(SWIFT) build -c $(CONFIG) --show-bin-path)

# The trial loader is plain C and is built with cc, so that it links libc alone: SwiftPM
# links every executable against the Swift runtime, which would cost each trial load (one
# per plugin added while the daemon runs) the loading of libswiftCore and libstdc++. The
# SwiftPM product of the same sources is for embedders (docs/embedding.md).
TRIAL_CC = cc -O2 -g -Wall -Wextra -ISources/ModuleKit/Sources/CModuleHost/include -ISources/CSymbolOwnership/include \
	Sources/modhost-trial/main.c Sources/CSymbolOwnership/symbol_ownership.c

# Lay out what users run and what plugin authors build against, as `make install` does.
# Files are copied only when they changed, so plugins rebuild only for a new SDK, and a
# changed one is written beside its path and renamed over it: a modhostd running from
# build/ keeps the files it has mapped (rewritten in place, libModuleKit.so crashed it).
sdk: swift-build
	@bin="$(BIN)"; set -e; \
	mkdir -p $(BUILD)/bin $(BUILD)/lib/modulehost/swift $(BUILD)/include/modulehost $(BUILD)/share/modulehost $(BUILD)/lib/pkgconfig $(BUILD)/plugins; \
	copy() { cmp -s "$$1" "$$2" || { cp -f "$$1" "$$2.tmp" && mv -f "$$2.tmp" "$$2"; }; }; \
	for tool in modhostd modhostctl modhost-worker; do copy $$bin/$$tool $(BUILD)/bin/$$tool; done; \
	$(TRIAL_CC) -o $(BUILD)/bin/modhost-trial.new && copy $(BUILD)/bin/modhost-trial.new $(BUILD)/bin/modhost-trial; rm -f $(BUILD)/bin/modhost-trial.new; \
	copy $$bin/libModuleKit.so $(BUILD)/lib/libModuleKit.so; \
	for f in $$bin/Modules/ModuleKit.swiftmodule $$bin/Modules/ModuleKit.swiftinterface $$bin/Modules/ModuleKit.swiftdoc; do copy $$f $(BUILD)/lib/modulehost/swift/$$(basename $$f); done; \
	copy Sources/ModuleKit/Sources/CModuleHost/include/modulehost.h $(BUILD)/include/modulehost.h; \
	copy share/module.modulemap $(BUILD)/include/modulehost/module.modulemap; \
	copy share/plugin.mk $(BUILD)/share/modulehost/plugin.mk; \
	sed -e 's|@PREFIX@|$(BUILD)|' share/modulehost.pc.in > $(BUILD)/lib/pkgconfig/modulehost.pc.new; \
	copy $(BUILD)/lib/pkgconfig/modulehost.pc.new $(BUILD)/lib/pkgconfig/modulehost.pc; rm -f $(BUILD)/lib/pkgconfig/modulehost.pc.new

# Every Plugins/<Name> builds with the same plugin.mk an out-of-tree plugin uses.
plugins: $(addprefix plugin-,$(PLUGINS))

plugin-%: sdk
	@$(MAKE) --no-print-directory -C Plugins/$* MODHOST_SDK=$(BUILD) PLUGIN_DIR=$(BUILD)/plugins MODULES_DIR=$(BUILD)/plugin-modules OBJ_DIR=$(BUILD)/obj/$*

# Welcome imports Greeting's Swift module.
plugin-Welcome: plugin-Greeting

# Serially: many tests run real processes (modhostd, modhostctl, make, cc) and wait for
# them; run side by side on two cores, those waits starve the concurrency pool that
# deadline-based tests in the same process need (~30 s either way).
# The fuzz smoke run (about a minute) comes last and fails the run on a crash.
test: plugins
	@$(MAKE) --no-print-directory abi-check
	MODHOST_BUILD=$(BUILD) $(SWIFT) test -c $(CONFIG) --skip-build --no-parallel
	@$(FUZZ_BUILD_STEPS)
	$(FUZZ_RUN) $(FUZZ_SMOKE_SECONDS) smoke $(FUZZ_TARGETS)

# ModuleKit's binary interface against the committed baseline (docs/abi.md, "Swift plugin
# compatibility"). ModuleKit is built alone, optimized and without testing hooks (which
# would put internal declarations in the dump), in a build directory of its own.
# ABI_DEFINES adds compile-time conditions (the ABI upgrade test's changed ModuleKits).
ABI_DEFINES ?=
ABI_OUT := $(BUILD)/abi
ABI_SWIFT_BUILD = $(SWIFT) build -c release --package-path Sources/ModuleKit --scratch-path $(ABI_OUT)/.build \
	$(SWIFTFLAGS) $(foreach define,$(ABI_DEFINES),-Xswiftc -D$(define))
abi-dump:
	$(ABI_SWIFT_BUILD)
	Sources/ModuleKit/abi/check-abi dump "$$($(ABI_SWIFT_BUILD) --show-bin-path)" $(ABI_OUT)/ModuleKit.abi.json
abi-check: abi-dump
	Sources/ModuleKit/abi/check-abi compare $(ABI_OUT)/ModuleKit.abi.json
abi-baseline: abi-dump
	Sources/ModuleKit/abi/check-abi baseline $(ABI_OUT)/ModuleKit.abi.json

# libFuzzer targets (Tests/Fuzzing), built with the toolchain's own libFuzzer and
# AddressSanitizer runtimes in a build directory of their own. Optimized, since that
# keeps Swift's overflow and bounds traps and runs several times more inputs a second.
FUZZ_SECONDS ?= 300
FUZZ_SMOKE_SECONDS ?= 15
FUZZ_TARGETS ?= plugin-file manifest control-request configuration worker-frame
FUZZ_CONFIG ?= release
FUZZ_SCRATCH := $(BUILD)/fuzz/.build
# `--sanitize=fuzzer` keeps SwiftPM from renaming `main`, which libFuzzer provides; the
# -Xswiftc flag instruments every Swift module (two --sanitize options reach the compiler
# as the last one only).
FUZZ_SWIFT_BUILD = MODHOST_FUZZ=1 $(SWIFT) build -c $(FUZZ_CONFIG) --scratch-path $(FUZZ_SCRATCH) \
	--sanitize=fuzzer -Xswiftc -sanitize=fuzzer,address $(SWIFTFLAGS)
FUZZ_BUILD_STEPS = set -o pipefail; for target in $(FUZZ_TARGETS); do \
	  $(FUZZ_SWIFT_BUILD) --product fuzz-$$target 2>&1 | grep -v "Cannot export local symbol" || exit 1; \
	done
fuzz-build: deps
	@$(FUZZ_BUILD_STEPS)

FUZZ_RUN = FUZZ_BIN=$$($(FUZZ_SWIFT_BUILD) --show-bin-path) \
	FUZZ_OUT=$(BUILD)/fuzz Tests/Fuzzing/run-fuzzers

fuzz: fuzz-build
	$(FUZZ_RUN) $(FUZZ_SECONDS) long $(FUZZ_TARGETS)

fuzz-smoke: fuzz-build
	$(FUZZ_RUN) $(FUZZ_SMOKE_SECONDS) smoke $(FUZZ_TARGETS)

run: plugins
	@echo "make run: a debug build (CONFIG=$(CONFIG)); make install and make deb install release builds"
	$(BUILD)/bin/modhostd --plugins $(BUILD)/plugins --state-dir $(BUILD)/state --socket $(BUILD)/modhostd.sock

# The peer rows' C programs (Tests/Peer), built against the release SDK: peer-timer,
# peer-bare-host, peer-floor-host and peer-contained-loop always, peer-peas-host when
# libpeas is installed.
PEER_BIN := $(CURDIR)/build/release/bench
PEER_CFLAGS := -O2 -Wall -Wextra -I$(CURDIR)/build/release/include

$(PEER_BIN)/peer-timer: Tests/Peer/peer-timer.c
	@mkdir -p $(@D)
	cc $(PEER_CFLAGS) $< -o $@
$(PEER_BIN)/peer-bare-host: Tests/Peer/peer-bare-host.c Tests/Peer/peer-host.h Tests/Peer/peer-modhost.h
	@mkdir -p $(@D)
	cc $(PEER_CFLAGS) $< -o $@ -ldl
$(PEER_BIN)/peer-floor-host: Tests/Peer/peer-floor-host.c Tests/Peer/peer-host.h Tests/Peer/peer-modhost.h Sources/CDynamicLoader/crash_recorder.c
	@mkdir -p $(@D)
	cc $(PEER_CFLAGS) -ISources/CDynamicLoader/include $< Sources/CDynamicLoader/crash_recorder.c -o $@ -ldl -lpthread
$(PEER_BIN)/peer-contained-loop: Tests/Peer/peer-contained-loop.c Tests/Peer/peer-host.h
	@mkdir -p $(@D)
	cc $(PEER_CFLAGS) $< -o $@ -lpthread
$(PEER_BIN)/peer-peas-host: Tests/Peer/peer-peas-host.c Tests/Peer/peer-host.h
	@mkdir -p $(@D)
	cc $(PEER_CFLAGS) $$(pkg-config --cflags $(BENCH_PEER_PC)) $< -o $@ $$(pkg-config --libs $(BENCH_PEER_PC))

peer-programs: $(PEER_BIN)/peer-timer $(PEER_BIN)/peer-bare-host $(PEER_BIN)/peer-floor-host $(PEER_BIN)/peer-contained-loop
	@if pkg-config --exists $(BENCH_PEER_PC) 2>/dev/null; then $(MAKE) --no-print-directory $(PEER_BIN)/peer-peas-host; \
	else echo "$(BENCH_PEER_DEB) is not installed: no peer-peas-host, make bench skips its peer rows"; fi

# `make bench BENCH_ARGS="--only peer"` runs one group.
BENCH_ARGS ?=
bench:
	$(MAKE) --no-print-directory CONFIG=release BUILD=$(CURDIR)/build/release plugins
	$(MAKE) --no-print-directory peer-programs
	$(SWIFT) build -c release --product modhost-bench
	mkdir -p build/bench
	$$($(SWIFT) build -c release --show-bin-path)/modhost-bench --sdk $(CURDIR)/build/release --out build/bench/results.json \
	  --peer-programs $(PEER_BIN) --peer-sources $(CURDIR)/Tests/Peer $(BENCH_ARGS)

# make install and make deb ship a release build, made in build/release (as make bench's).
# PACKAGE_BUILD names a finished SDK layout to take the files from instead (the packaging
# test uses the test build).
RELEASE_BUILD := $(CURDIR)/build/release
PACKAGE_BUILD ?=
PACKAGE_FROM = $(or $(PACKAGE_BUILD),$(RELEASE_BUILD))
SYSCONFDIR ?= /etc

release:
	$(MAKE) --no-print-directory CONFIG=release BUILD=$(RELEASE_BUILD) sdk

# The example configuration becomes SYSCONFDIR/modhostd/modhostd.json (which the unit
# reads) only where there is none yet.
install: $(if $(PACKAGE_BUILD),,release)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/modulehost/swift $(DESTDIR)$(PREFIX)/include/modulehost \
	  $(DESTDIR)$(PREFIX)/share/modulehost $(DESTDIR)$(PREFIX)/share/doc/modulehost $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/lib/modulehost/plugins $(DESTDIR)$(SYSCONFDIR)/modhostd
	install -m 0755 $(PACKAGE_FROM)/bin/modhostd $(PACKAGE_FROM)/bin/modhostctl $(PACKAGE_FROM)/bin/modhost-trial $(PACKAGE_FROM)/bin/modhost-worker $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(PACKAGE_FROM)/lib/libModuleKit.so $(DESTDIR)$(PREFIX)/lib/
	install -m 0644 $(PACKAGE_FROM)/lib/modulehost/swift/* $(DESTDIR)$(PREFIX)/lib/modulehost/swift/
	install -m 0644 $(PACKAGE_FROM)/include/modulehost.h $(DESTDIR)$(PREFIX)/include/
	install -m 0644 $(PACKAGE_FROM)/include/modulehost/module.modulemap $(DESTDIR)$(PREFIX)/include/modulehost/
	install -m 0644 $(PACKAGE_FROM)/share/modulehost/plugin.mk $(DESTDIR)$(PREFIX)/share/modulehost/
	sed -e 's|/usr/local|$(PREFIX)|g' -e 's|--config /etc/|--config $(SYSCONFDIR)/|' share/modhostd.service > $(DESTDIR)$(PREFIX)/share/modulehost/modhostd.service
	sed -e 's|/usr/local|$(PREFIX)|g' share/modhostd.json.example > $(DESTDIR)$(PREFIX)/share/modulehost/modhostd.json.example
	[ -e $(DESTDIR)$(SYSCONFDIR)/modhostd/modhostd.json ] || \
	  install -m 0644 $(DESTDIR)$(PREFIX)/share/modulehost/modhostd.json.example $(DESTDIR)$(SYSCONFDIR)/modhostd/modhostd.json
	install -m 0644 README.md docs/*.md $(DESTDIR)$(PREFIX)/share/doc/modulehost/
	sed -e 's|@PREFIX@|$(PREFIX)|' share/modulehost.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/modulehost.pc

# A Debian package of the same files under /usr, with the unit, the example configuration
# as a conffile and maintainer scripts (share/debian/) that create the modhostd user and
# its state directory (docs/daemon.md, "The Debian package").
DEB_VERSION ?= $(shell sed -n 's/^Version: //p' share/modulehost.pc.in)
DEB_ARCH = $(shell dpkg --print-architecture)
DEB_OUT ?= $(BUILD)
DEB_MAINTAINER ?= ModuleHost maintainers <modulehost@example.org>
DEB_ROOT = $(DEB_OUT)/deb-root
DEB_FILE = $(DEB_OUT)/modulehost_$(DEB_VERSION)_$(DEB_ARCH).deb
deb: $(if $(PACKAGE_BUILD),,release)
	rm -rf $(DEB_ROOT)
	$(MAKE) --no-print-directory install PACKAGE_BUILD=$(PACKAGE_FROM) DESTDIR=$(DEB_ROOT) PREFIX=/usr SYSCONFDIR=/etc
	install -D -m 0644 $(DEB_ROOT)/usr/share/modulehost/modhostd.service $(DEB_ROOT)/lib/systemd/system/modhostd.service
	install -d -m 0755 $(DEB_ROOT)/DEBIAN
	install -m 0755 share/debian/postinst share/debian/prerm share/debian/postrm $(DEB_ROOT)/DEBIAN/
	echo /etc/modhostd/modhostd.json > $(DEB_ROOT)/DEBIAN/conffiles
	install -m 0644 share/debian/copyright $(DEB_ROOT)/usr/share/doc/modulehost/copyright
	printf 'modulehost (%s) unstable; urgency=medium\n\n  * Built from the ModuleHost sources with make deb.\n\n -- %s  %s\n' \
	  '$(DEB_VERSION)' '$(DEB_MAINTAINER)' "$$(date -R)" | gzip -9n > $(DEB_ROOT)/usr/share/doc/modulehost/changelog.gz
	chmod 0644 $(DEB_ROOT)/usr/share/doc/modulehost/changelog.gz
	strip --remove-section=.comment --remove-section=.note $(DEB_ROOT)/usr/bin/modhostd $(DEB_ROOT)/usr/bin/modhostctl $(DEB_ROOT)/usr/bin/modhost-trial $(DEB_ROOT)/usr/bin/modhost-worker
	strip --remove-section=.comment --remove-section=.note --strip-unneeded $(DEB_ROOT)/usr/lib/libModuleKit.so
	sed -e 's|@VERSION@|$(DEB_VERSION)|' -e 's|@ARCH@|$(DEB_ARCH)|' -e 's|@MAINTAINER@|$(DEB_MAINTAINER)|' \
	  -e "s|@SIZE@|$$(du -sk --exclude=DEBIAN $(DEB_ROOT) | cut -f1)|" \
	  -e 's|@DEPENDS@|libc6, libffi8, passwd|' \
	  -e "s|@SWIFT_RUNTIME@|$$(readelf -d $(PACKAGE_FROM)/bin/modhostd | sed -n 's/.*runpath: \[\([^:]*\).*/\1/p')|" \
	  share/debian/control.in > $(DEB_ROOT)/DEBIAN/control
	dpkg-deb --root-owner-group --build $(DEB_ROOT) $(DEB_FILE)

clean:
	rm -rf build .build
