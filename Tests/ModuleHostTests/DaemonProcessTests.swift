import Foundation
import Glibc
import Testing
import TestSupport

/// modhostd and modhostctl run as real processes, as operators run them.
@Suite(.timeLimit(.minutes(5))) struct DaemonProcessTests {
    /// A plugin directory with copies of the example plugins plus one bad file.
    func pluginDirectory() throws -> TemporaryDirectory {
        let dir = TemporaryDirectory("daemon")
        for name in ["Greeting", "Welcome", "Counter", "Calculator"] {
            try dir.copy(BuildProducts.plugin(name), as: "lib\(name).so")
        }
        try dir.write("libBroken.so", text: "not a plugin")
        return dir
    }

    @Test(arguments: [SIGTERM, SIGINT])
    func theDaemonStartsEveryModuleAndStopsInReverseOrderOnSignal(signal: Int32) async throws {
        let dir = try pluginDirectory()
        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", dir.path, "--state-dir", dir.file(".state"),
                                                                 "--socket", dir.file(".sock")])
        #expect(await daemon.waitFor("started 4 modules: greeting, welcome, counter, calculator"))
        daemon.send(signal)
        let status = await daemon.wait()
        #expect(status == 0)
        let log = daemon.text
        // The bad file is refused with its reason and the others still load.
        #expect(log.contains("refused \(dir.path)/libBroken.so: ELF format check failed: not an ELF file"))
        #expect(log.contains("Hello, operator! (via greeting)"))
        // Deinit runs in reverse order: counter (order 30) before greeting (order 10).
        let counterDeinit = try #require(log.range(of: "event deinit"))
        let greetingDeinit = try #require(log.range(of: "deinit instance=modhostd module=greeting"))
        #expect(counterDeinit.lowerBound < greetingDeinit.lowerBound)
        #expect(log.contains("willTerminate"))
        #expect(log.hasSuffix("stopped\n") || log.contains("stopped"))
    }

    /// Paths from the command line of any shape: one-character relative paths (on which
    /// Foundation's path splitting traps) for the plugins, the state and the socket.
    @Test func theDaemonTakesOneCharacterRelativePaths() async throws {
        let dir = try pluginDirectory()
        try FileManager.default.removeItem(atPath: dir.file("libBroken.so"))
        _ = dir.directory("p")
        try FileManager.default.moveItem(atPath: dir.file("libCounter.so"), toPath: dir.file("p/libCounter.so"))
        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", "p/", "--state-dir", "s", "--socket", "k"],
                                        directory: dir.path)
        #expect(await daemon.waitFor("control socket ready"), "\(daemon.text)")
        let list = try run(BuildProducts.modhostctl, ["--socket", "k", "list"], directory: dir.path)
        #expect(list.status == 0 && list.standardOutput.contains("counter"), "\(list.standardOutput)\(list.standardError)")
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0, "\(daemon.text)")
    }

    @Test func helpExitsZeroAndUsageErrorsExit64() throws {
        let help = try run(BuildProducts.modhostd, ["--help"])
        #expect(help.status == 0)
        #expect(help.standardOutput.contains("USAGE: modhostd [--plugins DIR]... [--config FILE]"))
        let missing = try run(BuildProducts.modhostd, ["--config", "/dev/null/none"])
        #expect(missing.status == 65)
        #expect(missing.standardError.contains("Error: /dev/null/none: configuration cannot be read"))
        let nothing = try run(BuildProducts.modhostd, [], environment: ["XDG_CONFIG_HOME": "/nonexistent"])
        #expect(nothing.status == 64)
        #expect(nothing.standardError.contains("Error: no plugin directory"))
        #expect(nothing.standardError.contains("See 'modhostd --help'."))
        let unknown = try run(BuildProducts.modhostd, ["--plugins", "/tmp", "--frobnicate"])
        #expect(unknown.status == 64)
        #expect(unknown.standardError.contains("unknown option '--frobnicate'"))

        let ctlHelp = try run(BuildProducts.modhostctl, ["--help"])
        #expect(ctlHelp.status == 0)
        #expect(ctlHelp.standardOutput.contains("inspect FILE"))
        let ctlBad = try run(BuildProducts.modhostctl, ["explode"])
        #expect(ctlBad.status == 64)
        #expect(ctlBad.standardError.contains("unknown command 'explode'"))
    }

    @Test func inspectPrintsTheManifestWithoutLoading() throws {
        let result = try run(BuildProducts.modhostctl, ["inspect", BuildProducts.plugin("Calculator")])
        #expect(result.status == 0)
        #expect(result.standardOutput.contains("name:         Calculator"))
        #expect(result.standardOutput.contains("calc_add: i32(i32,i32)"))
        #expect(result.standardOutput.contains("isolation:    not set (the daemon's configuration decides)"))
        #expect(result.standardOutput.contains("verdict:      valid"))

        let json = try run(BuildProducts.modhostctl, ["inspect", "--json", BuildProducts.plugin("Greeting")])
        let object = try JSONSerialization.jsonObject(with: Data(json.standardOutput.utf8)) as? [String: Any]
        let manifest = object?["manifest"] as? [String: Any]
        #expect(manifest?["name"] as? String == "Greeting")
        #expect((manifest?["toolchain"] as? [String: Any])?["moduleKit"] as? String == "1.0")
        #expect(object?["valid"] as? Bool == true)
    }

    @Test func verifyExitsNonZeroWhenAnythingFails() throws {
        let dir = try pluginDirectory()
        let result = try run(BuildProducts.modhostctl, ["verify", dir.path])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("refused  \(dir.path)/libBroken.so: ELF format check failed"))
        #expect(result.standardOutput.contains("4 valid, 1 refused"))

        let clean = try run(BuildProducts.modhostctl, ["verify", BuildProducts.plugin("Counter"), BuildProducts.plugin("Greeting")])
        #expect(clean.status == 0)
        #expect(clean.standardOutput.contains("2 valid, 0 refused"))
    }
}
