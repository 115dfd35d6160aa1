import Foundation
import Glibc
@testable import ModuleHost
import Testing
import TestSupport

/// A Swift plugin built against today's ModuleKit keeps loading and behaving the same when
/// the host's ModuleKit changes compatibly, and is refused with one line, never a crash,
/// when it changes incompatibly (docs/abi.md, "Swift plugin compatibility"). The changed
/// ModuleKits are built by `make abi-check` with the compile-time conditions only this test
/// defines (Sources/ModuleKit/Sources/ModuleKit/ABIUpgradeTestChanges.swift), so the same
/// builds also show that the ABI check passes additions and fails a removal.
@Suite(.timeLimit(.minutes(10)), .serialized) struct ABIUpgradeTests {
    /// The plugin: a module class that subclasses a base class of the plugin's own,
    /// conforms to ModuleKit's protocols (Module, PluginModule, Installable, SubBus), uses
    /// the Bus (Bus.new, install, access, a sub-bus), events (lifecycle, custom, awaited),
    /// the ModuleManager (names, lookup, an observable) and ModuleInfo, and switches over
    /// ModuleEvent and JSONValue. Every line it logs starts with "PROBE ".
    static let source = #"""
        import ModuleKit

        struct Ledger: Installable {
            let entries: [String]
        }

        final class ProbeBus: SubBus {
            let bus = Bus.new(label: "probe") { $0.install(Ledger(entries: ["a", "b"])) }
        }

        func describe(_ value: JSONValue) -> String {
            switch value {
            case .null: "null"
            case .bool(let flag): "\(flag)"
            case .number(let number): "\(number)"
            case .string(let text): "'\(text)'"
            case .array(let items): "[" + items.map(describe).joined(separator: ",") + "]"
            case .object(let members): "{" + members.keys.sorted().map { "\($0):\(describe(members[$0]!))" }.joined(separator: ",") + "}"
            }
        }

        class ProbeBase: Module {
            let logger: Logger
            var seen: [String] = []
            init(logger: Logger) { self.logger = logger }
            var moduleName: String { "base" }
            var info: ModuleInfo { ModuleInfo(name: moduleName, version: "0") }
            var notifications: Set<String> { ["probe.note"] }
            func handle(_ event: ModuleEvent, host: isolated HostInstance) { seen.append(event.name) }
            func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
                logger.info("PROBE awaited \(event.name) \(describe(event.payload)) seen=\(seen)")
            }
        }

        final class ProbeModule: ProbeBase, PluginModule {
            static let name = "probe"
            static let version = "1.2.3"
            static var metadata: [String: JSONValue] { ["kind": "probe", "sizes": [1, 2.5, true, nil]] }
            private var observation: (any Disposable)?

            init?(host: isolated HostInstance, configuration: JSONValue) {
                super.init(logger: host.logger(for: Self.name))
            }

            override var moduleName: String { Self.name }
            override var info: ModuleInfo {
                var info = ModuleInfo(name: Self.name, version: Self.version, metadata: Self.metadata)
                info.metadata["seen"] = .number(Double(seen.count))
                return info
            }

            override func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                super.handle(event, host: host)
                switch event {
                case .initialize:
                    logger.info("PROBE version \(ModuleKitBuild.abiVersion.major).\(ModuleKitBuild.abiVersion.minor)")
                case .start:
                    host.bus.install(ProbeBus())
                    let ledger = host.bus.access(ProbeBus.self)?.access(Ledger.self)
                    let found = host.moduleManager.module(named: Self.name) === self
                    logger.info("PROBE start ledger=\(ledger?.entries ?? []) found=\(found) names=\(host.moduleManager.moduleNames) info=\(info.name)/\(info.version) \(describe(.object(info.metadata)))")
                    observation = host.observeModules { $0.moduleName }.subscribe { [logger] names in
                        logger.info("PROBE observed \(names)")
                    }
                case .custom(let name, let payload):
                    logger.info("PROBE custom \(name) \(describe(payload)) seen=\(seen)")
                    host.post(notification: "probe.note", payload: ["echo": payload])
                case .notification(let name, let payload):
                    logger.info("PROBE notification \(name) \(describe(payload))")
                case .configurationChanged(let configuration):
                    logger.info("PROBE configuration \(describe(configuration))")
                case .deinitialize:
                    observation?.dispose()
                    logger.info("PROBE deinit seen=\(seen)")
                @unknown default:
                    logger.info("PROBE an event this plugin does not know: \(event.name)")
                }
            }
        }

        @_cdecl("modhost_plugin_entry_v1")
        public func modhostPluginEntry() -> UnsafeRawPointer? {
            PluginExport.plugin("Probe", modules: [ProbeModule.self])
        }
        """#

    /// Builds the probe plugin with plugin.mk against today's SDK (`build/`).
    func buildProbe(in dir: TemporaryDirectory) throws -> String {
        let source = dir.directory("probe-source")
        try #"{ "name": "Probe", "version": "1.0.0", "modules": ["probe"] }"#.write(toFile: source + "/plugin.json", atomically: true, encoding: .utf8)
        try "PLUGIN = Probe\ninclude \(BuildProducts.pluginMakefile)\n".write(toFile: source + "/Makefile", atomically: true, encoding: .utf8)
        try Self.source.write(toFile: source + "/Probe.swift", atomically: true, encoding: .utf8)
        try shell("make MODHOST_SDK='\(BuildProducts.directory)' PLUGIN_DIR='\(dir.directory("plugins"))'", directory: source)
        return dir.file("plugins/libProbe.so")
    }

    /// ModuleKit built with `define` by `make abi-check`: the check's result and the library.
    func changedModuleKit(_ define: String, in dir: TemporaryDirectory) throws -> (check: ProcessResult, library: String) {
        let check = try run("/usr/bin/env", ["make", "--no-print-directory", "abi-check", "BUILD=\(dir.path)", "ABI_DEFINES=\(define)"],
                            directory: BuildProducts.packageRoot)
        return (check, dir.file("abi/.build/release/libModuleKit.so"))
    }

    /// The daemon and the control tool of `build/`, installed next to `library` (nil: the
    /// library they were built with), as an operator's upgraded host would be.
    func host(with library: String?) throws -> ToolsForAnotherUser {
        let tools = try ToolsForAnotherUser()
        if let library {
            let installed = tools.root.file("lib/libModuleKit.so")
            try FileManager.default.removeItem(atPath: installed)
            try FileManager.default.copyItem(atPath: library, toPath: installed)
        }
        return tools
    }

    /// Runs the daemon of `tools` on `plugins`, sends the probe a custom event (which it
    /// answers with a notification to itself) and an awaited one, stops the daemon, and
    /// returns what the probe logged, in order, and the daemon's whole output.
    func probeRun(tools: ToolsForAnotherUser, plugins: String, scratch: TemporaryDirectory) async throws -> (lines: [String], output: String) {
        let socket = scratch.file("sock-\(UInt32.random(in: 0...UInt32.max))")
        let daemon = try RunningProcess(tools.modhostd, ["--plugins", plugins, "--state-dir", scratch.directory("state-\(socket.suffix(8))"),
                                                         "--socket", socket])
        #expect(await daemon.waitFor("PROBE observed"), "\(daemon.text)")
        let send = try run(tools.modhostctl, ["--socket", socket, "send", "abi.probe", "--payload", #"{"n":[1,true,null,"x"],"o":{"k":-2}}"#])
        #expect(send.status == 0, "\(send.standardOutput)\(send.standardError)")
        #expect(await daemon.waitFor("PROBE notification probe.note"), "\(daemon.text)")
        let awaited = try run(tools.modhostctl, ["--socket", socket, "send", "abi.flush", "--await", "--payload", "[]"])
        #expect(awaited.status == 0, "\(awaited.standardOutput)\(awaited.standardError)")
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0, "\(daemon.text)")
        // The messages (one with an `=` is quoted in the line: docs/daemon.md, "Logs").
        let lines = daemon.text.split(separator: "\n").compactMap { LogBackendsTests.parse(String($0))?.message }.filter { $0.hasPrefix("PROBE ") }
        return (lines, daemon.text)
    }

    @Test(.timeLimit(.minutes(10)))
    func anOldPluginRunsUnchangedOnAModuleKitWithEveryAllowedAddition() async throws {
        let dir = TemporaryDirectory("abi-upgrade")
        let probe = try buildProbe(in: dir)
        let (before, _) = try await probeRun(tools: try host(with: nil), plugins: (probe as NSString).deletingLastPathComponent, scratch: dir)
        #expect(before.first == "PROBE version 1.0", "\(before)")
        #expect(before.contains { $0.hasPrefix("PROBE start ledger=[\"a\", \"b\"] found=true names=[\"probe\"] info=probe/1.2.3 {kind:'probe',seen:2.0,sizes:[1.0,2.5,true,null]}") },
                "\(before)")
        #expect(before.contains { $0.hasPrefix("PROBE custom abi.probe {n:[1.0,true,null,'x'],o:{k:-2.0}} seen=[\"init\", \"start\", \"abi.probe\"]") }, "\(before)")
        #expect(before.contains { $0.hasPrefix("PROBE awaited abi.flush [] seen=") }, "\(before)")
        #expect(before.contains { $0.hasPrefix("PROBE awaited willTerminate null seen=") }, "\(before)")
        #expect(before.last?.hasPrefix("PROBE deinit seen=[\"init\", \"start\", \"abi.probe\", \"probe.note\", \"deinit\"]") == true, "\(before)")

        // ModuleKit 1.1: one of each addition the policy allows. The ABI check passes it.
        let (check, library) = try changedModuleKit("MODULEKIT_ABI_TEST_ADDITIONS", in: dir)
        #expect(check.status == 0, "\(check.standardOutput)\(check.standardError)")
        #expect(check.standardOutput.contains("ModuleKit ABI check passed: ModuleKit 1.1 keeps the binary interface of 1.0"))
        for addition in ["EnumElement ModuleEvent.abiTestAddition", "Var ModuleInfo.abiTestNote", "Var Bus.abiTestNote",
                         "Func Module.abiTestRequirement()", "Func Bus.abiTestAddedMethod()", "Func abiTestAddedFunction()",
                         "Struct ABITestAddedType"] {
            #expect(check.standardOutput.contains("  \(addition) is a new API"), "\(addition): \(check.standardOutput)")
        }

        // The same plugin file on a host running ModuleKit 1.1: it loads and behaves as before.
        let (after, output) = try await probeRun(tools: try host(with: library), plugins: (probe as NSString).deletingLastPathComponent, scratch: dir)
        #expect(after.first == "PROBE version 1.1", "the host runs the changed ModuleKit: \(after)")
        #expect(Array(after.dropFirst()) == Array(before.dropFirst()))
        #expect(output.contains("abi test requirement: default"), "the added requirement's default serves the old conformance")
    }

    @Test(.timeLimit(.minutes(10)))
    func aBreakingChangeFailsTheABICheckAndThePluginIsRefusedWithOneLine() async throws {
        let dir = TemporaryDirectory("abi-break")
        let probe = try buildProbe(in: dir)
        let plugins = (probe as NSString).deletingLastPathComponent
        try FileManager.default.copyItem(atPath: BuildProducts.plugin("Counter"), toPath: plugins + "/libCounter.so")

        // ModuleKit 2.0, which removes a function the plugin calls: the ABI check names it.
        let (check, library) = try changedModuleKit("MODULEKIT_ABI_TEST_BREAKING", in: dir)
        #expect(check.status != 0)
        #expect(check.standardOutput.contains("ModuleKit ABI check failed: changes that break ModuleKit 1.0's binary interface"), "\(check.standardOutput)")
        #expect(check.standardOutput.contains("  Func Bus.new(label:_:) has been removed"), "\(check.standardOutput)")
        #expect(check.standardOutput.contains("the build records ModuleKit 2.0, the baseline is for 1.0"), "\(check.standardOutput)")

        // A host running it refuses the plugin before dlopen, with both versions and the
        // fix, and runs the other plugins.
        let tools = try host(with: library)
        let refusal = "libProbe.so: ModuleKit version check failed: plugin Probe was built against ModuleKit 1.0, this host runs ModuleKit 2.0. "
            + "Fix: rebuild the plugin against this host's SDK (ModuleKit 2.x changed the binary interface)"
        let verify = try run(tools.modhostctl, ["verify", plugins])
        #expect(verify.status == 1)
        #expect(verify.standardOutput.contains(refusal), "\(verify.standardOutput)")
        let socket = dir.file("sock")
        let daemon = try RunningProcess(tools.modhostd, ["--plugins", plugins, "--state-dir", dir.directory("state"), "--socket", socket])
        #expect(await daemon.waitFor("started 1 module: counter"), "\(daemon.text)")
        #expect(daemon.text.contains(refusal), "\(daemon.text)")
        #expect(!daemon.text.contains("PROBE"), "no code of the refused plugin ran")
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0, "\(daemon.text)")
    }
}
