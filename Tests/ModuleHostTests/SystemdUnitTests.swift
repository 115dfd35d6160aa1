import DaemonShell
import Foundation
import Glibc
@testable import ModuleHost
import ModuleKit
import Testing
import TestSupport

/// share/modhostd.service as systemd 252 (Debian 12) reads it, and what its ExecStart and
/// ExecReload lines do against the real daemon.
@Suite(.timeLimit(.minutes(5)), .serialized) struct SystemdUnitTests {
    static let unitSource = BuildProducts.packageRoot + "/share/modhostd.service"

    /// systemd-analyze, or nil: `make deps` installs Debian's systemd package (which works
    /// without systemd running) when it runs as root.
    static let analyze: String? = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }

    /// A prefix where the unit's commands exist (bin/ linked to the built tools), and the
    /// unit with its paths pointing there, as `make install` writes it.
    final class InstalledUnit {
        let root = TemporaryDirectory("unit")
        var unit: String { root.file("units/modhostd.service") }

        init() throws {
            let bin = root.directory("prefix/bin")
            for tool in ["modhostd", "modhostctl", "modhost-trial"] {
                try FileManager.default.createSymbolicLink(atPath: bin + "/" + tool, withDestinationPath: BuildProducts.directory + "/bin/" + tool)
            }
            _ = root.directory("units")
            let text = try String(contentsOfFile: SystemdUnitTests.unitSource, encoding: .utf8)
                .replacingOccurrences(of: "/usr/local", with: root.file("prefix"))
            try root.write("units/modhostd.service", text: text)
        }

        /// Adds a drop-in, as an operator writes one in /etc/systemd/system/modhostd.service.d/.
        func addDropIn(_ name: String, _ text: String) throws {
            _ = root.directory("units/modhostd.service.d")
            try root.write("units/modhostd.service.d/" + name, text: text)
        }

        func verify() throws -> ProcessResult {
            try run(SystemdUnitTests.analyze!, ["verify", "--man=no", unit], directory: root.file("units"))
        }

        /// The overall exposure `systemd-analyze security --offline=yes` gives, and its report.
        func security() throws -> (exposure: Double, report: String) {
            let result = try run(SystemdUnitTests.analyze!, ["security", "--offline=yes", "--no-pager", unit], directory: root.file("units"))
            let report = result.standardOutput + result.standardError
            let line = try #require(report.split(separator: "\n").first { $0.contains("Overall exposure level") }, "\(report)")
            let number = try #require(line.split(separator: ":").last?.split(separator: " ").first.flatMap { Double($0) }, "\(line)")
            return (number, report)
        }
    }

    func requireAnalyze() throws {
        try #require(Self.analyze != nil, "systemd-analyze is missing: `make deps` as root installs Debian's systemd package, which provides it")
    }

    /// The unit value of `key` (the last assignment wins, as in systemd).
    static func setting(_ key: String, in text: String) -> String? {
        text.split(separator: "\n").last { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) }
    }

    @Test(.enabled(if: analyze != nil, "systemd-analyze is missing: `make deps` as root installs Debian's systemd package"))
    func theUnitVerifiesCleanlyOnThisSystemd() throws {
        try requireAnalyze()
        let installed = try InstalledUnit()
        let result = try installed.verify()
        #expect(result.status == 0 && (result.standardOutput + result.standardError).isEmpty,
                "systemd-analyze verify:\n\(result.standardOutput)\(result.standardError)")
        let text = try String(contentsOfFile: installed.unit, encoding: .utf8)
        #expect(Self.setting("Type", in: text) == "notify")
        #expect(Self.setting("User", in: text) == "modhostd")
        #expect(Self.setting("CapabilityBoundingSet", in: text) == "")
        #expect(Self.setting("ExecReload", in: text)?.hasSuffix(" reload") == true)
    }

    @Test(.enabled(if: analyze != nil, "systemd-analyze is missing: `make deps` as root installs Debian's systemd package"))
    func theUnitIsSandboxed() throws {
        try requireAnalyze()
        let (exposure, report) = try InstalledUnit().security()
        #expect(exposure <= 3.0, "\(report)")
        for protection in ["ProtectSystem=", "ProtectHome=", "PrivateTmp=", "PrivateDevices=", "NoNewPrivileges=", "RestrictSUIDSGID=",
                           "LockPersonality=", "User=/DynamicUser="] {
            #expect(report.contains("✓ \(protection)"), "\(protection) is not in force:\n\(report)")
        }
        #expect(report.contains("✓ SystemCallFilter=~@privileged"), "\(report)")
    }

    /// docs/daemon.md's drop-in opens the network to plugins: with it the unit still
    /// verifies, Internet sockets are allowed, and the exposure stays within 3.0.
    @Test(.enabled(if: analyze != nil, "systemd-analyze is missing: `make deps` as root installs Debian's systemd package"))
    func theDocumentedDropInRelaxesOnlyWhatItSays() throws {
        try requireAnalyze()
        let block = try #require(try MarkdownBlock.blocks(of: "docs/daemon.md").first { $0.language == "ini" && $0.body.contains("RestrictAddressFamilies") })
        let installed = try InstalledUnit()
        #expect(try installed.security().report.contains("✓ RestrictAddressFamilies=~AF_(INET|INET6)"))
        try installed.addDropIn("network.conf", block.body)
        let verify = try installed.verify()
        #expect(verify.status == 0 && (verify.standardOutput + verify.standardError).isEmpty, "\(verify.standardOutput)\(verify.standardError)")
        let (exposure, report) = try installed.security()
        #expect(report.contains("✗ RestrictAddressFamilies=~AF_(INET|INET6)"), "\(block.location) did not allow Internet sockets:\n\(report)")
        #expect(exposure <= 3.0, "\(report)")
    }

    /// The unit's ExecStart runs the daemon with the example configuration; its ExecReload
    /// returns only once the reload is over (the daemon counted it), with READY=1 sent after
    /// RELOADING=1 for systemd; with an invalid configuration it fails, naming the field.
    @Test func execStartAndExecReloadDoWhatTheUnitPromises() async throws {
        let installed = try InstalledUnit()
        let text = try String(contentsOfFile: installed.unit, encoding: .utf8)
        let root = installed.root
        let plugins = root.directory("plugins")
        try root.copy(BuildProducts.plugin("Counter"), as: "plugins/libCounter.so")
        let example = try String(contentsOfFile: BuildProducts.packageRoot + "/share/modhostd.json.example", encoding: .utf8)
        let config = try root.write("modhostd.json", text: example.replacingOccurrences(of: "/usr/local/lib/modulehost/plugins", with: plugins))
        func translate(_ line: String) -> [String] {
            line.replacingOccurrences(of: "/etc/modhostd/modhostd.json", with: config)
                .replacingOccurrences(of: "/run/modhostd/modhostd.sock", with: root.file("modhostd.sock"))
                .replacingOccurrences(of: "/var/lib/modhostd", with: root.file("state"))
                .split(separator: " ").map(String.init)
        }
        let start = translate(try #require(Self.setting("ExecStart", in: text)))
        let reload = translate(try #require(Self.setting("ExecReload", in: text)))
        let listener = try NotifySocketListener(path: root.file("notify.sock"))
        let daemon = try RunningProcess(start[0], Array(start.dropFirst()), environment: ["NOTIFY_SOCKET": listener.path])
        #expect(await listener.next(containing: "READY=1") != nil, "\(daemon.text)")

        let reloaded = try run(reload[0], Array(reload.dropFirst()))
        #expect(reloaded.status == 0, "\(reloaded.standardError)")
        let status = try run(BuildProducts.modhostctl, ["--socket", root.file("modhostd.sock"), "--json", "status"])
        #expect(try JSONValue.parse(Array(status.standardOutput.utf8))["reloads"]?.numberValue == 1, "\(status.standardOutput)")
        #expect(await listener.next(containing: "RELOADING=1") != nil)
        #expect(await listener.next(containing: "READY=1") != nil)

        try root.write("modhostd.json", text: #"{"logLevel": "loud"}"#)
        let refused = try run(reload[0], Array(reload.dropFirst()))
        #expect(refused.status == 1)
        #expect(refused.standardError.contains("\"logLevel\""), "\(refused.standardError)")

        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0, "\(daemon.text)")
    }
}
