import DaemonKit
import Foundation
import Glibc
@testable import ModuleHost
import PluginCall
import PluginFormat
import Testing
import TestSupport

/// Rules that exist once and are applied the same way by every entry point that needs
/// them: the loader in the daemon, `modhostctl verify`, the trial loader, calls by name.
@Suite struct OneRuleTests {
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

    @Test func anEntrySymbolBorrowedFromADependencyIsRefusedByTheLoaderAndTheTrialNamingTheLender() throws {
        let lender = dir.directory("lender")
        let lenderFile = try PluginFactory(directory: lender).buildC(
            "OwnLender", source: PluginFactory.cSource(plugin: "OwnLender", modules: ["ownlender"]), manifest: nil)
        let borrower = try factory.buildC(
            "OwnBorrower", source: entrylessSource("OwnBorrower"),
            manifest: PluginFactory.manifest(plugin: "OwnBorrower", modules: ["ownborrower"]),
            flags: "-L '\(lender)' -Wl,--no-as-needed -lOwnLender -Wl,-rpath,'\(lender)'")

        let report = PluginLoader().load(directories: [dir.path])
        let refused = try #require(report.refused.first { $0.file == borrower })
        #expect(refused.check == .entrySymbol)
        #expect(refused.problem == "modhost_plugin_entry_v1 resolves from \(lenderFile), not from this file")

        let trial = try run(trialLoader, [borrower, "OwnBorrower"])
        #expect(trial.status == 1)
        #expect(trial.standardOutput == "modhost_plugin_entry_v1 resolves from another file: \(lenderFile)\n")
    }

    @Test func anEntrySymbolInNoLoadedObjectIsRefusedByTheLoaderAndTheTrialWithoutBeingCalled() throws {
        // An absolute symbol: dlsym returns 0x1000, an address no object contains. Calling
        // it would crash the process that loads the plugin.
        let plugin = try factory.buildC(
            "OwnAbsolute", source: entrylessSource("OwnAbsolute", extra: """
                __asm__(".globl modhost_plugin_entry_v1\\n.type modhost_plugin_entry_v1, @function\\n.set modhost_plugin_entry_v1, 0x1000");
                """),
            manifest: PluginFactory.manifest(plugin: "OwnAbsolute", modules: ["ownabsolute"]))

        let report = PluginLoader().load(directories: [dir.path])
        let refused = try #require(report.refused.first { $0.file == plugin })
        #expect(refused.check == .entrySymbol)
        #expect(refused.problem == "modhost_plugin_entry_v1 resolves to an address in no loaded object, not in this file")

        let trial = try run(trialLoader, [plugin, "OwnAbsolute"])
        #expect(!trial.signalled && trial.status == 1)
        #expect(trial.standardOutput == "modhost_plugin_entry_v1 resolves to an address in no loaded object\n")
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
}
