import DaemonKit
import Foundation
import Glibc
@testable import ModuleHost
import Testing
import TestSupport

/// Fixes are noticed: a refused file is tried again when its mode or
/// owner changes (the watcher reports IN_ATTRIB), `reload` tries every refused file again,
/// and a loaded plugin whose file becomes writable by others is reported (and, when the
/// configuration says so, stopped).
@Suite(.timeLimit(.minutes(5))) struct RetryTests {
    let dir = TemporaryDirectory("retry")

    func control(_ socket: String, _ arguments: [String]) throws -> ProcessResult {
        try run(BuildProducts.modhostctl, ["--socket", socket] + arguments)
    }

    /// `modhostctl list --json`'s rows.
    func rows(_ socket: String) throws -> [[String: Any]] {
        let reply = try JSONSerialization.jsonObject(with: Data(try control(socket, ["--json", "list"]).standardOutput.utf8)) as? [String: Any]
        return reply?["modules"] as? [[String: Any]] ?? []
    }

    func startDaemon(_ plugins: String, configuration: String? = nil) async throws -> (RunningProcess, String) {
        let socket = dir.file("sock-\(UInt32.random(in: 0...UInt32.max))")
        var arguments = ["--plugins", plugins, "--state-dir", dir.file("state-\(UInt32.random(in: 0...UInt32.max))"), "--socket", socket]
        if let configuration { arguments += ["--config", try dir.write("modhostd.json", text: configuration)] }
        let daemon = try RunningProcess(BuildProducts.modhostd, arguments)
        #expect(await daemon.waitFor("started "), "\(daemon.text)")
        return (daemon, socket)
    }

    func cPlugin(_ name: String, in directory: String, flags: String = "", extra: String = "") throws -> String {
        try PluginFactory(directory: directory).buildC(
            name, source: PluginFactory.cSource(plugin: name, modules: [name.lowercased()], extra: extra),
            manifest: PluginFactory.manifest(plugin: name, modules: [name.lowercased()]), flags: flags)
    }

    @Test func aRefusedFileIsTriedAgainWhenItsModeChanges() async throws {
        let plugins = dir.directory("plugins")
        let path = try cPlugin("Loose", in: plugins)
        chmod(path, 0o666)
        let (daemon, _) = try await startDaemon(plugins)
        defer { daemon.send(SIGTERM) }
        #expect(await daemon.waitFor("\(path): permissions check failed"), "\(daemon.text)")
        // The printed fix, and nothing else: no touch, no reload.
        #expect(chmod(path, 0o644) == 0)
        #expect(await daemon.waitFor("loaded plugin Loose 1.0"), "\(daemon.text)")
    }

    @Test func aRefusedFileIsTriedAgainWhenItsDirectorysModeChanges() async throws {
        let plugins = dir.directory("open")
        let path = try cPlugin("InOpen", in: plugins)
        chmod(plugins, 0o777)
        let (daemon, _) = try await startDaemon(plugins)
        defer { daemon.send(SIGTERM) }
        #expect(await daemon.waitFor("\(path): permissions check failed: \(plugins) is writable by others"), "\(daemon.text)")
        #expect(chmod(plugins, 0o755) == 0)
        #expect(await daemon.waitFor("loaded plugin InOpen 1.0"), "\(daemon.text)")
    }

    @Test func reloadTriesEveryRefusedFileAgain() async throws {
        // The plugin needs a library that is not installed yet: dlopen refuses it. Installing
        // the library changes nothing in the plugin directory; a reload tries it again.
        let plugins = dir.directory("plugins")
        let libraries = dir.directory("libraries")
        let source = dir.directory("extra-source")
        try PluginFactory(directory: source).buildC("Extra", source: PluginFactory.cSource(plugin: "Extra", modules: ["extra"],
            extra: "__attribute__((visibility(\"default\"))) int extra_value(void) { return 1; }"), manifest: nil)
        let path = try cPlugin("NeedsExtra", in: plugins,
                               flags: "-L '\(source)' -lExtra -Wl,-rpath,'\(libraries)'",
                               extra: "extern int extra_value(void); __attribute__((used)) static int use(void) { return extra_value(); }")
        let (daemon, socket) = try await startDaemon(plugins)
        defer { daemon.send(SIGTERM) }
        #expect(await daemon.waitFor("\(path): dlopen check failed"), "\(daemon.text)")
        try FileManager.default.copyItem(atPath: source + "/libExtra.so", toPath: libraries + "/libExtra.so")
        let reload = try control(socket, ["--json", "reload"])
        #expect(reload.status == 0, "\(reload.standardError)")
        #expect(reload.standardOutput.contains("\"NeedsExtra\""), "\(reload.standardOutput)")
        #expect(await daemon.waitFor("loaded plugin NeedsExtra 1.0"), "\(daemon.text)")
    }

    @Test func aLoadedPluginWhoseFileBecomesWritableIsReportedAndKeepsRunning() async throws {
        let plugins = dir.directory("plugins")
        let path = try cPlugin("Steady", in: plugins)
        var status = stat()
        try #require(stat(path, &status) == 0)
        let mode = status.st_mode & 0o7777
        let (daemon, socket) = try await startDaemon(plugins)
        defer { daemon.send(SIGTERM) }
        #expect(await daemon.waitFor("loaded plugin Steady 1.0"))
        #expect(chmod(path, 0o664) == 0)
        #expect(await daemon.waitFor("plugin Steady keeps running, but its file \(path) is now unsafe: \(path) is writable by group (mode 664)"),
                "\(daemon.text)")
        let row = try #require(try rows(socket).first { $0["module"] as? String == "steady" })
        #expect(row["state"] as? String == "running")
        #expect((row["lastError"] as? String)?.contains("permissions check failed") == true, "\(row)")

        // The printed fix (chmod go-w) is noticed: the file is safe again, nothing is refused.
        #expect(chmod(path, mode) == 0)
        #expect(await daemon.waitFor("plugin Steady's file \(path) is safe again"), "\(daemon.text)")
        let fixed = try #require(try rows(socket).first { $0["module"] as? String == "steady" })
        #expect(fixed["lastError"] == nil, "\(fixed)")
        let reload = try control(socket, ["--json", "reload"])
        #expect(reload.status == 0 && !reload.standardOutput.contains(path), "\(reload.standardOutput)")
    }

    @Test func withTheSettingALoadedPluginWhoseFileBecomesWritableIsStopped() async throws {
        let plugins = dir.directory("plugins")
        let path = try cPlugin("Strict", in: plugins)
        let (daemon, socket) = try await startDaemon(plugins, configuration: #"{"stopPluginsWithUnsafeFiles": true}"#)
        defer { daemon.send(SIGTERM) }
        #expect(await daemon.waitFor("loaded plugin Strict 1.0"))
        #expect(chmod(path, 0o646) == 0)
        #expect(await daemon.waitFor("removed plugin Strict: its file \(path) is now unsafe"), "\(daemon.text)")
        let states = try rows(socket).map { $0["state"] as? String ?? "" }
        #expect(states == ["refused"], "\(states)")
        // Fixed, it comes back.
        #expect(chmod(path, 0o644) == 0)
        #expect(await daemon.waitFor("loaded plugin Strict 1.0 (generation 2)"), "\(daemon.text)")
    }
}
