# plugin.mk: builds a ModuleHost plugin. An author's whole Makefile is:
#
#     PLUGIN = MyPlugin
#     include $(shell pkg-config --variable=pluginmk modulehost)
#
# The directory holds plugin.json (the manifest: name, version, description, modules,
# dependencies, order, exports) and the sources: *.swift for a Swift plugin, *.c for a C
# plugin. `make` leaves build/libMyPlugin.so with the manifest embedded; `make DEBUG=1`
# builds without optimization. The flags the host needs (module name, SDK paths, soname,
# -z nodelete) come from `modhostctl flags`, the same flags a CMake or SwiftPM build uses.

# This file's own path, taken now: MAKEFILE_LIST grows as the dependency file is included.
MODHOST_PLUGIN_MK := $(lastword $(MAKEFILE_LIST))
MODHOST_SDK ?= $(abspath $(dir $(MODHOST_PLUGIN_MK))/../..)
ifndef PLUGIN
$(error set PLUGIN = <Name> before including plugin.mk)
endif

SOURCES ?= $(wildcard *.swift) $(wildcard *.c)
ifeq ($(strip $(SOURCES)),)
$(error no *.swift or *.c sources in $(CURDIR): add them or set SOURCES)
endif
MANIFEST_SOURCE ?= plugin.json
LANGUAGE := $(if $(filter %.swift,$(SOURCES)),swift,c)
PLUGIN_DIR ?= build
MODULES_DIR ?= $(PLUGIN_DIR)/modules
# Intermediate files are per plugin, so plugins sharing a PLUGIN_DIR (a plugin and the
# plugins that depend on it) never see each other's.
OBJ_DIR ?= $(PLUGIN_DIR)/obj/$(PLUGIN)
SWIFTC ?= swiftc
CC ?= cc
OBJCOPY ?= objcopy
MODHOSTCTL ?= $(MODHOST_SDK)/bin/modhostctl
# Optimized with debug information by default; DEBUG=1 for an unoptimized build.
ifeq ($(DEBUG),1)
CFLAGS ?= -O0 -g
SWIFTFLAGS ?= -Onone -g
else
CFLAGS ?= -O2 -g
SWIFTFLAGS ?= -O -g
endif

SDK_LIB := $(MODHOST_SDK)/lib/libModuleKit.so
TARGET := $(PLUGIN_DIR)/lib$(PLUGIN).so
UNSTAMPED := $(OBJ_DIR)/lib$(PLUGIN).so
MANIFEST := $(OBJ_DIR)/manifest.json
DEPENDENCY_FILE := $(OBJ_DIR)/lib$(PLUGIN).d
COMMAND_FILE := $(OBJ_DIR)/command

HOST_FLAGS := $(shell $(MODHOSTCTL) flags --$(LANGUAGE) --plugin $(PLUGIN) --prefix $(MODHOST_SDK))
ifeq ($(strip $(HOST_FLAGS)),)
$(error `$(MODHOSTCTL) flags` printed nothing: set MODHOST_SDK to ModuleHost's install prefix (or a checkout's build/))
endif

.PHONY: all clean
all: $(TARGET)

ifeq ($(LANGUAGE),swift)
# One Swift module per plugin, linked against the one shared libModuleKit.so. Its
# .swiftmodule is copied to MODULES_DIR so that plugins depending on it can import it. The
# compiler's dependency file names every module imported (a dependency's .swiftmodule,
# ModuleKit's, the toolchain's), so a change to any of them rebuilds this plugin.
COMMAND = $(SWIFTC) $(HOST_FLAGS) $(SWIFTFLAGS) \
	  -emit-module -emit-module-path $(OBJ_DIR)/$(PLUGIN).swiftmodule -emit-dependencies \
	  -I $(MODULES_DIR) -L $(PLUGIN_DIR) $(SOURCES) $(LDLIBS)
$(UNSTAMPED): $(SOURCES) $(SDK_LIB) $(COMMAND_FILE) | $(OBJ_DIR) $(MODULES_DIR)
	$(COMMAND) -o $@
	@awk -v target='$@' 'NR == 1 { sub(/^[^:]*: */, ""); print target ": " $$0; n = split($$0, files, " "); \
	  for (i = 1; i <= n; i++) print files[i] ":" }' $(OBJ_DIR)/$(PLUGIN).emit-module.d > $(DEPENDENCY_FILE)
	@for f in swiftmodule swiftdoc; do cmp -s $(OBJ_DIR)/$(PLUGIN).$$f $(MODULES_DIR)/$(PLUGIN).$$f || \
	  cp -f $(OBJ_DIR)/$(PLUGIN).$$f $(MODULES_DIR)/$(PLUGIN).$$f; done
else
# A C plugin needs only the header; -z defs reports unresolved symbols at build time.
COMMAND = $(CC) $(HOST_FLAGS) $(CFLAGS) -Wall -Wextra -MMD -MP -MF $(DEPENDENCY_FILE) \
	  -L $(PLUGIN_DIR) $(SOURCES) $(LDLIBS)
$(UNSTAMPED): $(SOURCES) $(SDK_LIB) $(COMMAND_FILE) | $(OBJ_DIR)
	$(COMMAND) -o $@
endif

# The command line is recorded, so a change of flags (DEBUG=1, another SDK) rebuilds.
$(shell mkdir -p $(OBJ_DIR) && { printf '%s\n' '$(COMMAND)' | cmp -s - $(COMMAND_FILE) || printf '%s\n' '$(COMMAND)' > $(COMMAND_FILE); })

-include $(DEPENDENCY_FILE)

# The manifest: plugin.json checked and completed with the ABI version, the language
# and, for Swift, what the plugin is built with and against: the compiler's version and
# the ModuleKit ABI version recorded in the libModuleKit.so it links. --library checks
# that every function plugin.json exports is in the built file's dynamic symbol table.
$(MANIFEST): $(MANIFEST_SOURCE) $(SDK_LIB) $(UNSTAMPED) | $(OBJ_DIR)
	$(MODHOSTCTL) manifest --language $(LANGUAGE) --sdk $(SDK_LIB) --library $(UNSTAMPED) \
	  --swift-version "$$($(SWIFTC) --version 2>/dev/null | head -n 1)" $(MANIFEST_SOURCE) > $@.tmp
	mv $@.tmp $@

# Embed the manifest, then rename into place: a watched plugin directory never sees a
# half-written file.
$(TARGET): $(UNSTAMPED) $(MANIFEST)
	@mkdir -p $(PLUGIN_DIR)
	$(OBJCOPY) --add-section .modhost.manifest=$(MANIFEST) --set-section-flags .modhost.manifest=readonly $(UNSTAMPED) $@.tmp
	mv -f $@.tmp $@

$(OBJ_DIR) $(MODULES_DIR):
	mkdir -p $@

# Removes what this plugin's build made (its module interface too, which plugins that
# depend on it import), then the directories it leaves empty.
clean:
	rm -f $(TARGET) $(UNSTAMPED) $(MANIFEST) $(DEPENDENCY_FILE) $(COMMAND_FILE) \
	  $(MODULES_DIR)/$(PLUGIN).swiftmodule $(MODULES_DIR)/$(PLUGIN).swiftdoc
	rm -rf $(PLUGIN_DIR)/obj/$(PLUGIN)
	rmdir $(PLUGIN_DIR)/obj $(MODULES_DIR) $(PLUGIN_DIR) 2>/dev/null || true
