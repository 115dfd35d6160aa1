import Foundation
import Glibc
import ModuleKit
import Testing
import TestSupport

/// modhostd as operators run it: real binaries, a temporary plugin directory, files dropped,
/// replaced and removed while it runs, controlled with modhostctl.
@Suite(.timeLimit(.minutes(5)), .serialized) struct DaemonLifecycleTests {
    /// One daemon with its own directories.
    final class Harness: Sendable {
        let root = TemporaryDirectory("daemon-life")
        let plugins: String
        let state: String
        let socket: String
        let daemon: RunningProcess

        /// `files` are plugin files (paths) placed in the plugin directory before the start.
        init(_ examples: [String] = ["Greeting", "Welcome", "Counter"], files: [String] = [], arguments: [String] = [],
             environment: [String: String] = [:], config: String? = nil) throws {
            plugins = root.directory("plugins")
            state = root.file("state")
            socket = root.file("modhostd.sock")
            for name in examples { try root.copy(BuildProducts.plugin(name), as: "plugins/lib\(name).so") }
            for file in files { try root.copy(file, as: "plugins/" + (file as NSString).lastPathComponent) }
            var arguments = ["--plugins", plugins, "--state-dir", state, "--socket", socket] + arguments
            if let config {
                try root.write("modhostd.json", text: config)
                arguments += ["--config", root.file("modhostd.json")]
            }
            daemon = try RunningProcess(BuildProducts.modhostd, arguments, environment: environment)
        }

        func ctl(_ arguments: String...) throws -> ProcessResult {
            try run(BuildProducts.modhostctl, ["--socket", socket] + arguments)
        }

        /// `modhostctl list --json`, as module name → row.
        func modules() throws -> [String: [String: Any]] {
            let result = try ctl("list", "--json")
            let reply = try JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8)) as? [String: Any]
            guard let rows = reply?["modules"] as? [[String: Any]] else { return [:] }
            var byName: [String: [String: Any]] = [:]
            for row in rows {
                let module = row["module"] as? String ?? "-"
                byName[module == "-" ? (row["file"] as? String ?? "") : module] = row
            }
            return byName
        }

        /// Copies a file into the plugin directory the safe way: a dotfile, then a rename.
        func drop(_ source: String, as name: String) throws {
            let temporary = plugins + "/." + name + ".tmp"
            try FileManager.default.copyItem(atPath: source, toPath: temporary)
            chmod(temporary, 0o644)
            #expect(rename(temporary, plugins + "/" + name) == 0)
        }

        func waitFor(_ text: String) async -> Bool { await daemon.waitFor(text, timeout: .seconds(60)) }

        func stop() async -> Int32 {
            daemon.send(SIGTERM)
            return await daemon.wait()
        }
    }

    /// Waits until `condition` holds, polling.
    func eventually(_ condition: () throws -> Bool) async rethrows -> Bool {
        for _ in 0..<300 {
            if try condition() { return true }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return false
    }

    @Test func dropByRenameAndByCopyThenRemove() async throws {
        let h = try Harness(["Greeting"])
        #expect(await h.waitFor("started 1 module"))
        #expect(await h.waitFor("control socket ready"))

        try h.drop(BuildProducts.plugin("Counter"), as: "libCounter.so")
        #expect(await h.waitFor("loaded plugin Counter"))
        // A plain copy: acted on at IN_CLOSE_WRITE, never on a half-written file.
        try FileManager.default.copyItem(atPath: BuildProducts.plugin("Calculator"), toPath: h.plugins + "/libCalculator.so")
        #expect(await h.waitFor("loaded plugin Calculator"))
        let rows = try h.modules()
        #expect(rows["counter"]?["state"] as? String == "running")
        #expect(rows["calculator"]?["state"] as? String == "running")

        #expect(unlink(h.plugins + "/libCounter.so") == 0)
        #expect(await h.waitFor("removed plugin Counter"))
        #expect(try await eventually { try h.modules()["counter"] == nil })
        #expect(h.daemon.text.contains("event willUnload"))
        let status = try h.ctl("status", "--json")
        let object = try JSONSerialization.jsonObject(with: Data(status.standardOutput.utf8)) as? [String: Any]
        #expect(object?["retiredGenerations"] as? Int == 1)
        #expect((object?["retiredBytes"] as? Int ?? 0) > 0)
        #expect(await h.stop() == 0)
    }

    @Test func badFilesAreRefusedAndTheDaemonCarriesOn() async throws {
        let h = try Harness(["Greeting", "Counter"])
        #expect(await h.waitFor("started 2 modules"))
        let whole = try Data(contentsOf: URL(fileURLWithPath: BuildProducts.plugin("Calculator")))
        let scratch = TemporaryDirectory("bad")
        try scratch.write("random", (0..<2048).map { UInt8(truncatingIfNeeded: $0 &* 7919) })
        try scratch.write("truncated", Array(whole.prefix(3000)))
        try scratch.write("text", text: "#!/bin/sh\necho not a plugin\n")
        try scratch.write("empty", [])
        for name in ["random", "truncated", "text", "empty"] {
            try h.drop(scratch.file(name), as: "lib\(name).so")
            #expect(await h.waitFor("refused \(h.plugins)/lib\(name).so"))
        }
        // Still alive and serving, the good modules untouched.
        let rows = try h.modules()
        #expect(rows["greeting"]?["state"] as? String == "running")
        #expect(rows["counter"]?["state"] as? String == "running")
        for name in ["random", "truncated", "text", "empty"] {
            #expect(rows[h.plugins + "/lib\(name).so"]?["state"] as? String == "refused")
        }
        #expect(await h.stop() == 0)
    }

    /// A C plugin whose entry point dereferences NULL.
    static func crashingPlugin(in directory: String, name: String = "Crasher") throws -> String {
        try PluginFactory(directory: directory).buildC(
            name, source: PluginFactory.cSource(plugin: name, modules: [name.lowercased()],
                                                entryBody: "volatile int *nowhere = 0; *nowhere = 1; return &plugin;"),
            manifest: PluginFactory.manifest(plugin: name, modules: [name.lowercased()]))
    }

    @Test func aPluginThatCrashesOnLoadAtRunTimeNeverTouchesTheDaemon() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("started 1 module"))
        let scratch = TemporaryDirectory("crasher")
        try h.drop(try Self.crashingPlugin(in: scratch.path), as: "libCrasher.so")
        #expect(await h.waitFor("crashed a trial load in a child process (signal 11"))
        #expect(try h.modules()["counter"]?["state"] as? String == "running")
        // One line says it: no backtrace of the trial process in the daemon's log.
        #expect(!h.daemon.text.contains("Backtracing"), "\(h.daemon.text)")
        #expect(await h.stop() == 0)
    }

    /// A file that crashed a trial load is refused at the next start too, which loads
    /// without a trial: the crash guard keeps it like a crash of the daemon.
    @Test func aPluginThatCrashedATrialLoadIsRefusedAtTheNextStart() async throws {
        let scratch = TemporaryDirectory("trialcrash")
        let plugins = scratch.directory("plugins")
        try scratch.copy(BuildProducts.plugin("Counter"), as: "plugins/libCounter.so")
        let arguments = ["--plugins", plugins, "--state-dir", scratch.file("state"), "--socket", scratch.file("sock")]
        let first = try RunningProcess(BuildProducts.modhostd, arguments)
        #expect(await first.waitFor("started 1 module: counter"))
        // Built elsewhere and renamed in: the daemon sees a finished file.
        let bomb = try Self.crashingPlugin(in: scratch.directory("build"), name: "Bomb")
        #expect(rename(bomb, plugins + "/libBomb.so") == 0)
        #expect(await first.waitFor("crashed a trial load in a child process (signal 11"))
        first.send(SIGTERM)
        #expect(await first.wait() == 0)
        // Second start: refused with the reason, not loaded (before, the daemon died of it).
        let second = try RunningProcess(BuildProducts.modhostd, arguments)
        #expect(await second.waitFor("started 1 module: counter"))
        #expect(second.text.contains("crash guard check failed: this file crashed a trial load in a child process (signal 11 (Segmentation fault))"),
                "\(second.text)")
        second.send(SIGTERM)
        #expect(await second.wait() == 0)
    }

    @Test func aPluginThatCrashedTheDaemonIsRefusedAtTheNextStart() async throws {
        let scratch = TemporaryDirectory("crashguard")
        let plugins = scratch.directory("plugins")
        _ = try Self.crashingPlugin(in: plugins, name: "Bomb")
        try scratch.copy(BuildProducts.plugin("Counter"), as: "plugins/libCounter.so")
        let arguments = ["--plugins", plugins, "--state-dir", scratch.file("state"), "--socket", scratch.file("sock")]
        // First start: the plugin is loaded in-process (no trial at start) and kills the daemon.
        let first = try RunningProcess(BuildProducts.modhostd, arguments)
        let status = await first.wait()
        #expect(status == 128 + SIGSEGV)
        // Second start: refused with the reason, everything else runs.
        let second = try RunningProcess(BuildProducts.modhostd, arguments)
        #expect(await second.waitFor("started 1 module: counter"))
        #expect(second.text.contains("plugin Bomb crashed the host process during entry"))
        #expect(second.text.contains("crash guard check failed: this file crashed the host process during entry"))
        let list = try run(BuildProducts.modhostctl, ["--socket", scratch.file("sock"), "list"])
        #expect(list.standardOutput.contains("crashed the host process during entry"))
        second.send(SIGTERM)
        #expect(await second.wait() == 0)
    }

    @Test func replacingAPluginHandsStateOverAndRestartsItsDependents() async throws {
        let h = try Harness(["Greeting", "Welcome", "Counter"])
        #expect(await h.waitFor("started 3 modules"))
        func greeting() throws -> [String: Any]? {
            let info = try h.ctl("info", "--json")
            let payload = try JSONSerialization.jsonObject(with: Data(info.standardOutput.utf8)) as? [String: Any]
            let modules = payload?["modules"] as? [[String: Any]]
            return modules?.first { $0["name"] as? String == "greeting" }?["metadata"] as? [String: Any]
        }
        #expect(try greeting()?["greetingsGiven"] as? Double == 1)  // Welcome greeted once

        // Version 2 of Greeting: same code, new manifest, built with plugin.mk.
        let work = TemporaryDirectory("greeting-v2")
        try shell("cp '\(BuildProducts.packageRoot)'/Plugins/Greeting/*.swift '\(work.path)'/")
        let manifest = try String(contentsOfFile: BuildProducts.packageRoot + "/Plugins/Greeting/plugin.json", encoding: .utf8)
        try work.write("plugin.json", text: manifest.replacingOccurrences(of: "\"version\": \"1.0.0\"", with: "\"version\": \"2.0.0\""))
        try work.write("Makefile", text: "PLUGIN = Greeting\ninclude \(BuildProducts.pluginMakefile)\n")
        try shell("make -s", directory: work.path)
        try h.drop(work.path + "/build/libGreeting.so", as: "libGreeting.so")

        #expect(await h.waitFor("replaced plugin Greeting 1.0.0 by 2.0.0 (generation 2)"))
        let rows = try h.modules()
        #expect(rows["greeting"]?["generation"] as? Int == 2)
        #expect(rows["welcome"]?["generation"] as? Int == 2)  // restarted against the new version
        #expect(rows["counter"]?["generation"] as? Int == 1)  // unrelated: untouched
        // The count survived the replacement, and the restarted Welcome found the new
        // Greeter by casting to the protocol of the new image.
        #expect(try greeting()?["greetingsGiven"] as? Double == 2)
        #expect(h.daemon.text.components(separatedBy: "Hello, operator! (via greeting)").count == 3)
        #expect(!h.daemon.text.contains("no module provides Greeter"))
        #expect(await h.stop() == 0)
    }

    /// Replacing for ever: every in-process replace leaves its old image mapped, so once
    /// `retiredImageLimit` are, the daemon executes itself again (same pid, same socket
    /// path), which unmaps them; the modules' states survive it as they survive a replace,
    /// and the replaces go on.
    @Test(.timeLimit(.minutes(5)))
    func pastItsRetiredImageLimitTheDaemonExecutesItselfAgainKeepingState() async throws {
        let h = try Harness(["Greeting", "Welcome"], config: #"{"retiredImageLimit": 4}"#)
        #expect(await h.waitFor("started 2 modules"))
        func greetings() throws -> Double? {
            let info = try h.ctl("info", "--json")
            let payload = try JSONSerialization.jsonObject(with: Data(info.standardOutput.utf8)) as? [String: Any]
            let modules = payload?["modules"] as? [[String: Any]]
            let greeting = modules?.first { $0["name"] as? String == "greeting" }?["metadata"] as? [String: Any]
            return greeting?["greetingsGiven"] as? Double
        }
        func status() throws -> [String: Any] {
            let result = try h.ctl("status", "--json")
            return try JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8)) as? [String: Any] ?? [:]
        }
        let pid = try status()["pid"] as? Int
        let works = [TemporaryDirectory("greeting-2.0.0"), TemporaryDirectory("greeting-3.0.0")]
        let builds = try zip(["2.0.0", "3.0.0"], works).map { try Self.greeting(version: $0, salutation: "Hi", in: $1) }
        // Each replace retires two images (Greeting's, and Welcome's, which depends on it and
        // is loaded again); Welcome greets once at each of its starts.
        try h.drop(builds[0], as: "libGreeting.so")
        #expect(await h.waitFor("replaced plugin Greeting 1.0.0 by 2.0.0"), "\(h.daemon.text)")
        // The socket is kept across the renewal (clients that connect meanwhile wait in its
        // backlog): the same file, not one made anew.
        var socketBefore = stat()
        #expect(stat(h.socket, &socketBefore) == 0)
        try h.drop(builds[1], as: "libGreeting.so")
        #expect(await h.waitFor("replaced plugin Greeting 2.0.0 by 3.0.0"), "\(h.daemon.text)")
        #expect(await h.waitFor("4 retired plugin images are mapped in this process (retiredImageLimit 4)"), "\(h.daemon.text)")
        #expect(await h.waitFor("took over from the daemon this program replaced: 1 module's state handed over"), "\(h.daemon.text)")
        var started = false
        for _ in 0..<600 where !started {
            started = h.daemon.text.components(separatedBy: "control socket ready").count == 3
            if !started { try await Task.sleep(for: .milliseconds(50)) }
        }
        #expect(started, "\(h.daemon.text)")
        var socketAfter = stat()
        #expect(stat(h.socket, &socketAfter) == 0 && socketAfter.st_ino == socketBefore.st_ino, "the control socket was made anew")
        let after = try status()
        #expect(after["pid"] as? Int == pid, "the daemon executed itself again in its own process")
        #expect(after["retiredGenerations"] as? Int == 0)
        #expect(try h.modules()["greeting"]?["version"] as? String == "3.0.0")
        // 1, one more per replace, one more at the start after the renewal: the count went on.
        #expect(try greetings() == 4, "\(h.daemon.text)")
        // And the replaces go on.
        try h.drop(builds[0], as: "libGreeting.so")
        #expect(await h.waitFor("replaced plugin Greeting 3.0.0 by 2.0.0"), "\(h.daemon.text)")
        #expect(try greetings() == 5, "\(h.daemon.text)")
        #expect(await h.stop() == 0)
    }

    /// Builds Greeting from its sources with another version and salutation, as an author
    /// deploying new code would, in `work`, and returns the built file.
    static func greeting(version: String, salutation: String, in work: TemporaryDirectory) throws -> String {
        try shell("cp '\(BuildProducts.packageRoot)'/Plugins/Greeting/*.swift '\(work.path)'/")
        let source = try String(contentsOfFile: work.path + "/Greeting.swift", encoding: .utf8)
            .replacingOccurrences(of: "static let version = \"1.0.0\"", with: "static let version = \"\(version)\"")
            .replacingOccurrences(of: "?? \"Hello\"", with: "?? \"\(salutation)\"")
        try work.write("Greeting.swift", text: source)
        let manifest = try String(contentsOfFile: BuildProducts.packageRoot + "/Plugins/Greeting/plugin.json", encoding: .utf8)
        try work.write("plugin.json", text: manifest.replacingOccurrences(of: "\"version\": \"1.0.0\"", with: "\"version\": \"\(version)\""))
        try work.write("Makefile", text: "PLUGIN = Greeting\ninclude \(BuildProducts.pluginMakefile)\n")
        try shell("make -s", directory: work.path)
        return work.path + "/build/libGreeting.so"
    }

    /// What a replace promises: the new image's code and version run, generation after
    /// generation, with and without a dependent.
    @Test(arguments: [["Greeting", "Welcome"], ["Greeting"]])
    func aReplacedSwiftPluginRunsTheNewCode(examples: [String]) async throws {
        let h = try Harness(examples)
        #expect(await h.waitFor("started \(examples.count) module"))
        for (generation, salutation) in [(2, "Howdy"), (3, "Ahoy")] {
            let version = "\(generation).0.0"
            let work = TemporaryDirectory("greeting-\(version)")
            try h.drop(try Self.greeting(version: version, salutation: salutation, in: work), as: "libGreeting.so")
            #expect(await h.waitFor("replaced plugin Greeting \(generation - 1).0.0 by \(version) (generation \(generation))"))
            let rows = try h.modules()
            #expect(rows["greeting"]?["version"] as? String == version)
            #expect(rows["greeting"]?["generation"] as? Int == generation)
            let info = try h.ctl("info", "--json")
            let payload = try JSONSerialization.jsonObject(with: Data(info.standardOutput.utf8)) as? [String: Any]
            let greeting = (payload?["modules"] as? [[String: Any]])?.first { $0["name"] as? String == "greeting" }
            #expect(greeting?["version"] as? String == version)
            #expect((greeting?["metadata"] as? [String: Any])?["salutation"] as? String == salutation)
            if examples.contains("Welcome") {
                // The restarted dependent reaches the new provider's code.
                #expect(await h.waitFor("\(salutation), operator! (via greeting)"))
            }
        }
        #expect(await h.stop() == 0)
    }

    /// The same promise for a C plugin: each generation's handler is the one that runs.
    @Test func aReplacedCPluginRunsTheNewCode() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("started 1 module"))
        for generation in 1...3 {
            let version = "\(generation).0"
            let scratch = TemporaryDirectory("tally-\(generation)")
            try PluginFactory(directory: scratch.path).buildC(
                "Tally",
                source: PluginFactory.cSource(plugin: "Tally", modules: ["tally"])
                    .replacingOccurrences(of: ".version = \"1.0\"", with: ".version = \"\(version)\"")
                    .replacingOccurrences(of: "\"event %s %s\"", with: "\"generation \(generation) got %s\""),
                manifest: PluginFactory.manifest(plugin: "Tally", modules: ["tally"])
                    .replacingOccurrences(of: "\"version\":\"1.0\"", with: "\"version\":\"\(version)\""))
            try h.drop(scratch.path + "/libTally.so", as: "libTally.so")
            #expect(await h.waitFor(generation == 1 ? "loaded plugin Tally 1.0" : "by \(version) (generation \(generation))"))
            let rows = try h.modules()
            #expect(rows["tally"]?["version"] as? String == version)
            #expect(rows["tally"]?["generation"] as? Int == generation)
            #expect(try h.ctl("send", "knock\(generation)", "--to", "tally").status == 0)
            #expect(await h.waitFor("generation \(generation) got knock\(generation)"))
            // A private copy per loaded version, in memory (nothing on disk): Counter's and
            // every Tally's, as the replaced ones stay mapped.
            #expect(try FileManager.default.contentsOfDirectory(atPath: h.state + "/images").isEmpty)
            let fds = "/proc/\(h.daemon.pid)/fd"
            let images = try FileManager.default.contentsOfDirectory(atPath: fds).compactMap {
                try? FileManager.default.destinationOfSymbolicLink(atPath: fds + "/" + $0)
            }.filter { $0.hasPrefix("/memfd:Tally-") || $0.hasPrefix("/memfd:Counter-") }
            #expect(images.count == generation + 1, "\(images)")
            #expect(images.contains { $0.hasPrefix("/memfd:Tally-\(generation).") }, "\(images)")
        }
        #expect(await h.stop() == 0)
    }

    /// `list` shows the plugin's version (docs/control-protocol.md), the one plugin.json
    /// gives and the log's "replaced plugin X 1.0 by 1.1" names, not a module's own version:
    /// an author who bumps plugin.json sees the new version.
    @Test func listShowsThePluginsVersion() async throws {
        let scratch = TemporaryDirectory("list-version")
        let manifest = PluginFactory.manifest(plugin: "Versioned", modules: ["versioned"])
            .replacingOccurrences(of: #""version":"1.0""#, with: #""version":"2.5.0""#)
        try #require(manifest.contains("2.5.0"))
        let plugin = try PluginFactory(directory: scratch.path).buildC(
            "Versioned", source: PluginFactory.cSource(plugin: "Versioned", modules: ["versioned"]), manifest: manifest)
        let h = try Harness([], files: [plugin])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let row = try #require(try h.modules()["versioned"])
        #expect(row["version"] as? String == "2.5.0", "\(row)")
        h.daemon.send(SIGTERM)
        _ = await h.daemon.wait(timeout: .seconds(30))
    }

    /// docs/control-protocol.md, `post` and `send`: `modhostctl post` reaches only the
    /// modules that listen to the notification (Counter listens to "tick", Greeting to
    /// nothing); `send` is a direct event that every module gets.
    @Test func postReachesOnlyTheListenersAndSendReachesEveryModule() async throws {
        let h = try Harness(["Greeting", "Counter"])
        #expect(await h.waitFor("started 2 modules"))
        let post = try h.ctl("post", "tick", "--payload", #"{"n":7}"#)
        #expect(post.status == 0, "\(post.standardError)")
        #expect(post.standardOutput == "posted tick to counter\n")
        #expect(await h.waitFor(#"payload {"n":7}"#))
        let unheard = try h.ctl("post", "nobody.listens")
        #expect(unheard.standardOutput == "posted nobody.listens; no running module listens to it\n")
        let json = try h.ctl("post", "tick", "--json")
        #expect(try JSONValue.parse(Array(json.standardOutput.utf8)) == ["listeners": ["counter"], "notification": "tick"])
        let reserved = try h.ctl("post", "start")
        #expect(reserved.status == 1)
        #expect(reserved.standardError.hasSuffix("(reserved_event)\n"))
        #expect(try h.ctl("send", "knock").status == 0)
        #expect(await h.waitFor("event knock #"))
        #expect(await h.stop() == 0)
        let log = h.daemon.text
        #expect(log.components(separatedBy: "event tick #").count == 3, "the two posts of tick, and nothing else, reached counter")
        #expect(!log.contains("nobody.listens #"))
    }

    @Test func aBrokenNewVersionLeavesTheOldOneRunning() async throws {
        let h = try Harness(["Greeting", "Counter"])
        #expect(await h.waitFor("started 2 modules"))
        let scratch = TemporaryDirectory("broken-v2")
        // Same plugin name, but its entry returns NULL.
        try PluginFactory(directory: scratch.path).buildC(
            "Counter", source: PluginFactory.cSource(plugin: "Counter", modules: ["counter"], entryBody: "return NULL;"),
            manifest: PluginFactory.manifest(plugin: "Counter", modules: ["counter"]))
        try h.drop(scratch.path + "/libCounter.so", as: "libCounter.so")
        #expect(await h.waitFor("replacing plugin Counter failed; version 1.0.0 keeps running"))
        let rows = try h.modules()
        #expect(rows["counter"]?["state"] as? String == "running")
        #expect(rows["counter"]?["generation"] as? Int == 1)
        #expect(await h.stop() == 0)
    }

    @Test func manyControlClientsAtOnce() async throws {
        let h = try Harness(["Greeting", "Counter"])
        #expect(await h.waitFor("control socket ready"))
        let results = try await withThrowingTaskGroup(of: ProcessResult.self) { group in
            for index in 0..<8 {
                group.addTask { try h.ctl(index % 2 == 0 ? "list" : "status") }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.count == 8)
        #expect(results.allSatisfy { $0.status == 0 })
        #expect(await h.stop() == 0)
    }

    @Test(.enabled(if: getuid() == 0, "a client of another user needs root to switch users (CI runs as root)"))
    func aClientOfAnotherUserIsRefused() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        // Let nobody reach the socket's directory; the socket itself stays 0600.
        chmod(h.root.path, 0o755)
        // Copies nobody can read, wherever the checkout lives (a 0700 home, a mktemp dir).
        let tools = try ToolsForAnotherUser()
        let result = try tools.runAsNobody(tools.modhostctl, ["--socket", h.socket, "status"])
        #expect(result.status == 69)
        #expect(result.standardError.contains(h.socket))
        #expect(await h.stop() == 0)
    }

    /// Without `--config`, a reload reads the default configuration file as a start would
    /// now: a file created since the start is read, and once it is deleted the defaults and
    /// the command line apply again, each said in the log and shown by `status` (found from
    /// outside: a deleted file left its settings in force, with `configuration: unchanged`).
    /// The default file is the user's own (`$XDG_CONFIG_HOME`): as root (CI) the daemon runs
    /// as uid 65534, where /etc is not touched.
    @Test func aReloadReadsTheDefaultConfigurationFileAsAStartWould() async throws {
        let scratch = TemporaryDirectory("default-config")
        let plugins = scratch.directory("plugins")
        for name in ["Greeting", "Counter"] { try scratch.copy(BuildProducts.plugin(name), as: "plugins/lib\(name).so") }
        let home = scratch.directory("home")
        let file = home + "/config/modhostd/modhostd.json"
        let socket = home + "/sock"
        let root = getuid() == 0
        let tools = root ? try ToolsForAnotherUser() : nil
        if root { chown(home, 65534, 65534) }
        let arguments = ["--plugins", plugins, "--state-dir", home + "/state", "--socket", socket]
        let environment = ["XDG_CONFIG_HOME": home + "/config", "HOME": home]
        let daemon = try tools.map { tools in
            try RunningProcess("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", tools.modhostd] + arguments,
                               environment: environment)
        } ?? RunningProcess(BuildProducts.modhostd, arguments, environment: environment)
        func ctl(_ command: String) throws -> [String: Any] {
            let arguments = ["--socket", socket, "--json", command]
            let result = try tools.map { try $0.runAsNobody($0.modhostctl, arguments) } ?? run(BuildProducts.modhostctl, arguments)
            return try #require(try JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8)) as? [String: Any], "\(result)")
        }
        func counter() throws -> String? {
            let rows = try ctl("list")["modules"] as? [[String: Any]] ?? []
            return rows.first { $0["module"] as? String == "counter" }?["state"] as? String
        }
        #expect(await daemon.waitFor("started 2 modules", timeout: .seconds(60)), "\(daemon.text)")
        #expect(try ctl("status")["configPath"] == nil)

        // Created after the start: the reload reads it.
        try FileManager.default.createDirectory(atPath: home + "/config/modhostd", withIntermediateDirectories: true)
        try #"{"modules": {"counter": {"enabled": false}}}"#.write(toFile: file, atomically: true, encoding: .utf8)
        if root { chmod(file, 0o644) }
        daemon.send(SIGHUP)
        #expect(await daemon.waitFor("reading the configuration file \(file)", timeout: .seconds(60)), "\(daemon.text)")
        #expect(try await eventually { try counter() == "disabled" })
        #expect(try ctl("status")["configPath"] as? String == file)

        // Deleted: the defaults again.
        try FileManager.default.removeItem(atPath: file)
        daemon.send(SIGHUP)
        #expect(await daemon.waitFor("the configuration file \(file) is gone; using the defaults and the command line", timeout: .seconds(60)),
                "\(daemon.text)")
        #expect(try await eventually { try counter() == "running" })
        #expect(try ctl("status")["configPath"] == nil)
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0, "\(daemon.text)")
    }

    @Test func sighupReloadsTheConfigurationAndKeepsItWhenInvalid() async throws {
        let h = try Harness(["Greeting", "Counter"], config: #"{"modules": {"counter": {"order": 1}}}"#)
        #expect(await h.waitFor("started 2 modules: counter, greeting"))
        try h.root.write("modhostd.json", text: #"{"modules": {"counter": {"enabled": false}, "greeting": {"configuration": {"salutation": "Hi"}}}}"#)
        h.daemon.send(SIGHUP)
        #expect(await h.waitFor("reloaded:"))
        #expect(try await eventually { try h.modules()["counter"]?["state"] as? String == "disabled" })
        // Only the changed modules were touched: greeting got its new configuration in place.
        #expect(h.daemon.text.contains("configurationChanged"))
        try h.root.write("modhostd.json", text: "{ this is not json")
        h.daemon.send(SIGHUP)
        #expect(await h.waitFor("keeping the running configuration"))
        #expect(try h.modules()["greeting"]?["state"] as? String == "running")
        #expect(await h.stop() == 0)
    }

    /// A reload moves a plugin into a worker and back again: each time `list` shows where it
    /// runs and the module answers there.
    @Test(arguments: ["Greeting", "Counter"])
    func aReloadMovesAPluginIntoAWorkerAndBack(plugin: String) async throws {
        let module = plugin.lowercased()
        let h = try Harness([plugin], config: #"{"plugins": {"\#(plugin)": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("started 1 module: \(module)"))
        for isolation in ["in-process", "process", "in-process", "process"] {
            try h.root.write("modhostd.json", text: #"{"plugins": {"\#(plugin)": {"isolation": "\#(isolation)"}}}"#)
            #expect(try h.ctl("reload").status == 0)
            #expect(try await eventually {
                let row = try h.modules()[module]
                return row?["isolation"] as? String == isolation && row?["state"] as? String == "running"
            }, "\(isolation): \((try? h.modules()[module]) ?? [:])\n\(h.daemon.text)")
            #expect(try h.ctl("send", "ping", "--to", module).status == 0)
        }
        #expect(!h.daemon.text.contains("keeps running"), "\(h.daemon.text)")
        #expect(await h.stop() == 0)
    }

    @Test func aModuleThatOverrunsItsDeadlineDoesNotHoldUpShutdown() async throws {
        // A Swift plugin whose willTerminate never finishes in time, built with plugin.mk.
        let work = TemporaryDirectory("sloth")
        try work.write("Sloth.swift", text: """
            import ModuleKit
            public final class Sloth: PluginModule {
                public static let name = "sloth"
                public init?(host: isolated HostInstance, configuration: JSONValue) {}
                public func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
                    if case .willTerminate = event { try? await Task.sleep(for: .seconds(60)) }
                }
            }
            @_cdecl("modhost_plugin_entry_v1")
            public func entry() -> UnsafeRawPointer? { PluginExport.plugin("Sloth", modules: [Sloth.self]) }
            """)
        try work.write("plugin.json", text: #"{"name": "Sloth", "version": "1.0.0", "modules": ["sloth"]}"#)
        try work.write("Makefile", text: "PLUGIN = Sloth\ninclude \(BuildProducts.pluginMakefile)\n")
        try shell("make -s", directory: work.path)
        let h = try Harness(["Counter"], arguments: ["--event-deadline", "0.3"])
        try h.drop(work.path + "/build/libSloth.so", as: "libSloth.so")
        #expect(await h.waitFor("loaded plugin Sloth"))
        // Counter may load before or after Sloth: a shutdown during the startup would skip it.
        #expect(await h.waitFor("loaded plugin Counter"))
        let started = ContinuousClock.now
        #expect(await h.stop() == 0)
        #expect(ContinuousClock.now - started < .seconds(30))
        #expect(h.daemon.text.contains("module did not finish an event within the deadline; going on without it"))
        #expect(h.daemon.text.contains("module=sloth event=willTerminate"))
        // The others were still shut down.
        #expect(h.daemon.text.contains("event deinit"))
    }

    @Test func systemdHearsReadyReloadingAndStopping() async throws {
        let directory = TemporaryDirectory("notify")
        let listener = try NotifySocketListener(path: directory.file("notify.sock"))
        let h = try Harness(["Greeting", "Counter"], environment: ["NOTIFY_SOCKET": listener.path])
        let ready = try #require(await listener.next(containing: "READY=1"))
        #expect(ready.contains("READY=1"))
        // READY=1 comes only after every module started: its status counts them. (The log
        // line saying so may still be in the pipe, so it is waited for, not peeked at.)
        #expect(ready.contains("STATUS=2 modules running"))
        #expect(await h.waitFor("started 2 modules"))
        h.daemon.send(SIGHUP)
        let reloading = try #require(await listener.next(containing: "RELOADING=1"))
        #expect(reloading.contains("MONOTONIC_USEC="))
        #expect(await listener.next(containing: "READY=1") != nil)
        h.daemon.send(SIGTERM)
        #expect(await listener.next(containing: "STOPPING=1") != nil)
        #expect(await h.daemon.wait() == 0)
    }

    /// `modhostd --check-config` reads the configuration as a start would and says whether
    /// it is valid, without starting: nothing is made or loaded.
    @Test func checkConfigSaysWhetherTheConfigurationIsValidWithoutStarting() throws {
        let scratch = TemporaryDirectory("check-config")
        let plugins = scratch.directory("plugins")
        let good = try scratch.write("good.json", text: #"{"logLevel": "debug", "retiredImageLimit": 10}"#)
        let bad = try scratch.write("bad.json", text: #"{"logLevle": "debug"}"#)
        let state = scratch.file("state")
        func check(_ config: String) throws -> ProcessResult {
            try run(BuildProducts.modhostd, ["--check-config", "--config", config, "--plugins", plugins, "--state-dir", state,
                                             "--socket", scratch.file("sock")])
        }
        let valid = try check(good)
        #expect(valid.status == 0 && valid.standardOutput == "configuration OK: \(good), 1 plugin directory\n", "\(valid)")
        let invalid = try check(bad)
        #expect(invalid.status == 65 && invalid.standardError.contains(#"did you mean "logLevel"?"#), "\(invalid)")
        #expect(!FileManager.default.fileExists(atPath: state), "--check-config made the state directory")
        #expect(!FileManager.default.fileExists(atPath: scratch.file("sock")))
    }

    /// The configuration chooses JSON log lines; `--log-format` overrides it.
    @Test(arguments: [false, true])
    func theConfigurationChoosesTheLogFormat(overridden: Bool) async throws {
        let h = try Harness(["Counter"], arguments: overridden ? ["--log-format", "text"] : [], config: #"{"logFormat": "json"}"#)
        #expect(await h.waitFor("control socket ready"))
        let lines = h.daemon.text.split(separator: "\n")
        #expect(!lines.isEmpty)
        for line in lines {
            #expect(line.hasPrefix("{\"") != overridden, "\(line)")
        }
        #expect(await h.stop() == 0)
    }

    /// `info` prints text, a line per module and one per metadata member; `--json` the reply.
    @Test func infoPrintsTextAndJSONOnlyWhenAsked() async throws {
        let h = try Harness(["Greeting", "Welcome"])
        #expect(await h.waitFor("started 2 modules"))
        let text = try h.ctl("info")
        #expect(text.status == 0)
        let lines = text.standardOutput.split(separator: "\n").map(String.init)
        #expect(lines.contains("greeting 1.0.0") && lines.contains("welcome 1.0.0"), "\(lines)")
        #expect(lines.contains("  greetingsGiven: 1"), "\(lines)")
        #expect(!text.standardOutput.contains("{"))
        let json = try h.ctl("info", "--json")
        #expect(json.standardOutput.hasPrefix("{"), "\(json.standardOutput)")
        #expect(await h.stop() == 0)
    }

    /// `list --help` names every column `list` prints.
    @Test func listHelpNamesEveryColumn() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        let header = try #require(try h.ctl("list").standardOutput.split(separator: "\n").first)
        let help = try h.ctl("list", "--help").standardOutput
        for column in header.split(separator: " ") {
            #expect(help.contains(column), "list --help does not name the column \(column)")
        }
        #expect(await h.stop() == 0)
    }

    /// A shell that talks to a private daemon names its socket once, in MODHOST_SOCKET;
    /// `--socket` still wins.
    @Test func modhostctlFindsTheSocketInModhostSocket() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        let found = try run(BuildProducts.modhostctl, ["status", "--json"], environment: ["MODHOST_SOCKET": h.socket])
        #expect(found.status == 0 && found.standardOutput.contains(h.socket), "\(found)")
        let overridden = try run(BuildProducts.modhostctl, ["status", "--socket", h.root.file("nothing.sock")],
                                 environment: ["MODHOST_SOCKET": h.socket])
        #expect(overridden.status == 69, "\(overridden)")
        #expect(await h.stop() == 0)
    }

    /// With WatchdogSec=, systemd needs WATCHDOG=1 within each interval, or it restarts
    /// the daemon: it comes, at half the interval, once the daemon is ready.
    @Test func systemdHearsTheWatchdog() async throws {
        let directory = TemporaryDirectory("notify")
        let listener = try NotifySocketListener(path: directory.file("notify.sock"))
        let h = try Harness(["Counter"], environment: ["NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": "600000"])
        #expect(await listener.next(containing: "READY=1") != nil)
        #expect(await listener.next(containing: "WATCHDOG=1") != nil)
        #expect(await listener.next(containing: "WATCHDOG=1") != nil)
        #expect(await h.waitFor("watchdog: WATCHDOG=1 every 0.3 s while the control socket answers"), "\(h.daemon.text)")
        #expect(await h.stop() == 0)
    }

    /// Under systemd with its output on the journal (JOURNAL_STREAM names its standard
    /// error), each log line carries its priority, so `journalctl -p err` finds the errors.
    @Test func onTheJournalEachLogLineCarriesItsPriority() async throws {
        let scratch = TemporaryDirectory("journal")
        let plugins = scratch.directory("plugins")
        try scratch.copy(BuildProducts.plugin("Counter"), as: "plugins/libCounter.so")
        _ = try scratch.write("plugins/libBroken.so", text: "not a plugin")
        let command = "JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) exec '\(BuildProducts.modhostd)' --plugins '\(plugins)' "
            + "--state-dir '\(scratch.file("state"))' --socket '\(scratch.file("sock"))'"
        let daemon = try RunningProcess("/bin/sh", ["-c", command])
        #expect(await daemon.waitFor("control socket ready", timeout: .seconds(60)), "\(daemon.text)")
        let lines = daemon.text.split(separator: "\n")
        #expect(lines.contains { $0.hasPrefix("<6>info modhostd: control socket ready") }, "\(daemon.text)")
        #expect(lines.contains { $0.hasPrefix("<3>error modhostd: refused") && $0.contains("libBroken.so") }, "\(daemon.text)")
        #expect(!lines.contains { !$0.hasPrefix("<") }, "\(daemon.text)")
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0)
    }

    @Test func exportedFunctionsAreCalledByNameThroughTheDaemon() async throws {
        let h = try Harness(["Greeting", "Calculator"])
        #expect(await h.waitFor("control socket ready"))
        let sum = try h.ctl("call", "Calculator", "calc_add", "2", "40")
        #expect(sum.status == 0)
        #expect(sum.standardOutput == "42\n")
        let vowels = try h.ctl("call", "Greeting", "greeting_vowel_count", "operator")  // a Swift @_cdecl export
        #expect(vowels.standardOutput == "4\n")
        let json = try h.ctl("call", "--json", "Calculator", "calc_hypot", "3", "4")
        #expect(json.standardOutput.contains("5"))
        let wrong = try h.ctl("call", "Calculator", "calc_add", "2", "x")
        #expect(wrong.status == 1)
        #expect(wrong.standardError.contains("invalid_arguments"))
        let undeclared = try h.ctl("call", "Calculator", "system", "ls")
        #expect(undeclared.status == 1)
        #expect(undeclared.standardError.contains("unknown_function"))
        #expect(await h.stop() == 0)
    }

    @Test func aPluginThatHangsOnLoadAtRunTimeIsRefusedAfterTheTrialTimeout() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        let scratch = TemporaryDirectory("hanger")
        try PluginFactory(directory: scratch.path).buildC(
            "Hanger", source: PluginFactory.cSource(plugin: "Hanger", modules: ["hanger"], entryBody: "for (;;) {} return &plugin;"),
            manifest: PluginFactory.manifest(plugin: "Hanger", modules: ["hanger"]))
        try h.drop(scratch.path + "/libHanger.so", as: "libHanger.so")
        // While the trial child hangs, the daemon still answers.
        try await Task.sleep(for: .seconds(1))
        let status = try h.ctl("status", "--json")
        #expect(status.status == 0)
        #expect(!h.daemon.text.contains("did not finish within"))
        #expect(await h.waitFor("did not finish within 10 s"))
        #expect(try h.modules()["counter"]?["state"] as? String == "running")
        #expect(await h.stop() == 0)
    }

    @Test func aDroppedPluginWithATakenModuleNameIsRefusedBeforeLoading() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        let scratch = TemporaryDirectory("dup")
        try PluginFactory(directory: scratch.path).buildC(
            "Impostor", source: PluginFactory.cSource(plugin: "Impostor", modules: ["counter"]),
            manifest: PluginFactory.manifest(plugin: "Impostor", modules: ["counter"]))
        try h.drop(scratch.path + "/libImpostor.so", as: "libImpostor.so")
        #expect(await h.waitFor("duplicate name check failed: module counter is already provided by plugin Counter"))
        #expect(!h.daemon.text.contains("trial load"))  // refused before any code ran
        #expect(try h.modules()["counter"]?["plugin"] as? String == "Counter")
        #expect(await h.stop() == 0)
    }
}
