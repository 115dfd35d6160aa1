# plugin.mk: builds a ModuleHost plugin. An author's whole Makefile is:
#
#     PLUGIN = MyPlugin
#     include $(shell pkg-config --variable=pluginmk modulehost)
#
# The directory holds plugin.json (the manifest: name, version, description, modules,
# dependencies, order, exports) and the sources: *.swift for a Swift plugin, *.c for a C
# plugin. `make` leaves build/libMyPlugin.so with the manifest embedded. Every flag the
# host needs (module name, SDK paths, soname, -z nodelete, manifest) is set here.

MODHOST_SDK ?= $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/../..)
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
OBJ_DIR ?= $(PLUGIN_DIR)/obj
SWIFTC ?= swiftc
CC ?= cc
CFLAGS ?= -O2 -g
SWIFTFLAGS ?= -Onone -g
OBJCOPY ?= objcopy
MODHOSTCTL ?= $(MODHOST_SDK)/bin/modhostctl

SDK_LIB := $(MODHOST_SDK)/lib/libModuleKit.so
TARGET := $(PLUGIN_DIR)/lib$(PLUGIN).so
UNSTAMPED := $(OBJ_DIR)/lib$(PLUGIN).so
MANIFEST := $(OBJ_DIR)/manifest.json

.PHONY: all clean
all: $(TARGET)

ifeq ($(LANGUAGE),swift)
# One Swift module per plugin, linked against the one shared libModuleKit.so. Its
# .swiftmodule goes to MODULES_DIR so that plugins depending on it can import it.
# include/modulehost holds the C ABI's module map. It is on the search path so that the
# compiler also finds it when it builds ModuleKit from ModuleKit.swiftinterface (when the
# installed .swiftmodule is from another compiler build).
$(UNSTAMPED): $(SOURCES) $(SDK_LIB) | $(OBJ_DIR) $(MODULES_DIR)
	$(SWIFTC) -emit-library -parse-as-library -swift-version 6 $(SWIFTFLAGS) \
	  -module-name $(PLUGIN) -module-link-name $(PLUGIN) \
	  -emit-module -emit-module-path $(MODULES_DIR)/$(PLUGIN).swiftmodule \
	  -I $(MODHOST_SDK)/lib/modulehost/swift -I $(MODULES_DIR) \
	  -I $(MODHOST_SDK)/include/modulehost \
	  -L $(MODHOST_SDK)/lib -L $(PLUGIN_DIR) -lModuleKit \
	  -Xlinker -soname=lib$(PLUGIN).so -Xlinker -z -Xlinker nodelete \
	  $(SOURCES) -o $@
else
# A C plugin needs only the header; -z defs reports unresolved symbols at build time.
$(UNSTAMPED): $(SOURCES) $(MODHOST_SDK)/include/modulehost.h | $(OBJ_DIR)
	$(CC) $(CFLAGS) -std=c11 -Wall -Wextra -fPIC -shared -fvisibility=hidden \
	  -I $(MODHOST_SDK)/include -L $(PLUGIN_DIR) \
	  -Wl,-soname,lib$(PLUGIN).so -Wl,-z,nodelete -Wl,-z,defs \
	  $(SOURCES) $(LDLIBS) -o $@
endif

# The manifest: plugin.json checked and completed with the ABI version, the language
# and, for Swift, what the plugin is built with and against: the compiler's version and
# the ModuleKit ABI version recorded in the libModuleKit.so it links.
$(MANIFEST): $(MANIFEST_SOURCE) $(SDK_LIB) | $(OBJ_DIR)
	$(MODHOSTCTL) manifest --language $(LANGUAGE) --sdk $(SDK_LIB) \
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

clean:
	rm -f $(TARGET) $(UNSTAMPED) $(MANIFEST)
