import Foundation
import Glibc
@testable import ModuleHost
import PluginFormat
import ModuleKit
import Testing
import TestSupport

/// Loading real plugin files as the daemon does (a `PluginSet`'s first reconcile): the
/// checks after dlopen, dependency order, the registry. Every test uses plugin names of its
/// own: the dynamic loader remembers every image.
@Suite(.timeLimit(.minutes(5))) struct LoaderTests {
    let dir = TemporaryDirectory("loader")
    var factory: PluginFactory { PluginFactory(directory: dir.path) }

    @discardableResult
    func plugin(_ name: String, modules: [String]? = nil, dependencies: [String] = [], order: Int = 0,
                source: String? = nil, flags: String = "") throws -> String {
        let modules = modules ?? [name.lowercased()]
        return try factory.buildC(
            name, source: source ?? PluginFactory.cSource(plugin: name, modules: modules),
            manifest: PluginFactory.manifest(plugin: name, modules: modules, dependencies: dependencies, order: order),
            flags: flags)
    }

    /// The plugins of `dir` loaded as modhostd's start loads them; shut down when done.
    func loadDirectory() async throws -> StartupLoad { try await StartupLoad(directories: [dir.path]) }

    func failure(_ load: StartupLoad, _ name: String) -> LoadFailure? {
        load.failure(endingWith: "/lib\(name).so")
    }

    @Test func anUnresolvedSymbolIsRefusedByDlopen() async throws {
        try plugin("Dangling", source: PluginFactory.cSource(
            plugin: "Dangling", modules: ["dangling"],
            extra: "int nowhere_to_be_found(void); __attribute__((visibility(\"default\"))) int use(void) { return nowhere_to_be_found(); }"))
        let load = try await loadDirectory()
        let refused = failure(load, "Dangling")
        #expect(refused?.check == .dlopen)
        #expect(refused?.problem.contains("undefined symbol: nowhere_to_be_found") == true)
        #expect(load.loaded.isEmpty)
        await load.shutdown()
    }

    @Test func aMissingEntrySymbolIsRefused() async throws {
        let source = PluginFactory.cSource(plugin: "Silent", modules: ["silent"])
            .replacingOccurrences(of: "MODHOST_PLUGIN_ENTRY {", with: "static const modhost_plugin *unused(void) {")
        try plugin("Silent", source: source + "\nvoid *keep = (void *)unused;")
        let load = try await loadDirectory()
        let refused = failure(load, "Silent")
        #expect(refused?.check == .entrySymbol)
        #expect(refused?.problem.contains("does not export modhost_plugin_entry_v1") == true)
        await load.shutdown()
    }

    @Test func anEntrySymbolFromAnotherLibraryIsRefused() async throws {
        // Borrower has no entry of its own, but links EntryLender, which has one.
        let lender = dir.directory("lib")
        try PluginFactory(directory: lender).buildC(
            "EntryLender", source: PluginFactory.cSource(plugin: "EntryLender", modules: ["lender"]), manifest: nil)
        let source = PluginFactory.cSource(plugin: "Borrower", modules: ["borrower"])
            .replacingOccurrences(of: "MODHOST_PLUGIN_ENTRY {", with: "static const modhost_plugin *unused(void) {")
        try plugin("Borrower", source: source + "\nvoid *keep = (void *)unused;",
                   flags: "-L '\(lender)' -Wl,--no-as-needed -lEntryLender -Wl,-rpath,'\(lender)'")
        // The validator reads the file's own dynamic symbols: it has no entry point.
        let load = try await loadDirectory()
        let refused = failure(load, "Borrower")
        #expect(refused?.check == .entrySymbol)
        #expect(refused?.problem == "the file does not export modhost_plugin_entry_v1", "\(String(describing: refused))")
        await load.shutdown()
        // The loader, should it be given the file unchecked, finds the lender's and says so.
        let path = dir.path + "/libBorrower.so"
        let file = PluginFile(path: path, resolvedPath: path,
                              manifest: Manifest(name: "Borrower", version: "1.0", abi: "1.0", language: .c, modules: ["borrower"]),
                              dynamic: DynamicInfo(), warnings: [])
        #expect {
            _ = try PluginLoader().open(file)
        } throws: { error in
            (error as? LoadFailure)?.problem.contains("resolves from \(lender)/libEntryLender.so, not from this file") == true
        }
    }

    @Test func anEntryReturningNullIsRefused() async throws {
        try plugin("Nothing", source: PluginFactory.cSource(plugin: "Nothing", modules: ["nothing"], entryBody: "return NULL;"))
        let load = try await loadDirectory()
        let refused = failure(load, "Nothing")
        #expect(refused?.check == .descriptor)
        #expect(refused?.problem.contains("returned NULL") == true)
        await load.shutdown()
    }

    @Test func aDescriptorThatDisagreesWithTheManifestIsRefused() async throws {
        // The manifest lists "listed"; the code describes "described".
        try factory.buildC("Liar", source: PluginFactory.cSource(plugin: "Liar", modules: ["described"]),
                           manifest: PluginFactory.manifest(plugin: "Liar", modules: ["listed"]))
        let load = try await loadDirectory()
        let refused = failure(load, "Liar")
        #expect(refused?.check == .descriptor)
        #expect(refused?.problem.contains("describes modules [described], the manifest lists [listed]") == true)
        await load.shutdown()
    }

    @Test func aDescriptorWithAnotherABIMajorIsRefused() async throws {
        try plugin("OldCode", source: PluginFactory.cSource(plugin: "OldCode", modules: ["oldcode"], abiMajor: "7"))
        let load = try await loadDirectory()
        let refused = failure(load, "OldCode")
        #expect(refused?.check == .abi)
        #expect(refused?.problem.contains("descriptor says ABI 7.\(HostSDK.abiMinor)") == true)
        await load.shutdown()
    }

    @Test func aDuplicateModuleNameRefusesTheSecondPlugin() async throws {
        try plugin("DupA", modules: ["shared-name"])
        try plugin("DupB", modules: ["shared-name"])
        let load = try await loadDirectory()
        #expect(load.loaded == ["DupA"])
        let refused = failure(load, "DupB")
        #expect(refused?.check == .duplicate)
        #expect(refused?.problem.contains("module shared-name is already provided by") == true)
        #expect(await load.host.moduleNames == ["shared-name"])
        #expect(await load.set.plugin(named: "DupA")?.modules.map(\.factory.plugin) == ["DupA"])
        await load.shutdown()
    }

    @Test func pluginsLoadInDependencyOrderThenOrderThenName() async throws {
        try plugin("OrdBase", order: 50)
        try plugin("OrdMiddle", dependencies: ["OrdBase"], order: 1)
        try plugin("OrdTop", dependencies: ["OrdMiddle"], order: 0)
        try plugin("OrdFirst", order: 10)
        try plugin("OrdAlpha", order: 10)
        let load = try await loadDirectory()
        #expect(load.refused.isEmpty, "\(load.refused)")
        // OrdBase has the highest order but OrdMiddle and OrdTop need it first.
        #expect(load.loaded == ["OrdAlpha", "OrdFirst", "OrdBase", "OrdMiddle", "OrdTop"])
        await load.shutdown()
    }

    @Test func aMissingDependencyRefusesItsDependentsAndLoadsTheRest() async throws {
        try plugin("NeedsGhost", dependencies: ["Ghost"])
        try plugin("NeedsNeeder", dependencies: ["NeedsGhost"])
        try plugin("Independent")
        let load = try await loadDirectory()
        #expect(load.loaded == ["Independent"])
        #expect(failure(load, "NeedsGhost")?.problem.contains("needs Ghost: dependency Ghost is not available") == true)
        let transitive = failure(load, "NeedsNeeder")
        #expect(transitive?.check == .dependency)
        #expect(transitive?.problem.contains("needs NeedsGhost, which was refused (dependency)") == true)
        // Both wait for what they need, and are tried again at every scan.
        #expect(await load.set.filesNotLoaded() == [.waitingForDependency: [dir.file("libNeedsGhost.so"), dir.file("libNeedsNeeder.so")]])
        await load.shutdown()
    }

    @Test func aCycleRefusesEveryMemberAndNamesIt() async throws {
        try plugin("CycA", dependencies: ["CycB"])
        try plugin("CycB", dependencies: ["CycC"])
        try plugin("CycC", dependencies: ["CycA"])
        try plugin("CycSelf", dependencies: ["CycSelf"])
        try plugin("CycFree")
        let load = try await loadDirectory()
        #expect(load.loaded == ["CycFree"])
        for name in ["CycA", "CycB", "CycC"] {
            let refused = failure(load, name)
            #expect(refused?.check == .cycle)
            #expect(refused?.problem.contains("CycA -> CycB -> CycC -> CycA") == true)
        }
        #expect(failure(load, "CycSelf")?.problem.contains("CycSelf -> CycSelf") == true)
        await load.shutdown()
    }

    @Test func aRefusedDependencyAtDlopenRefusesItsDependents() async throws {
        try plugin("BrokenBase", source: PluginFactory.cSource(plugin: "BrokenBase", modules: ["brokenbase"], entryBody: "return NULL;"))
        try plugin("OnBroken", dependencies: ["BrokenBase"])
        let load = try await loadDirectory()
        #expect(load.loaded.isEmpty)
        #expect(failure(load, "BrokenBase")?.check == .descriptor)
        let dependent = failure(load, "OnBroken")
        #expect(dependent?.check == .dependency)
        #expect(dependent?.problem.contains("needs BrokenBase, which was refused (descriptor)") == true)
        await load.shutdown()
    }

    @Test func oneFileMayProvideSeveralModules() async throws {
        try plugin("Multi", modules: ["multi-one", "multi-two", "multi-three"])
        let load = try await loadDirectory()
        #expect(await load.modules(of: "Multi") == ["multi-one", "multi-two", "multi-three"])
        // Equal orders: the host sorts by name.
        #expect(await load.host.moduleNames == ["multi-one", "multi-three", "multi-two"])
        await load.shutdown()
    }

    /// A directory of 20 files with every kind of refusal: the refusals and their order, the
    /// registration order, and no code run from a refused file (each plugin's constructor
    /// appends its name to a log, in the order `dlopen` ran it; only PipeBroken, refused by
    /// its entry point, runs and is refused).
    @Test func manyFilesLoadWithEveryKindOfRefusalInOrder() async throws {
        let log = dir.path + "/constructors.log"
        func build(_ file: String, _ name: String, manifestName: String? = nil, dependencies: [String] = [], order: Int = 0,
                   entryBody: String? = nil) throws {
            let constructor = "__attribute__((constructor)) static void note_load(void) { "
                + "FILE *log = fopen(\"\(log)\", \"a\"); if (log) { fputs(\"\(name)\\n\", log); fclose(log); } }"
            try factory.buildC(
                name, source: PluginFactory.cSource(plugin: name, modules: [name.lowercased()], entryBody: entryBody, extra: constructor),
                manifest: PluginFactory.manifest(plugin: manifestName ?? name, modules: [name.lowercased()],
                                                 dependencies: dependencies, order: order),
                fileName: "lib\(file)-\(name).so")
        }
        // Candidates are checked in file name order.
        try build("00", "PipeTop", dependencies: ["PipeBase"])  // its dependency comes later
        try build("01", "PipeBroken", entryBody: "return NULL;")  // no dependencies: refused when opened
        try build("02", "PipeOnBroken", dependencies: ["PipeBroken"])
        _ = try dir.write("lib03-junk.so", text: "not a plugin")
        let independent = (4..<16).map { "PipeInd\($0)" }
        for (index, name) in independent.enumerated() {
            try build(String(format: "%02d", index + 4), name, order: 20 - index)  // ranked against file order
        }
        try build("16", "PipeBase", order: 50)
        try build("17", "PipeTwin", manifestName: "PipeInd7")  // a name an earlier file holds
        try build("18", "PipeGhostly", dependencies: ["PipeGhost"])
        try build("19", "PipeLate", order: -1)

        let load = try await loadDirectory()
        #expect(load.loaded == ["PipeLate"] + independent.reversed() + ["PipeBase", "PipeTop"])
        let refused = load.refused.map { "\(URL(fileURLWithPath: $0.file).lastPathComponent): \($0.check.rawValue)" }
        #expect(refused == ["lib03-junk.so: ELF format", "lib17-PipeTwin.so: duplicate name", "lib18-PipeGhostly.so: dependency",
                            "lib01-PipeBroken.so: descriptor", "lib02-PipeOnBroken.so: dependency"])
        #expect(failure(load, "02-PipeOnBroken")?.problem.contains("needs PipeBroken, which was refused (descriptor)") == true)
        let ran = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(Set(ran) == Set(load.loaded + ["PipeBroken"]), "no refused file's constructor runs but PipeBroken's")
        #expect(try #require(ran.firstIndex(of: "PipeBase")) < #require(ran.firstIndex(of: "PipeTop")))
        await load.shutdown()
    }
}

