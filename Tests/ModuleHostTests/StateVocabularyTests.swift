import ControlProtocol
import Foundation
import Glibc
@testable import ModuleHost
import Testing
import TestSupport

/// One vocabulary of states: `list`, the log, `reload` and
/// docs/daemon.md use the same words; a missing dependency is `waiting-for-dependency`;
/// refused rows show what was read; `reload` lists every file that is not loaded; `call`
/// needs a running module.
@Suite(.timeLimit(.minutes(5))) struct StateVocabularyTests {
    let dir = TemporaryDirectory("states")

    /// A daemon on a plugin directory holding Counter and Calculator (copies of the
    /// examples), `Auditor` (needs Ledger, which is nowhere), `NoEntry` (its manifest reads,
    /// its entry point is hidden) and a file that is not ELF.
    func startDaemon(_ label: String = "a", configuration: String? = nil) async throws -> (RunningProcess, String, String) {
        let plugins = dir.directory("plugins-\(label)")
        for name in ["Counter", "Calculator"] { try FileManager.default.copyItem(atPath: BuildProducts.plugin(name), toPath: plugins + "/lib\(name).so") }
        let factory = PluginFactory(directory: plugins)
        try factory.buildC("Auditor", source: PluginFactory.cSource(plugin: "Auditor", modules: ["auditor"]),
                           manifest: PluginFactory.manifest(plugin: "Auditor", modules: ["auditor"], dependencies: ["Ledger"]))
        try factory.buildC("NoEntry", source: PluginFactory.cSource(plugin: "NoEntry", modules: ["noentry"])
                            .replacingOccurrences(of: "MODHOST_PLUGIN_ENTRY", with: "const modhost_plugin *modhost_plugin_entry_v1(void)"),
                           manifest: PluginFactory.manifest(plugin: "NoEntry", modules: ["noentry"]))
        try Data("not a plugin".utf8).write(to: URL(fileURLWithPath: plugins + "/libBroken.so"))
        let socket = dir.file("sock-\(label)")
        var arguments = ["--plugins", plugins, "--state-dir", dir.file("state-\(label)"), "--socket", socket]
        if let configuration { arguments += ["--config", try dir.write("modhostd-\(label).json", text: configuration)] }
        let daemon = try RunningProcess(BuildProducts.modhostd, arguments)
        #expect(await daemon.waitFor("started 2 modules"), "\(daemon.text)")
        return (daemon, plugins, socket)
    }

    func control(_ socket: String, _ arguments: [String]) throws -> ProcessResult {
        try run(BuildProducts.modhostctl, ["--socket", socket] + arguments)
    }

    func json(_ result: ProcessResult) throws -> [String: Any] {
        try #require(JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8)) as? [String: Any], "\(result.standardOutput)")
    }

    @Test func aMissingDependencyIsWaitingForDependencyInListLogAndReload() async throws {
        let (daemon, plugins, socket) = try await startDaemon()
        defer { daemon.send(SIGTERM) }
        let auditor = plugins + "/libAuditor.so"
        let list = try control(socket, ["--json", "list"])
        let rows = try #require(try json(list)["modules"] as? [[String: Any]], "\(list.standardOutput)")
        let row = try #require(rows.first { $0["file"] as? String == auditor })
        #expect(row["state"] as? String == "waiting-for-dependency")
        #expect(row["plugin"] as? String == "Auditor")
        #expect(row["version"] as? String == "1.0")
        // (Logged at info level here: libBroken.so cannot be read, so Ledger may be on its way.)
        #expect(daemon.text.contains("waiting-for-dependency \(auditor): "), "\(daemon.text)")
        #expect(!daemon.text.contains("refused \(auditor)"), "\(daemon.text)")
        #expect(!daemon.text.contains("quarantined"), "\(daemon.text)")
        let reload = try json(try control(socket, ["--json", "reload"]))
        #expect(reload["waitingForDependency"] as? [String] == [auditor], "\(reload)")
        #expect((reload["refused"] as? [String])?.contains(auditor) == false, "\(reload)")
        let text = try control(socket, ["list"]).standardOutput
        #expect(text.contains("waiting-for-dependency"), "\(text)")
    }

    @Test func refusedRowsShowWhatWasReadAndReloadListsEveryRefusedFile() async throws {
        let (daemon, plugins, socket) = try await startDaemon()
        defer { daemon.send(SIGTERM) }
        let list = try control(socket, ["--json", "list"])
        let rows = try #require(try json(list)["modules"] as? [[String: Any]], "\(list.standardOutput)")
        let noEntry = try #require(rows.first { $0["file"] as? String == plugins + "/libNoEntry.so" })
        #expect(noEntry["state"] as? String == "refused")
        #expect(noEntry["plugin"] as? String == "NoEntry")
        #expect(noEntry["version"] as? String == "1.0")
        let broken = try #require(rows.first { $0["file"] as? String == plugins + "/libBroken.so" })
        #expect(broken["plugin"] as? String == "-")
        // Nothing changed since the start: the reload still lists every refused file.
        let reload = try json(try control(socket, ["--json", "reload"]))
        #expect(reload["refused"] as? [String] == [plugins + "/libBroken.so", plugins + "/libNoEntry.so"], "\(reload)")
    }

    /// In process and isolated alike.
    @Test(arguments: [false, true])
    func callingAPluginWithNoRunningModuleIsRefusedUnlessConfigured(isolated: Bool) async throws {
        let isolation = isolated ? #""plugins": {"Calculator": {"isolation": "process"}}"# : ""
        let (daemon, _, socket) = try await startDaemon(isolated ? "i" : "a", configuration: "{\(isolation)}")
        #expect(try control(socket, ["call", "Calculator", "calc_add", "2", "3"]).standardOutput == "5\n")
        #expect(try control(socket, ["disable", "calculator"]).status == 0)
        let refused = try control(socket, ["call", "Calculator", "calc_add", "2", "3"])
        #expect(refused.status == 1)
        #expect(refused.standardError.contains("plugin Calculator has no running module (calculator: disabled)"), "\(refused.standardError)")
        #expect(refused.standardError.contains("(plugin_not_running)"), "\(refused.standardError)")
        daemon.send(SIGTERM)
        _ = await daemon.wait()

        let (allowing, _, allowingSocket) = try await startDaemon(isolated ? "j" : "b",
                                                                  configuration: #"{"allowCallsWithoutRunningModule": true"# + (isolated ? ", " + isolation : "") + "}")
        defer { allowing.send(SIGTERM) }
        #expect(try control(allowingSocket, ["disable", "calculator"]).status == 0)
        #expect(try control(allowingSocket, ["call", "Calculator", "calc_add", "2", "3"]).standardOutput == "5\n")
    }

    /// docs/daemon.md's table of states lists exactly the states the daemon shows.
    @Test func theDocsDefineEveryState() throws {
        let text = try String(contentsOfFile: BuildProducts.packageRoot + "/docs/daemon.md", encoding: .utf8)
        let section = try #require(text.components(separatedBy: "## States").dropFirst().first?.components(separatedBy: "\n## ").first)
        let documented = section.split(separator: "\n").filter { $0.hasPrefix("| `") }
            .map { String($0.dropFirst(3).prefix { $0 != "`" }) }
        #expect(documented.sorted() == ModuleRow.State.allCases.map(\.rawValue).sorted())
    }
}
