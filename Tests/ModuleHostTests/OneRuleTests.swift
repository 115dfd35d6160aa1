@testable import CommandLineTools
import DaemonKit
import Foundation
import Glibc
import ModuleKit
@testable import ModuleHost
import PluginCall
import PluginFormat
import Testing
import TestSupport

/// Rules that exist once and are applied the same way by every entry point that needs
/// them: the daemon's plugin set, `modhostctl verify`, the trial loader, calls by name.
@Suite(.timeLimit(.minutes(5))) struct OneRuleTests {
    let dir = TemporaryDirectory("one-rule")
    var factory: PluginFactory { PluginFactory(directory: dir.path) }
    var trialLoader: String { BuildProducts.directory + "/bin/modhost-trial" }

    /// A C plugin without an entry function of its own; `extra` is added to its source.
    func entrylessSource(_ name: String, extra: String = "") -> String {
        PluginFactory.cSource(plugin: name, modules: [name.lowercased()])
            .replacingOccurrences(of: "MODHOST_PLUGIN_ENTRY {", with: "static const modhost_plugin *unused(void) {")
            + "\nvoid *keep = (void *)unused;\n" + extra
    }

    // MARK: - Symbol ownership

    @Test func anEntrySymbolBorrowedFromADependencyIsRefusedByTheLoaderAndTheTrialNamingTheLender() async throws {
        let lender = dir.directory("lender")
        let lenderFile = try PluginFactory(directory: lender).buildC(
            "OwnLender", source: PluginFactory.cSource(plugin: "OwnLender", modules: ["ownlender"]), manifest: nil)
        let borrower = try factory.buildC(
            "OwnBorrower", source: entrylessSource("OwnBorrower"),
            manifest: PluginFactory.manifest(plugin: "OwnBorrower", modules: ["ownborrower"]),
            flags: "-L '\(lender)' -Wl,--no-as-needed -lOwnLender -Wl,-rpath,'\(lender)'")

        // The validator reads the file's own symbols: it exports no entry point.
        let load = try await StartupLoad(directories: [dir.path])
        await load.shutdown()
        let refused = try #require(load.refused.first { $0.file == borrower })
        #expect(refused.check == .entrySymbol)
        #expect(refused.problem == "the file does not export modhost_plugin_entry_v1")

        // Loaded anyway, the trial finds the lender's and names it, as the loader would.
        let trial = try run(trialLoader, [borrower, "OwnBorrower"])
        #expect(trial.status == 1)
        #expect(trial.standardOutput == "entry-foreign: \(lenderFile)\n")
        let file = PluginFile(path: borrower, resolvedPath: borrower, manifest: Manifest(name: "OwnBorrower", version: "1.0", abi: "1.0", language: .c, modules: ["ownborrower"]),
                              dynamic: DynamicInfo(), warnings: [])
        #expect(ProcessTrialLoader.refusal(trial.standardOutput.trimmingCharacters(in: .newlines), file).problem
                == "modhost_plugin_entry_v1 resolves from \(lenderFile), not from this file")
    }

    @Test func anEntrySymbolInNoLoadedObjectIsRefusedByTheLoaderAndTheTrialWithoutBeingCalled() async throws {
        // An absolute symbol: dlsym returns 0x1000, an address no object contains. Calling
        // it would crash the process that loads the plugin.
        let plugin = try factory.buildC(
            "OwnAbsolute", source: entrylessSource("OwnAbsolute", extra: """
                __asm__(".globl modhost_plugin_entry_v1\\n.type modhost_plugin_entry_v1, @function\\n.set modhost_plugin_entry_v1, 0x1000");
                """),
            manifest: PluginFactory.manifest(plugin: "OwnAbsolute", modules: ["ownabsolute"]))

        let load = try await StartupLoad(directories: [dir.path])
        await load.shutdown()
        let refused = try #require(load.refused.first { $0.file == plugin })
        #expect(refused.check == .entrySymbol)
        #expect(refused.problem == "modhost_plugin_entry_v1 resolves to an address in no loaded object, not in this file")

        let trial = try run(trialLoader, [plugin, "OwnAbsolute"])
        #expect(!trial.signalled && trial.status == 1)
        #expect(trial.standardOutput == "entry-nowhere: modhost_plugin_entry_v1\n")
    }

    // MARK: - Ignored file names

    @Test func theScanAndTheWatcherIgnoreTheSameNames() async throws {
        let names = ["a.so", ".hidden.so", "b.so.tmp", "c.so~", "d.so.part", "e.txt", "f.so"]
        let watched = dir.directory("watched")
        let watcher = try DirectoryWatcher(directories: [watched])
        defer { watcher.stop() }
        for name in names { try Data("x".utf8).write(to: URL(fileURLWithPath: watched + "/" + name)) }
        try Data("x".utf8).write(to: URL(fileURLWithPath: watched + "/zz-last"))
        // "zz-last" (not ignored), written last, marks the end of what the watcher reports.
        var reported: Set<String> = []
        for await batch in watcher.changes {
            reported.formUnion(batch.map(\.name))
            if reported.contains("zz-last") { break }
        }
        let scanned = try pluginCandidates(in: watched).map { ($0 as NSString).lastPathComponent }
        #expect(scanned == ["a.so", "f.so"])
        #expect(reported.filter { $0.hasSuffix(".so") }.sorted() == scanned)
        #expect(names.filter(isPluginFileName) == scanned)
    }

    /// The plugin-name rule reads ASCII names byte by byte and any other name by its
    /// characters; both agree with the rule as written, and the scan lists names in the
    /// order of `<` whichever way it sorts them.
    @Test func thePluginNameRuleAndTheScanOrderAreTheSameForEveryName() throws {
        let names = ["a.so", "B.so", "b.so", "a.so.so", "ab.so", ".so", "so", "x.SO", "\r\n.so", ".hidden.so", "c.so~", "d.so.tmp",
                     "é.so", "e\u{301}.so", "z\u{600}.so", "\u{600}.so", "a.s\u{301}o", "ü-1.so", "u\u{308}-0.so", "日本.so"]
        for name in names {
            #expect(isPluginFileName(name) == (name.hasSuffix(".so") && !DirectoryWatcher.isIgnoredName(name)), "\(name.debugDescription)")
        }
        let ascii = dir.directory("ascii"), mixed = dir.directory("mixed")
        for name in names where !name.contains("\r") {
            try Data("x".utf8).write(to: URL(fileURLWithPath: mixed + "/" + name))
            if name.utf8.allSatisfy({ $0 < 0x80 }) { try Data("x".utf8).write(to: URL(fileURLWithPath: ascii + "/" + name)) }
        }
        for directory in [ascii, mixed] {
            let scanned = try pluginCandidates(in: directory)
            let listed = try FileManager.default.contentsOfDirectory(atPath: directory).filter(isPluginFileName)
            #expect(scanned == listed.sorted().map { directory + "/" + $0 })
        }
    }

    // MARK: - Atomic file writes

    @Test func anAtomicWriteReplacesTheFileWholeOrReportsWhyAndLeavesItAsItWas() throws {
        let path = dir.file("state.json")
        try AtomicFile.write(Array("old".utf8), to: path)
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "old")

        // The temporary name is taken by a directory: open fails, and says so.
        mkdir(path + ".tmp", 0o700)
        #expect(throws: SystemError("open", code: EISDIR, subject: path + ".tmp")) {
            try AtomicFile.write(Array("new".utf8), to: path)
        }
        rmdir(path + ".tmp")
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "old")

        // What the contents closure throws stops the write; no temporary file is left.
        struct Stop: Error {}
        #expect(throws: Stop.self) {
            try AtomicFile.write(to: path) { writer in
                try writer.write(Array("half".utf8))
                throw Stop()
            }
        }
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "old")
        #expect(!FileManager.default.fileExists(atPath: path + ".tmp"))

        try AtomicFile.write(to: path) { writer in
            try writer.write(Array("new!".utf8))
            try writer.write(Array("N".utf8), at: 0)
        }
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "New!")
    }

    // MARK: - Command lines

    @Test func oneTokenizerMakesDashWordsAfterCallArgumentsAndRefusesThemElsewhere() throws {
        let values: Set<String> = ["socket", "to"]
        let call = try Arguments(["--socket", "/s", "call", "Calc", "add", "-5", "--json", "-inf", "--", "--x"],
                                 valueOptions: values, flagOptions: ["json"], dashWordsArePositional: { $0.first == "call" })
        #expect(call.positionals == ["call", "Calc", "add", "-5", "-inf", "--x"])
        #expect(call.value("socket") == "/s" && call.has("json"))
        #expect(try Arguments(["call", "-h"], valueOptions: values, flagOptions: [],
                              dashWordsArePositional: { $0.first == "call" }).has("help"))
        #expect(throws: UsageError.self) {
            try Arguments(["list", "-5"], valueOptions: values, flagOptions: [], dashWordsArePositional: { $0.first == "call" })
        }
    }

    // MARK: - Timestamps

    @Test func everyTimestampHasTheOneFormatIncludingTheSignalHandlersCrashRecord() throws {
        #expect(UTCTimestamp.format(seconds: 0) == "1970-01-01T00:00:00Z")
        #expect(UTCTimestamp.format(seconds: 951_782_400 + 86_399, milliseconds: 7) == "2000-02-29T23:59:59.007Z")
        // The record the fatal-signal handler writes (seconds since the epoch) reads with
        // the same format as the records the daemon writes itself.
        let record = #"{"file":"/p/libX.so","plugin":"X","hash":"h","phase":"run","cause":"SIGSEGV","epoch":951782400}"#
        let crash = try JSONDecoder().decode(CrashGuard.Crash.self, from: Data(record.utf8))
        #expect(crash.time == "2000-02-29T00:00:00Z")
        let now = UTCTimestamp.now()
        #expect(now.wholeMatch(of: #/\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z/#) != nil)
    }

    // MARK: - Duplicate names

    @Test func theNameRuleKeepsANameForItsFirstClaimant() {
        var claims = NameClaims()
        #expect(claims.conflict(plugin: "A", modules: ["a1", "a2"], file: "/p/a.so") == nil)
        claims.claim(plugin: "A", modules: ["a1", "a2"], file: "/p/a.so")
        #expect(claims.conflict(plugin: "A", modules: ["x"], file: "/p/other.so")?.problem == "plugin name A is already used by /p/a.so")
        // A new version, even from the same file, claims the names once the old one released them.
        #expect(claims.conflict(plugin: "A", modules: ["a1"], file: "/p/a.so") != nil)
        let module = claims.conflict(plugin: "B", modules: ["b", "a2"], file: "/p/b.so")
        #expect(module?.problem == "module a2 is already provided by plugin A (/p/a.so)")
        #expect(module?.fix == "rename the module or remove one of the two plugins")
        #expect(claims.conflict(plugin: "B", modules: ["b", "c", "b"], file: "/p/b.so")?.problem == "module b is listed twice")
        claims.release(plugin: "A")
        #expect(claims.conflict(plugin: "A", modules: ["a1", "a2"], file: "/p/a.so") == nil)
        #expect(claims.conflict(plugin: "B", modules: ["a1", "a2"], file: "/p/b.so") == nil)
    }

    /// `claimIfFree` (what a load pass uses) refuses exactly what `conflict` refuses, with the
    /// same words, claims exactly what `claim` claims, and a refused claim leaves every name
    /// as it was, even when some of its names were free.
    @Test func claimingIfFreeIsConflictThenClaim() {
        var claims = NameClaims(), reference = NameClaims()
        let attempts: [(plugin: String, modules: [String], file: String)] = [
            ("A", ["a1", "a2"], "/p/a.so"), ("A", ["x"], "/p/other.so"), ("B", ["b", "a2"], "/p/b.so"),
            ("B", ["b", "c", "b"], "/p/b.so"), ("C", ["c1", "c2", "a1"], "/p/c.so"), ("B", ["b", "c1", "c2"], "/p/b.so"),
            ("D", [], "/p/d.so"), ("E", ["e"], "/p/e.so"), ("F", ["c1"], "/p/f.so"),
        ]
        for attempt in attempts {
            let expected = reference.conflict(plugin: attempt.plugin, modules: attempt.modules, file: attempt.file)
            if expected == nil { reference.claim(plugin: attempt.plugin, modules: attempt.modules, file: attempt.file) }
            #expect(claims.claimIfFree(plugin: attempt.plugin, modules: attempt.modules, file: attempt.file) == expected)
            #expect(claims.plugins == reference.plugins)
            #expect(claims.modules == reference.modules)
        }
        #expect(claims.plugins.keys.sorted() == ["A", "B", "D", "E"])
        #expect(claims.modules["c1"] == NameClaims.Holder(plugin: "B", file: "/p/b.so"))
    }

    /// Two C plugins providing module `shared`, the second noting in `opened` when its code
    /// is loaded; returns their paths.
    func sharingAModule(_ first: String, _ second: String, in directory: String, opened: String) throws -> (String, String) {
        let factory = PluginFactory(directory: directory)
        let a = try factory.buildC(first, source: PluginFactory.cSource(plugin: first, modules: ["shared"]),
                                   manifest: PluginFactory.manifest(plugin: first, modules: ["shared"]))
        let b = try factory.buildC(
            second,
            source: PluginFactory.cSource(plugin: second, modules: ["shared"], extra: """
                __attribute__((constructor)) static void opened(void) { FILE *f = fopen("\(opened)", "w"); if (f) fclose(f); }
                """),
            manifest: PluginFactory.manifest(plugin: second, modules: ["shared"]))
        return (a, b)
    }

    @Test func everyPlaceRefusesADuplicateNameWithTheOneWording() throws {
        let opened = dir.file("opened")
        let (a, b) = try sharingAModule("DupRuleA", "DupRuleB", in: dir.directory("dup"), opened: opened)
        let expected = LoadFailure(file: b, conflict: NameConflict(.moduleName(module: "shared", heldBy: .init(plugin: "DupRuleA", file: a))))
        #expect(expected.description.hasSuffix("duplicate name check failed: module shared is already provided by plugin DupRuleA (\(a)). Fix: rename the module or remove one of the two plugins"))

        // Planning a directory (modhostctl verify).
        let loader = PluginLoader()
        let planned = PluginPlan(directories: [dir.file("dup")], validator: Validator())
        #expect(planned.ordered.map(\.path) == [a])
        #expect(planned.refused == [expected])
        // Ordering candidates.
        let files = try [a, b].map { try Validator().validate($0) }
        #expect(DependencyOrder(files).refused == [expected])
        #expect(DependencyOrder(files).ordered.map(\.path) == [a])
        #expect(!FileManager.default.fileExists(atPath: opened))  // nothing so far ran B's code
        // Registering modules.
        let registry = ModuleRegistry()
        try registry.register(try loader.open(files[0]))
        #expect(throws: expected) { try registry.register(try loader.open(files[1])) }
        // A manifest that lists a module twice.
        let twice = PluginFactory.manifest(plugin: "DupTwice", modules: ["m", "n", "m"])
        #expect(throws: ManifestError(reason: "field \"modules\": module m is listed twice")) { try Manifest.parse(Array(twice.utf8)) }
    }

    @Test func aRunningPluginSetRefusesADuplicateNameBeforeLoadingIt() async throws {
        let opened = dir.file("opened")
        let plugins = dir.directory("plugins")
        let (a, b) = try sharingAModule("DupSetA", "DupSetB", in: dir.directory("build"), opened: opened)
        for file in [a, b] { try FileManager.default.copyItem(atPath: file, toPath: plugins + "/" + (file as NSString).lastPathComponent) }
        let state = dir.directory("state")
        let images = dir.directory("state/images")
        chmod(images, 0o700)
        let host = HostInstance(name: "dup")
        let set = PluginSet(host: host, directories: [plugins], imagesDirectory: images,
                            crashGuard: try CrashGuard(directory: state), trialLoader: nil)
        let changes = await set.reconcile(trial: false)
        #expect(changes == PluginChanges(added: ["DupSetA"], refused: [plugins + "/libDupSetB.so"]))
        let refused = try #require(await set.snapshot().files.first)
        #expect(refused.failure == LoadFailure(
            file: plugins + "/libDupSetB.so",
            conflict: NameConflict(.moduleName(module: "shared", heldBy: .init(plugin: "DupSetA", file: plugins + "/libDupSetA.so")))))
        #expect(!FileManager.default.fileExists(atPath: opened))  // refused before dlopen
        await set.shutdown()
    }
}