/// The example plugins of Plugins/, as `make` built them, loaded once for the whole test
/// process and started: every Swift image a process maps stays mapped, so each further
/// load would map another copy of the same Swift types.
enum ExamplePlugins {
    static let loaded = Task { () throws -> StartupLoad in
        let load = try await StartupLoad(directories: [BuildProducts.pluginDirectory], host: HostInstance(name: "examples"))
        await load.set.start()
        // Never released (a static): its state directory goes now, as nothing writes
        // there after the start without a further reconcile.
        try FileManager.default.removeItem(atPath: load.state.path)
        return load
    }
}

/// The example plugins of Plugins/, as `make` built them: Swift and C side by side, a
/// protocol cast across two .so files, the registry.
@Suite(.timeLimit(.minutes(5))) struct ExamplePluginTests {
    @Test func swiftAndCPluginsLoadSideBySide() async throws {
        let load = try await ExamplePlugins.loaded.value
        #expect(load.refused.isEmpty, "\(load.refused)")
        // Welcome depends on Greeting, so it loads after it whatever the orders say.
        #expect(try #require(load.loaded.firstIndex(of: "Greeting")) < #require(load.loaded.firstIndex(of: "Welcome")))
        #expect(Set(load.loaded) == ["Greeting", "Welcome", "Counter", "Calculator"])

        #expect(await load.host.moduleNames == ["greeting", "welcome", "counter", "calculator"])
        // Welcome found Greeting's module through a cast to Greeting's protocol: two .so
        // files, one ModuleKit.
        let welcome = try #require(await load.host.infos().first { $0.name == "welcome" })
        #expect(welcome.metadata["greeter"] == "greeting")
        #expect(welcome.metadata["lastGreeting"] == "Hello, operator!")
    }

    @Test func theRegistryAnswersByName() async throws {
        let registry = try await ExamplePlugins.loaded.value.set.registry
        let type = try #require(registry.moduleType(named: "greeting"))
        #expect(type.name == "greeting")
        #expect(type.version == "1.0.0")
        #expect(registry.moduleType(named: "counter") == nil)  // a C module has no Swift type
        #expect(try registry.factory(named: "counter").plugin == "Counter")
        #expect(registry.entry(named: "no-such-module") == nil)
        #expect(throws: UnknownModule.self) { try registry.factory(named: "no-such-module") }
        do {
            _ = try registry.factory(named: "no-such-module")
        } catch {
            #expect(error.description == "no module named no-such-module is registered; known modules: calculator, counter, greeting, welcome")
        }
    }

    @Test func swiftPluginsLinkTheOneSharedSDK() async throws {
        let set = try await ExamplePlugins.loaded.value.set
        let greeting = try #require(await set.plugin(named: "Greeting"))
        #expect(greeting.file.dynamic.needed.contains("libModuleKit.so"))
        #expect(greeting.file.dynamic.soname == "libGreeting.so")
        let welcome = try #require(await set.plugin(named: "Welcome"))
        #expect(welcome.file.dynamic.needed.contains("libGreeting.so"))
    }
}

