import ControlProtocol
import DaemonKit
import Foundation
import Glibc
import ModuleHost
import ModuleKit
import Testing
import TestSupport

/// Names, numbers and JSON from outside, at every entry point an operator or a plugin
/// author reaches: control requests, the configuration file, command-line flags,
/// manifests dropped into a running daemon, `modhostctl verify` and plugin.mk.
@Suite(.timeLimit(.minutes(5)), .serialized) struct HostileInputTests {
    typealias BadRequest = ControlProtocolTests.BadRequest

    static let badRequests: [BadRequest] = [
        // Numbers a double cannot hold are not JSON this daemon reads: the error quotes them.
        BadRequest(#"{"v":1e400,"id":1,"cmd":"list"}"#, "malformed_request", "at byte 5: number 1e400 is out of range", .null),
        BadRequest(#"{"id":1e999,"cmd":"list"}"#, "malformed_request", "at byte 6: number 1e999 is out of range", .null),
        // An id that would not come back as sent is refused, not rounded.
        BadRequest(#"{"id":1e300,"cmd":"list"}"#, "invalid_request", #""id" must be a string or an integer between -2^53 and 2^53"#, .null),
        BadRequest(#"{"id":12345678901234567890,"cmd":"list"}"#, "malformed_request", "at byte 6: integer 12345678901234567890 is not exactly a JSON number", .null),
        BadRequest(#"{"v":1,"id":9007199254740993,"cmd":"ping"}"#, "malformed_request", "at byte 12: integer 9007199254740993 is not exactly", .null),
        BadRequest(#"{"id":1152921504606846976,"cmd":"list"}"#, "invalid_request", #""id" must be a string or an integer between -2^53 and 2^53"#, .null),
        BadRequest(#"{"cmd":"call","plugin":"p","function":"f","args":[9007199254740993,1]}"#, "malformed_request", "at byte 50: integer 9007199254740993", .null),
        BadRequest(#"{"id":0.5,"cmd":"list"}"#, "invalid_request", #""id" must be a string or an integer"#, .null),
        // Strict JSON.
        BadRequest(#"{"id":1,"cmd":"list","cmd":"reload"}"#, "malformed_request", #"at byte 21: duplicate member name "cmd""#, .null),
        BadRequest(#"{"id":0123,"cmd":"list"}"#, "malformed_request", "at byte 6: leading zero", .null),
        // Names follow the grammar.
        BadRequest(#"{"id":7,"cmd":"enable","module":"../x"}"#, "invalid_request", #""module" is "../x", not a name: names are 1 to 64"#, 7),
        BadRequest(#"{"cmd":"send","event":"x","to":"a\nb"}"#, "invalid_request", #""to" is "a\nb", not a name"#, .null),
        BadRequest(#"{"cmd":"call","plugin":"a/b","function":"f"}"#, "invalid_request", #""plugin" is "a/b", not a name"#, .null),
        // An event name follows the name grammar: a NUL would end it early in C ("deinit").
        BadRequest(#"{"cmd":"send","event":"deinit\u0000x","to":"freer","await":true}"#, "invalid_request", #""event" is "deinit\u0000x", not a name"#, .null),
        BadRequest(#"{"cmd":"send","event":"tick\u001b[2J"}"#, "invalid_request", #""event" is "tick\u001b[2J", not a name"#, .null),
    ]

    @Test(arguments: badRequests)
    func aHostileRequestGetsAnErrorNamingTheProblem(request: BadRequest) async throws {
        let daemon = ControlProtocolTests.RecordingDaemon()
        let reply = try ControlProtocolTests.Reply(
            await ControlService(daemon: daemon).handle(request.line, peer: PeerCredentials(pid: 1, uid: getuid(), gid: getgid())))
        #expect(reply.ok == false)
        #expect(reply.code == request.code, "\(reply.text)")
        #expect(reply.message?.contains(request.message) == true, "\(reply.message ?? "no message")")
        #expect(reply.id == request.id)
        #expect(!reply.text.contains("\n"))
        #expect(await daemon.calls.isEmpty)
    }

    @Test func aWholeNumberUpTo2p53IsPrintedAsAnInteger() {
        #expect(JSONValue.number(0x1p53).jsonText == "9007199254740992")
        #expect(JSONValue.number(-0x1p53).jsonText == "-9007199254740992")
        #expect(JSONValue.number(1e15).jsonText == "1000000000000000")
        #expect(JSONValue.number(0.5).jsonText == "0.5")
    }

    // MARK: Command-line numbers

    /// Runs modhostd expecting it to refuse to start; one that starts anyway is killed
    /// after 30 s. Returns the exit status (128 + signal) and what it printed.
    func refusedStart(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let scratch = TemporaryDirectory("refused-start")
        let daemon = try RunningProcess(BuildProducts.modhostd, arguments + ["--state-dir", scratch.file("state"), "--socket", scratch.file("sock")])
        let status = await daemon.wait(timeout: .seconds(30))
        return (status, daemon.text)
    }

    @Test(arguments: ["inf", "1e300", "-1", "0", "nan", "-inf", "3601", "0x1p3", "-1e-400", "1e1", " 5", "5.", ".5", "",
                      "3600.00000000000000000001", "0.00099999999999999999999"])
    func aDaemonDeadlineOutOfRangeIsAUsageError(value: String) async throws {
        let (status, output) = try await refusedStart(["--plugins", "/nonexistent", "--event-deadline", value])
        #expect(status == 64, "\(output)")
        #expect(output.contains("--event-deadline must be a number of seconds from 0.001 to 3600, not '\(value)'"), "\(output)")
    }

    /// A mistyped argument is shown on one short line, whatever it holds.
    @Test func aBadArgumentIsShownEscapedAndCut() throws {
        let long = String(repeating: "9", count: 400)
        for (arguments, shown) in [(["--event-deadline", "5\n\u{1B}[31m\u{202E}"], #"not '5\n\u001b[31m\u202e'"#),
                                   (["--event-deadline", long], "not '\(String(repeating: "9", count: 80))…'"),
                                   (["--event-deadline", String(repeating: "\u{1B}", count: 100)], "not '\(String(repeating: "\\u001b", count: 13))\\u…'"),
                                   (["--bogus\u{1B}["], #"unknown option '--bogus\u001b['"#)] {
            let result = try run(BuildProducts.modhostd, arguments)
            #expect(result.status == 64)
            let first = result.standardError.split(separator: "\n").first ?? ""
            #expect(first.contains(shown) && !first.contains("\u{1B}") && first.utf8.count < 200, "\(result.standardError)")
        }
    }

    @Test(arguments: ["1e300", "inf", "-5", "0", "nan", "86401", "0x1p3", "-1e-400", "1e1"])
    func aClientTimeoutOutOfRangeIsAUsageError(value: String) throws {
        let result = try run(BuildProducts.modhostctl, ["--socket", "/nonexistent/sock", "list", "--timeout", value])
        #expect(!result.signalled)
        #expect(result.status == 64, "\(result.standardError)")
        #expect(result.standardError.contains("--timeout must be a number of seconds from 0.001 to 86400, not '\(value)'"),
                "\(result.standardError)")
    }

    /// An empty path, or a socket path longer than a Unix socket address holds, is a usage
    /// error before anything is created: `--socket ''` made `./.lock` in the working
    /// directory, then failed with a fix about another daemon.
    @Test(arguments: [(["--plugins", ""], "--plugins is empty"), (["--state-dir", ""], "--state-dir is empty"),
                      (["--config", ""], "--config is empty"), (["--socket", ""], "--socket is empty"),
                      (["--socket", "/tmp/" + String(repeating: "s", count: 110)], "--socket is 115 bytes long; a Unix socket address holds at most 107")])
    func aBadPathOnTheCommandLineIsAUsageError(arguments: [String], message: String) throws {
        let scratch = TemporaryDirectory("bad-path")
        let result = try run(BuildProducts.modhostd, ["--plugins", scratch.directory("plugins"), "--state-dir", scratch.file("state"),
                                                      "--socket", scratch.file("sock")] + arguments, directory: scratch.path)
        #expect(result.status == ExitCode.usage.rawValue, "\(result.standardError)")
        #expect(result.standardError.contains("Error: \(message)"), "\(result.standardError)")
        #expect(!FileManager.default.fileExists(atPath: scratch.file(".lock")))
    }

    /// A socket path taken by a file or a directory is refused before its lock is made, with
    /// a fix for that cause (not "stop the other modhostd").
    @Test func aSocketPathTakenByAFileIsRefusedWithoutLeavingALock() async throws {
        let scratch = TemporaryDirectory("taken-socket")
        let taken = try scratch.write("taken", text: "not a socket")
        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", scratch.directory("plugins"), "--state-dir", scratch.file("state"),
                                                                 "--socket", taken])
        #expect(await daemon.wait(timeout: .seconds(30)) == 71, "\(daemon.text)")
        #expect(daemon.text.contains("the control socket path \(taken) is taken by a file that is not a socket. Fix: pass another --socket, or remove it if nothing needs it"),
                "\(daemon.text)")
        #expect(!FileManager.default.fileExists(atPath: taken + ".lock"))
    }

    /// Outside attack: a --socket in a directory others may write (sticky, as /tmp, or
    /// not) was accepted, so another user could take the socket's name, or its lock's,
    /// first and block the start. It is refused before anything is made there.
    @Test(arguments: [0o1777, 0o777, 0o775])
    func aSocketInADirectoryOthersMayWriteIsRefused(mode: Int) async throws {
        let scratch = TemporaryDirectory("shared-socket")
        let shared = scratch.directory("shared")
        #expect(chmod(shared, mode_t(mode)) == 0)
        let socket = shared + "/modhostd.sock"
        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", scratch.directory("plugins"), "--state-dir", scratch.file("state"),
                                                                 "--socket", socket])
        #expect(await daemon.wait(timeout: .seconds(30)) == 71, "\(daemon.text)")
        let by = mode & 0o002 != 0 ? "others" : "group"
        #expect(daemon.text.contains("the control socket's directory \(shared) is writable by \(by) (mode \(String(mode, radix: 8)))"),
                "\(daemon.text)")
        #expect(!FileManager.default.fileExists(atPath: socket + ".lock") && !FileManager.default.fileExists(atPath: socket))
    }

    @Test func anArgumentThatIsNotUTF8IsAUsageErrorNotAReplacementCharacter() throws {
        // Through the shell, since a Swift string cannot hold the byte 0xFF.
        for (tool, name) in [(BuildProducts.modhostd, "modhostd"), (BuildProducts.modhostctl, "modhostctl")] {
            let result = try run("/bin/bash", ["-c", #"exec "$0" --plugins "$(printf 'ab\xff')" --socket /nonexistent/sock"#, tool])
            #expect(result.status == ExitCode.usage.rawValue, "\(name): \(result.standardError)")
            #expect(result.standardError.contains("Error: argument 2 is not valid UTF-8 at byte 2"), "\(name): \(result.standardError)")
        }
    }

    // MARK: The configuration file

    static let badConfigurations: [(text: [UInt8], message: String)] = [
        (Array(#"{"modules": {"counter": {"order": 1e300}}}"#.utf8),
         #"field "modules.counter.order" is 1e+300, not an integer from -1000000000 to 1000000000"#),
        (Array(#"{"modules": {"counter": {"order": -1e10}}}"#.utf8), #"field "modules.counter.order" is -10000000000"#),
        (Array(#"{"eventDeadlineSeconds": 1e400}"#.utf8), "is not valid JSON at byte 25: number 1e400 is out of range"),
        (Array(#"{"eventDeadlineSeconds": 1e-9}"#.utf8), #"field "eventDeadlineSeconds" is 1e-09, not a number of seconds from 0.001 to 3600"#),
        (Array(#"{"logLevel": "info", "logLevel": "debug"}"#.utf8), #"is not valid JSON at byte 21: duplicate member name "logLevel""#),
        (Array(#"{"eventDeadlineSeconds": 05}"#.utf8), "is not valid JSON at byte 25: leading zero"),
        (Array(#"{"pluginDirectories": [""#.utf8) + [0xFF, 0xFE] + Array(#""]}"#.utf8), "is not valid JSON at byte 24: invalid UTF-8"),
        (Array(#"{"modules": {"../x": {"enabled": false}}}"#.utf8), #"field "modules" names "../x", not a name: names are 1 to 64"#),
        // The system would read the path cut at the NUL: every file in /tmp would be refused
        // as "not a regular file (a directory)"; an empty or relative one reads nowhere sure.
        (Array(#"{"pluginDirectories": ["/tmp\u0000x"]}"#.utf8),
         #"field "pluginDirectories" holds "/tmp\u0000x", which holds a NUL byte. Fix: list each plugin directory by its absolute path"#),
        (Array(#"{"pluginDirectories": [""]}"#.utf8), #"field "pluginDirectories" holds "", which is empty"#),
        (Array(#"{"pluginDirectories": ["plugins"]}"#.utf8), #"field "pluginDirectories" holds "plugins", which is not an absolute path"#),
    ]

    @Test(arguments: badConfigurations.indices)
    func anInvalidConfigurationIsRefusedAtStartNamingTheFileAndField(index: Int) async throws {
        let (text, message) = Self.badConfigurations[index]
        let dir = TemporaryDirectory("bad-config")
        let path = try dir.write("modhostd.json", text)
        let (status, output) = try await refusedStart(["--config", path, "--plugins", dir.directory("plugins")])
        #expect(status == 65, "\(output)")
        #expect(output.contains("Error: \(path): configuration \(message)"), "\(output)")
        #expect(output.split(separator: "\n").count == 1, "\(output)")
    }

    @Test func anOutOfRangeOrderOnSIGHUPKeepsTheRunningConfiguration() async throws {
        let h = try DaemonLifecycleTests.Harness(["Greeting", "Counter"], config: #"{"modules": {"counter": {"order": 1}}}"#)
        #expect(await h.waitFor("started 2 modules: counter, greeting"))
        try h.root.write("modhostd.json", text: #"{"modules": {"counter": {"order": 1e300}}}"#)
        h.daemon.send(SIGHUP)
        let file = h.root.file("modhostd.json")
        #expect(await h.waitFor(#"reload: \#(file): configuration field "modules.counter.order" is 1e+300, not an integer from -1000000000 to 1000000000"#))
        #expect(await h.waitFor("keeping the running configuration"))
        let rows = try h.modules()
        #expect(rows["counter"]?["state"] as? String == "running")
        #expect(rows["greeting"]?["state"] as? String == "running")
        #expect(await h.stop() == 0)
    }

    /// A client that leaks connections (here 128, every slot, half of them with a request
    /// never finished) does not lock the operator out: `modhostctl list` still answers, at once.
    @Test func leakedIdleConnectionsDoNotLockModhostctlOut() async throws {
        let h = try DaemonLifecycleTests.Harness(["Counter"])
        #expect(await h.waitFor("started 1 module: counter"))
        let leaked = try (0..<128).map { _ in try RawConnection(h.socket) }
        for connection in leaked.prefix(64) { connection.send("{\"cmd\":") }  // half of them with a request never finished
        // Leaked connections make room once they have waited the grace (0.25 s) for a
        // request; a second and a half covers their threads starting late on a loaded machine.
        try await Task.sleep(for: .milliseconds(1500))
        let started = ContinuousClock.now
        let list = try h.ctl("list")
        #expect(list.status == 0, "\(list.standardOutput)\(list.standardError)")
        #expect(list.standardOutput.contains("counter"))
        #expect(ContinuousClock.now - started < .seconds(10))
        _ = leaked
        #expect(await h.stop() == 0)
    }

    // MARK: Names from plugin files

    /// A valid C plugin whose manifest claims `name`.
    static func plugin(named name: String, in directory: TemporaryDirectory) throws -> String {
        let factory = PluginFactory(directory: directory.path)
        let source = try factory.buildC("Plain", source: PluginFactory.cSource(plugin: "Plain", modules: ["plain"]),
                                        manifest: PluginFactory.manifest(plugin: "Plain", modules: ["plain"]))
        let quoted = JSONValue.string(name).jsonText
        let manifest = PluginFactory.manifest(plugin: "Plain", modules: ["plain"])
            .replacingOccurrences(of: #""name":"Plain""#, with: #""name":\#(quoted)"#)
        return try factory.withManifest(source, manifest, as: "libNamed.so")
    }

    @Test(arguments: ["../../escaped", "a/b", "bad\nname", "esc\u{1B}[31mred", ".hidden", String(repeating: "n", count: 65)])
    func aPluginWithABadNameIsRefusedAndNothingIsWrittenOutsideTheStateDirectory(name: String) async throws {
        let h = try DaemonLifecycleTests.Harness(["Greeting"])
        #expect(await h.waitFor("started 1 module: greeting"))
        let scratch = TemporaryDirectory("bad-name")
        try h.drop(try Self.plugin(named: name, in: scratch), as: "libNamed.so")
        #expect(await h.waitFor(#"refused \#(h.plugins)/libNamed.so: manifest check failed: manifest is garbled: field "name" is"#))
        let line = h.daemon.text.split(separator: "\n").first { $0.contains("libNamed.so") } ?? ""
        #expect(line.contains("not a name: names are 1 to 64"), "\(line)")
        #expect(!h.daemon.text.contains("\u{1B}"))
        // Nothing appeared next to the state directory or above it.
        for directory in [h.root.path, URL(fileURLWithPath: h.root.path).deletingLastPathComponent().path] {
            let entries = try FileManager.default.contentsOfDirectory(atPath: directory)
            #expect(!entries.contains { $0.hasPrefix("escaped") }, "\(entries)")
        }
        let images = (try? FileManager.default.contentsOfDirectory(atPath: h.state + "/images")) ?? []
        #expect(images.allSatisfy { $0.hasPrefix("Greeting-") }, "\(images)")
        #expect(try h.modules()["greeting"]?["state"] as? String == "running")
        #expect(await h.stop() == 0)

        let verify = try run(BuildProducts.modhostctl, ["verify", scratch.file("libNamed.so")])
        #expect(verify.status == 1)
        #expect(verify.standardOutput.contains(#"manifest check failed: manifest is garbled: field "name" is"#), "\(verify.standardOutput)")
        #expect(verify.standardOutput.split(separator: "\n").count == 2, "\(verify.standardOutput)")
    }

    /// The control characters of a terminal: C0, DEL and C1 (0x9B is a CSI on its own), and
    /// the characters that reorder or break a shown line (bidirectional overrides, U+2028).
    static func hasControlCharacters(_ text: String) -> Bool {
        text.unicodeScalars.contains {
            ($0.value < 0x20 && $0 != "\n") || (0x7F...0x9F).contains($0.value) || (0x202A...0x202E).contains($0.value)
                || (0x2066...0x2069).contains($0.value) || [0x061C, 0x200E, 0x200F, 0x2028, 0x2029].contains($0.value)
        }
    }

    @Test func inspectAndVerifyShowAManifestsTextWithItsControlCharactersEscaped() throws {
        let scratch = TemporaryDirectory("hostile-text")
        let factory = PluginFactory(directory: scratch.path)
        let source = try factory.buildC("Plain", source: PluginFactory.cSource(plugin: "Plain", modules: ["plain"]),
                                        manifest: PluginFactory.manifest(plugin: "Plain", modules: ["plain"]))
        let manifest = PluginFactory.manifest(plugin: "Plain", modules: ["plain"])
            .replacingOccurrences(of: #""version":"1.0""#, with: #""version":"1\n\u001b[2J""#)
            .replacingOccurrences(of: #""description":"test plugin""#, with: #""description":"x\u001b]0;title\u0007\u009b2J \u202etxt.exe""#)
        let file = try factory.withManifest(source, manifest, as: "libPlain.so")

        let inspect = try run(BuildProducts.modhostctl, ["inspect", file])
        #expect(!Self.hasControlCharacters(inspect.standardOutput), "\(inspect.standardOutput.debugDescription)")
        #expect(inspect.standardOutput.contains(#"version:      1\n\u001b[2J"#), "\(inspect.standardOutput)")
        #expect(inspect.standardOutput.contains(#"description:  x\u001b]0;title\u0007\u009b2J \u202etxt.exe"#), "\(inspect.standardOutput)")
        #expect(!inspect.standardOutput.split(separator: "\n").contains { $0.hasPrefix("\u{1B}") || $0 == "1" })

        let verify = try run(BuildProducts.modhostctl, ["verify", file])
        #expect(!Self.hasControlCharacters(verify.standardOutput), "\(verify.standardOutput.debugDescription)")
        #expect(verify.standardOutput.split(separator: "\n").count == 2, "\(verify.standardOutput)")
    }

    /// A version is free-form but bounded: a longer one is refused by the manifest check,
    /// and a C module's version in its descriptor by the loader, each with one line.
    @Test func aVersionLongerThan64BytesIsRefused() async throws {
        let scratch = TemporaryDirectory("long-version")
        let factory = PluginFactory(directory: scratch.path)
        let long = String(repeating: "9", count: 65)
        let source = try factory.buildC("Wide", source: PluginFactory.cSource(plugin: "Wide", modules: ["wide"]),
                                        manifest: PluginFactory.manifest(plugin: "Wide", modules: ["wide"]))
        let file = try factory.withManifest(source, PluginFactory.manifest(plugin: "Wide", modules: ["wide"])
            .replacingOccurrences(of: #""version":"1.0""#, with: #""version":"\#(long)""#), as: "libWide.so")
        let verify = try run(BuildProducts.modhostctl, ["verify", file])
        #expect(verify.status == 1)
        #expect(verify.standardOutput.contains(#"field "version" is "\#(long)", 65 bytes: versions are at most 64 bytes"#), "\(verify.standardOutput)")

        let plugins = scratch.directory("plugins")
        let tall = try factory.buildC("Tall", source: PluginFactory.cSource(plugin: "Tall", modules: ["tall"])
            .replacingOccurrences(of: #".version = "1.0""#, with: #".version = "\#(long)""#),
                           manifest: PluginFactory.manifest(plugin: "Tall", modules: ["tall"]))
        try scratch.copy(tall, as: "plugins/libTall.so")
        // verify --load says so too, from its trial load.
        let trial = try run(BuildProducts.modhostctl, ["verify", "--load", plugins])
        #expect(trial.status == 1)
        #expect(trial.standardOutput.contains("module tall's version is longer than 64 bytes"), "\(trial.standardOutput)")
        let load = try await StartupLoad(directories: [plugins])
        await load.shutdown()
        #expect(load.loaded.isEmpty)
        #expect(load.refused.map(\.description) == [
            "\(plugins)/libTall.so: descriptor check failed: module \"tall\"'s version is \"\(long)\", 65 bytes: versions are at most 64 bytes. Fix: give the module a version of at most 64 bytes, such as \"1.0.0\""
        ])
    }

    @Test(arguments: [
        (#"{ "name": "../Hello", "version": "1.0.0", "modules": ["hello"] }"#,
         #"plugin.json: field "name" is "../Hello", not a name: names are 1 to 64"#),
        (#"{ "name": "Hello", "version": "1.0.0", "modules": ["hello"], "name": "Other" }"#,
         #"plugin.json: not valid JSON at byte 61: duplicate member name "name""#),
    ])
    func pluginMkRefusesABadPluginJSON(manifest: String, message: String) throws {
        let dir = TemporaryDirectory("bad-plugin-mk")
        try dir.write("plugin.json", text: manifest)
        try dir.write("Makefile", text: "PLUGIN = Hello\ninclude \(BuildProducts.directory)/share/modulehost/plugin.mk\n")
        try dir.write("hello.c", text: PluginFactory.cSource(plugin: "Hello", modules: ["hello"]))
        do {
            _ = try shell("make 2>&1", directory: dir.path)
            Issue.record("make succeeded")
        } catch let error as ShellError {
            #expect(error.output.contains(message), "\(error.output)")
        }
        #expect(!FileManager.default.fileExists(atPath: dir.file("build/libHello.so")))
    }
}
