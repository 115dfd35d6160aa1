import Foundation
@testable import ModuleHost
import ModuleKit
import Testing
import TestSupport

/// docs/abi.md, "Versioning policy": a newer host reads only the fields an older plugin
/// compiled in (each struct says its size in `struct_size`), and refuses a struct too
/// small to hold ABI 1.0's fields with one line.
@Suite(.timeLimit(.minutes(5))) struct ABIMinorVersionTests {
    let dir = TemporaryDirectory("abi-minor")
    var factory: PluginFactory { PluginFactory(directory: dir.path) }
    var eventsFile: String { dir.file("events.txt") }

    /// A C plugin whose module descriptors are `old_module`, the layout of `modhost_module`
    /// cut after `fields` (as a plugin built against an older header has it), and whose
    /// struct_size says so. `pluginSize` replaces the plugin descriptor's struct_size.
    /// Each module appends "MODULE EVENT" to `eventsFile` for every event it handles.
    func olderPlugin(_ name: String, fields: String, pluginSize: String = "sizeof(modhost_plugin)",
                     minor: String = "MODHOST_ABI_MINOR", modules: [(String, String)]) -> String {
        let lower = name.lowercased()
        let descriptors = modules.map { module, version in
            "{sizeof(old_module), MODHOST_MODULE_C, \"\(module)\", \"\(version)\", notes, create, handle, destroy},"
        }.joined(separator: "\n")
        return """
            #include <modulehost.h>
            #include <stdio.h>
            typedef struct old_module {
                \(fields)
            } old_module;
            static const char *const notes[] = {"\(lower)-note", NULL};
            static const char *names[] = {\(modules.map { "\"\($0.0)\"" }.joined(separator: ", "))};
            static int next;
            static void *create(const modhost_host_api *host, const char *config) { (void)host; (void)config; return (void *)names[next++]; }
            static void handle(void *self, const char *event, const char *payload) {
                (void)payload;
                FILE *out = fopen("\(eventsFile)", "a");
                if (out) { fprintf(out, "%s %s\\n", (const char *)self, event); fclose(out); }
            }
            static void destroy(void *self) { (void)self; }
            static const old_module modules[] = {
            \(descriptors)
            };
            static const modhost_plugin plugin = {\(pluginSize), MODHOST_ABI_MAJOR, \(minor),
                sizeof(modules) / sizeof(modules[0]), "\(name)", (const modhost_module *)modules};
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
    }

    /// `modhost_module` without `swift_type` (and what 1.1 appended after it).
    static let fieldsBeforeSwiftType = """
        uint32_t struct_size; uint32_t kind; const char *name; const char *version;
        const char *const *notifications;
        void *(*create)(const modhost_host_api *, const char *);
        void (*handle_event)(void *, const char *, const char *);
        void (*destroy)(void *);
        """

    func build(_ name: String, _ source: String, modules: [String]) throws -> String {
        try factory.buildC(name, source: source, manifest: PluginFactory.manifest(plugin: name, modules: modules))
    }

    @Test func aPluginWhoseModuleStructEndsBeforeTheNewestFieldLoadsAndRuns() async throws {
        let file = try build("OlderMinor", olderPlugin("OlderMinor", fields: Self.fieldsBeforeSwiftType,
                                                       modules: [("older-a", "1.0"), ("older-b", "2.0")]),
                             modules: ["older-a", "older-b"])
        let load = try await StartupLoad(directories: [dir.path], host: HostInstance(name: "abi-minor"))
        #expect(load.refused.isEmpty, "\(load.refused)")
        let plugin = try #require(await load.set.plugin(named: "OlderMinor"))
        #expect(plugin.file.path == file)
        // The second module is read at the plugin's stride (56 bytes), not the host's (72).
        #expect(plugin.modules.map(\.factory.name) == ["older-a", "older-b"])
        #expect(plugin.modules.map(\.factory.version) == ["1.0", "2.0"])
        #expect(MemoryLayout<modhost_module>.size > ModuleDescriptor.minimumSize)

        // Its modules run in a host: every event reaches the function the plugin set.
        await load.set.start()
        await load.shutdown()
        let events = try String(contentsOfFile: eventsFile, encoding: .utf8).split(separator: "\n")
        for module in ["older-a", "older-b"] {
            #expect(events.filter { $0.hasPrefix(module + " ") }.map { String($0.dropFirst(module.count + 1)) }.prefix(2) == ["init", "start"])
            #expect(events.contains("\(module) deinit"[...]))
        }
    }

    /// A C plugin whose module "NAME" listens to "ping" and appends a line to `eventsFile`
    /// for every event: "KIND EVENT PAYLOAD" through `receive` (ABI 1.1) when `useReceive`,
    /// else "EVENT PAYLOAD" through `handle_event`. `header` is the header it includes.
    func eventPlugin(_ name: String, header: String, useReceive: Bool) -> String {
        """
        #include "\(header)"
        #include <stdio.h>
        static const char *const notes[] = {"ping", NULL};
        static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
        static void append(const char *line) {
            FILE *out = fopen("\(eventsFile)", "a");
            if (out) { fprintf(out, "%s\\n", line); fclose(out); }
        }
        static void handle(void *self, const char *event, const char *payload) {
            (void)self; char line[256];
            snprintf(line, sizeof line, "%s %s", event, payload ? payload : "-"); append(line);
        }
        #if MODHOST_ABI_MINOR >= 1
        static void receive(void *self, uint32_t kind, const char *event, const char *payload) {
            (void)self; char line[256];
            const char *kinds[] = {"?", "lifecycle", "custom", "notification"};
            snprintf(line, sizeof line, "%s %s %s", kind <= 3 ? kinds[kind] : "?", event, payload ? payload : "-"); append(line);
        }
        #endif
        static void destroy(void *self) { (void)self; }
        static const modhost_module modules[] = {{
            .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "\(name.lowercased())", .version = "1.0",
            .notifications = notes, .create = create, .destroy = destroy,
            \(useReceive ? ".receive = receive" : ".handle_event = handle"),
        }};
        static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(name)", modules);
        MODHOST_PLUGIN_ENTRY { return &plugin; }
        """
    }

    /// Loads the one plugin in `dir`, runs it in a host through every kind of event, and
    /// returns the lines its module wrote.
    func runThroughEveryKindOfEvent(module: String) async throws -> [String] {
        let load = try await StartupLoad(directories: [dir.path], host: HostInstance(name: "abi-kinds"))
        #expect(load.refused.isEmpty, "\(load.refused)")
        try #require(load.loaded.count == 1)
        let host = load.host
        await load.set.start()
        await host.post(notification: "ping", payload: ["n": 1])
        await host.send(ModuleEvent.custom(name: "ping", payload: 2), to: module)
        await host.send(AsyncModuleEvent.custom(name: "willLogout", payload: .null))
        await load.shutdown()
        return try String(contentsOfFile: eventsFile, encoding: .utf8).split(separator: "\n").map(String.init)
    }

    /// docs/abi.md, "Versioning policy", ABI 1.1: a C module that sets `receive` learns the
    /// kind of each event: a notification it listens to and a custom event of the same name
    /// are told apart, and the host's lifecycle events are marked as such.
    @Test func aModuleThatSetsReceiveLearnsTheKindOfEachEvent() async throws {
        let header = BuildProducts.directory + "/include/modulehost.h"
        _ = try build("Kinds", eventPlugin("Kinds", header: header, useReceive: true), modules: ["kinds"])
        #expect(try await runThroughEveryKindOfEvent(module: "kinds") == [
            "lifecycle init -", "lifecycle start -", "notification ping {\"n\":1}", "custom ping 2", "custom willLogout -",
            "lifecycle willTerminate -", "lifecycle deinit -",
        ])
    }

    /// A plugin built against the 1.0 header (kept as Tests/Fixtures/modulehost-1.0.h) still
    /// loads in this host and its handle_event gets every event, as before.
    @Test func aPluginBuiltAgainstThe10HeaderLoadsAndBehavesAsBefore() async throws {
        let header = Self.fixtures + "/modulehost-1.0.h"
        let file = try factory.buildC("Older", source: eventPlugin("Older", header: header, useReceive: false),
                                      manifest: PluginFactory.manifest(plugin: "Older", modules: ["older"], abi: "1.0"))
        #expect(try PluginFactory.embeddedManifest(file).contains("\"abi\":\"1.0\""))
        #expect(try await runThroughEveryKindOfEvent(module: "older") == [
            "init -", "start -", "ping {\"n\":1}", "ping 2", "willLogout -", "willTerminate -", "deinit -",
        ])
        // It is a 1.0 plugin: its descriptors are 1.0's size and say minor 0.
        let library = try DynamicLibrary(path: file)
        let entry = try library.symbol("modhost_plugin_entry_v1").get()
        let descriptor = try PluginDescriptor(unsafeBitCast(entry, to: (@convention(c) () -> UnsafeRawPointer?).self)()!)
        #expect(descriptor.abiMinor == 0)
        #expect(try descriptor.moduleDescriptors().map(\.structSize) == [ABIField(pointer: \modhost_module.swift_type).end])
    }

    /// Tests/Fixtures, next to this test target.
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path + "/Fixtures"

    /// The refusal of `file` when the plugins of `dir` load as the daemon loads them.
    func refusal(of file: String) async throws -> LoadFailure? {
        let load = try await StartupLoad(directories: [dir.path])
        await load.shutdown()
        return load.refused.first { $0.file == file }
    }

    @Test func aModuleStructTooSmallForANameAndVersionIsRefusedWithOneLine() async throws {
        let file = try build("TinyModule", olderPlugin("TinyModule", fields: "uint32_t struct_size; uint32_t kind; const char *name;",
                                                       modules: [("tiny", "1.0")]).replacingOccurrences(of: ", \"1.0\", notes, create, handle, destroy", with: ""),
                             modules: ["tiny"])
        let refused = try #require(try await refusal(of: file))
        #expect(refused.description == "\(file): descriptor check failed: module descriptors are 16 bytes, ABI 1.0 needs at least 24 (through version). Fix: initialise struct_size with sizeof(modhost_module)")
    }

    @Test func aPluginStructTooSmallIsRefusedWithOneLineByTheLoaderAndTheTrial() async throws {
        let file = try build("TinyPlugin", olderPlugin("TinyPlugin", fields: Self.fieldsBeforeSwiftType, pluginSize: "12",
                                                       modules: [("tinyplugin", "1.0")]),
                             modules: ["tinyplugin"])
        let refused = try #require(try await refusal(of: file))
        #expect(refused.description == "\(file): ABI version check failed: the plugin descriptor's struct_size is 12 bytes, ABI 1.0 descriptors have at least 32 (through modules). Fix: rebuild the plugin against this host's modulehost.h (MODHOST_PLUGIN_INIT sets struct_size)")

        let trial = try run(BuildProducts.directory + "/bin/modhost-trial", [file, "TinyPlugin"])
        #expect(trial.status == 1)
        #expect(trial.standardOutput == "descriptor: the plugin descriptor's struct_size is 12 bytes, smaller than ABI 1.0's\n")
    }

    @Test func aPluginBuiltForANewerMinorIsRefused() async throws {
        let file = try build("NewerMinor", olderPlugin("NewerMinor", fields: Self.fieldsBeforeSwiftType, minor: "MODHOST_ABI_MINOR + 1",
                                                       modules: [("newerminor", "1.0")]),
                             modules: ["newerminor"])
        let refused = try #require(try await refusal(of: file))
        #expect(refused.check == .abi)
        #expect(refused.problem == "the descriptor says ABI 1.\(HostSDK.abiMinor + 1), this host provides 1.\(HostSDK.abiMinor)")
    }
}
