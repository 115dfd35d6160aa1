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
}