/// Host services a C module receives (libffi closures bound to the module) and exports
/// checked at load time, through real C plugins.
@Suite(.timeLimit(.minutes(5))) struct CModuleServicesTests {
    let dir = TemporaryDirectory("services")

    @Test func aCModuleLogsPostsAndAsksThroughItsBoundHostAPI() async throws {
        let out = dir.file("events.txt")
        let source = #"""
            #include <modulehost.h>
            #include <stdio.h>
            #include <stdlib.h>
            #include <string.h>
            typedef struct { const modhost_host_api *host; char path[512]; } state;
            static const char *const notes[] = {"ping", NULL};
            static void *create(const modhost_host_api *host, const char *config) {
                state *self = calloc(1, sizeof *self); self->host = host;
                const char *start = strstr(config, "\"out\":\"");
                if (start) { start += 7; size_t n = strcspn(start, "\""); memcpy(self->path, start, n < 511 ? n : 511); }
                return self;
            }
            static void handle(void *raw, const char *event, const char *payload) {
                state *self = raw;
                FILE *f = fopen(self->path, "a");
                fprintf(f, "%s %s\n", event, payload ? payload : "-");
                if (strcmp(event, "start") == 0) {
                    fprintf(f, "has self %d, has other %d, has nothing %d\n", self->host->has_module("services"),
                            self->host->has_module("other"), self->host->has_module("nothing"));
                    self->host->post_notification("ping", "{\"n\":1}");
                    self->host->log(MODHOST_LOG_INFO, "started");
                }
                fclose(f);
            }
            static void destroy(void *raw) { free(raw); }
            static const modhost_module modules[] = {
                {sizeof(modhost_module), MODHOST_MODULE_C, "services", "1.0", notes, create, handle, destroy, NULL},
                {sizeof(modhost_module), MODHOST_MODULE_C, "other", "1.0", NULL, create, handle, destroy, NULL},
            };
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Services", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """#
        try PluginFactory(directory: dir.path).buildC(
            "Services", source: source, manifest: PluginFactory.manifest(plugin: "Services", modules: ["services", "other"]))
        let settings = [
            "services": ModuleSettings(configuration: ["out": .string(out)]),
            "other": ModuleSettings(configuration: ["out": .string(dir.file("other.txt"))]),
        ]
        let load = try await StartupLoad(directories: [dir.path], host: HostInstance(name: "services", settings: settings),
                                         settings: settings)
        #expect(load.refused.isEmpty, "\(load.refused)")
        await load.set.start()
        // The notifications are delivered asynchronously, on the host's context: one posted
        // by each module's start, both to "services" (the listener), before the shutdown.
        var text = ""
        for _ in 0..<500 {
            text = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
            if text.components(separatedBy: "ping {\"n\":1}").count == 3 { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        await load.shutdown()
        text = try String(contentsOfFile: out, encoding: .utf8)
        #expect(text.hasPrefix("init -\nstart -\nhas self 1, has other 1, has nothing 0\n"), "\(text)")
        #expect(text.contains("ping {\"n\":1}"))
        #expect(text.hasSuffix("willTerminate -\ndeinit -\n"))
        // "other" does not listen to "ping": it never got it.
        let other = try String(contentsOfFile: dir.file("other.txt"), encoding: .utf8)
        #expect(!other.contains("ping"))
    }

    @Test func aDeclaredExportMissingFromThePluginIsRefused() async throws {
        try PluginFactory(directory: dir.path).buildC(
            "NoExport", source: PluginFactory.cSource(plugin: "NoExport", modules: ["noexport"]),
            manifest: PluginFactory.manifest(plugin: "NoExport", modules: ["noexport"], exports: [("missing_function", "i32(i32)")]))
        let load = try await StartupLoad(directories: [dir.path])
        let refused = load.refused.first
        #expect(load.refused.count == 1 && load.loaded.isEmpty)
        #expect(refused?.check == .exports)
        #expect(refused?.problem.contains("missing_function") == true, "\(String(describing: refused))")
        await load.shutdown()
    }

    @Test func aPluginLinkingAnotherModuleKitIsRefusedBeforeDlopen() async throws {
        let lib = dir.directory("lib")
        try PluginFactory(directory: lib).buildC("ModuleKitOld", source: "int old_sdk(void) { return 1; }\n", manifest: nil)
        try PluginFactory(directory: dir.path).buildC(
            "OtherSDK", source: PluginFactory.cSource(plugin: "OtherSDK", modules: ["othersdk"]),
            manifest: PluginFactory.manifest(plugin: "OtherSDK", modules: ["othersdk"]),
            flags: "-L '\(lib)' -Wl,--no-as-needed -lModuleKitOld")
        let load = try await StartupLoad(directories: [dir.path])
        let refused = load.refused.first
        #expect(load.refused.count == 1 && load.loaded.isEmpty)
        #expect(refused?.check == .sdkLinkage)
        #expect(refused?.problem.contains("links ModuleKit as libModuleKitOld.so") == true)
        await load.shutdown()
    }
}

/// Several host instances in one process share the loaded plugins' types but never their
/// module objects or state.
@Suite(.timeLimit(.minutes(5))) struct HostInstanceIsolationAcrossPluginsTests {
    @Test func twoInstancesGetTheirOwnModulesFromTheSamePlugin() async throws {
        let set = try await ExamplePlugins.loaded.value.set
        var factories: [ModuleFactory] = []
        for name in ["Greeting", "Welcome"] { factories += try #require(await set.plugin(named: name)).modules.map(\.factory) }
        let first = HostInstance(name: "first")
        let second = HostInstance(name: "second", settings: ["welcome": ModuleSettings(enabled: false)])
        await first.add(factories)
        await second.add(factories)
        await first.start()
        await second.start()
        let count: @Sendable (isolated HostInstance) -> Double = { host in
            host.module(named: "greeting")?.info.metadata["greetingsGiven"]?.numberValue ?? -1
        }
        // Welcome greeted through the first instance's Greeting only.
        #expect(await first.perform(count) == 1)
        #expect(await second.perform(count) == 0)
        let distinct = await first.perform { host in ObjectIdentifier(host.module(named: "greeting")!) }
        let other = await second.perform { host in ObjectIdentifier(host.module(named: "greeting")!) }
        #expect(distinct != other)
        await first.shutdown()
        await second.shutdown()
    }
}

@Suite(.timeLimit(.minutes(5))) struct DependencyOrderTests {
    func file(_ name: String, _ path: String, order: Int = 0, dependencies: [String] = []) -> PluginFile {
        PluginFile(path: path, resolvedPath: path,
                   manifest: Manifest(name: name, version: "1", abi: "1.0", language: .c, dependencies: dependencies,
                                      order: order, modules: [name.lowercased()]),
                   dynamic: DynamicInfo(), warnings: [])
    }

    @Test(arguments: [false, true])
    func aPluginNameGivenTwiceRefusesTheLaterFile(withDependencies: Bool) {
        let order = DependencyOrder([
            file("A", "/p/1.so"), file("A", "/p/2.so"),
            file("B", "/p/3.so", dependencies: withDependencies ? ["A"] : []),
        ])
        #expect(order.ordered.map(\.path) == ["/p/1.so", "/p/3.so"])
        #expect(order.refused.map(\.file) == ["/p/2.so"])
        #expect(order.refused.first?.check == .duplicate)
    }

    @Test func withoutDependenciesOrderThenNameDecide() {
        let order = DependencyOrder([file("C", "/c", order: 1), file("B", "/b", order: 2), file("A", "/a", order: 2)],
                                    orderOverride: ["C": 3])
        #expect(order.ordered.map(\.name) == ["A", "B", "C"])
    }
}
