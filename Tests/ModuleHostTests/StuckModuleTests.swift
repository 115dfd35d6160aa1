import Foundation
import Glibc
import Testing
import TestSupport

/// Misbehaving C plugins against a real modhostd: a handler that never returns, a module
/// that hangs in init, a function called by name that never returns, and lifecycle names
/// sent from outside. The control plane must keep answering from the daemon's own state,
/// and SIGTERM must end the daemon within its shutdown budget.
@Suite(.timeLimit(.minutes(5)), .serialized) struct StuckModuleTests {
    typealias Harness = DaemonLifecycleTests.Harness

    /// A C plugin with one module per name; each logs `event NAME` for every event it gets
    /// and blocks forever (sleeping) on the events listed in `hangOn`, and in `create` when
    /// its configuration has a `hangcreate` member. `exports` adds
    /// C functions (source) declared in the manifest as `(name, signature)`.
    @discardableResult
    static func plugin(_ name: String, modules: [String], hangOn: [String], in directory: String,
                       exports: [(String, String)] = [], functions: String = "", listensTo: [String] = []) throws -> String {
        let hangs = hangOn.map { "strcmp(event, \"\($0)\") == 0" }.joined(separator: " || ")
        let notifications = listensTo.isEmpty ? "NULL" : "notifications"
        let descriptors = modules.map { module in
            """
                {sizeof(modhost_module), MODHOST_MODULE_C, "\(module)", "1.0", \(notifications), create, handle, destroy, NULL},
            """
        }.joined(separator: "\n")
        let source = """
            #define _POSIX_C_SOURCE 200809L
            #include <modulehost.h>
            #include <stdio.h>
            #include <stdlib.h>
            #include <string.h>
            #include <unistd.h>
            typedef struct { const modhost_host_api *host; char *name; } state;
            static void *create(const modhost_host_api *host, const char *config) {
                if (config && strstr(config, "hangcreate")) { for (;;) sleep(1); }
                state *self = calloc(1, sizeof *self); self->host = host; self->name = strdup("alive");
                return self;
            }
            static void handle(void *raw, const char *event, const char *payload) {
                state *self = raw; char line[256]; (void)payload;
                snprintf(line, sizeof line, "event %s (%s)", event, self->name);
                self->host->log(MODHOST_LOG_INFO, line);
                if (\(hangs.isEmpty ? "0" : hangs)) { for (;;) sleep(1); }
                /* A module that frees its state on deinit, as real ones do. */
                if (strcmp(event, "deinit") == 0) { free(self->name); self->name = NULL; }
            }
            static void destroy(void *raw) { state *self = raw; free(self->name); free(self); }
            \(functions)
            static const char *const notifications[] = {\(listensTo.map { "\"\($0)\", " }.joined())NULL};
            static const modhost_module modules[] = {
            \(descriptors)
            };
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(name)", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        return try PluginFactory(directory: directory).buildC(
            name, source: source, manifest: PluginFactory.manifest(plugin: name, modules: modules, exports: exports))
    }

    /// One `list` over a raw connection: the reply line and how long it took.
    static func timedList(_ socket: String) throws -> (reply: [String: Any], elapsed: Duration) {
        let clock = ContinuousClock()
        let started = clock.now
        let connection = try RawConnection(socket)
        connection.send("{\"v\":1,\"cmd\":\"list\"}\n")
        let lines = connection.readLines(1, timeout: .seconds(5)).lines
        let elapsed = clock.now - started
        let reply = lines.first.flatMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] } ?? [:]
        return (reply, elapsed)
    }

    /// The module rows of a `list` reply, by module name.
    static func rows(_ reply: [String: Any]) -> [String: [String: Any]] {
        let rows = (reply["result"] as? [String: Any])?["modules"] as? [[String: Any]] ?? []
        var byName: [String: [String: Any]] = [:]
        for row in rows { byName[row["module"] as? String ?? "-"] = row }
        return byName
    }

    /// How fast `list` answered over several requests: the median and the slowest.
    struct Answers {
        var met: Bool
        var times: [Duration]
        var median: Duration { times.isEmpty ? .seconds(3600) : times.sorted()[times.count / 2] }
        var slowest: Duration { times.max() ?? .seconds(3600) }
        /// The issue's figure, 100 ms, for the typical answer; any single answer may be
        /// delayed by the scheduler of a loaded 2-core machine, but one that waited on the
        /// stuck module would take its whole deadline (seconds), so 1 s bounds them all.
        var fast: Bool { median < .milliseconds(100) && slowest < .seconds(1) }
    }

    /// Polls `list` until `condition` holds on its rows, then a few more times, timing
    /// every answer (at least five).
    static func listUntil(_ socket: String, _ condition: ([String: [String: Any]]) -> Bool) async throws -> Answers {
        var answers = Answers(met: false, times: [])
        for _ in 0..<200 {
            let (reply, elapsed) = try timedList(socket)
            answers.times.append(elapsed)
            if reply.isEmpty { return answers }  // no answer at all
            if !answers.met { answers.met = condition(rows(reply)) }
            if answers.met && answers.times.count >= 5 { return answers }
            try await Task.sleep(for: .milliseconds(50))
        }
        return answers
    }

    /// Sends SIGTERM and waits for the daemon to end: its exit status and how long it took.
    static func terminate(_ h: Harness) async -> (exit: Int32, took: Duration) {
        let clock = ContinuousClock()
        let started = clock.now
        h.daemon.send(SIGTERM)
        let exit = await h.daemon.wait(timeout: .seconds(60))
        return (exit, clock.now - started)
    }

    @Test func aHandlerThatNeverReturnsLeavesTheControlPlaneAnsweringAndShutdownBounded() async throws {
        let scratch = TemporaryDirectory("stuck-handler")
        let plugin = try Self.plugin("Hang", modules: ["hang", "calm"], hangOn: ["block"], in: scratch.path)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "0.5", "--shutdown-budget", "4"])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        #expect(await h.waitFor("event start (alive)"))

        // Fire and forget: the reply may take the request deadline.
        let sender = try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket, "send", "block", "--to", "hang"])
        #expect(await h.waitFor("event block (alive)"))
        let stuck = try await Self.listUntil(h.socket) { rows in
            rows["hang"]?["state"] as? String == "stuck"
        }
        #expect(stuck.met, "list never showed hang as stuck")
        #expect(stuck.fast, "list answers took \(stuck.times) while a module was stuck")
        let row = Self.rows(try Self.timedList(h.socket).reply)["hang"]
        #expect((row?["stuckSeconds"] as? Double ?? -1) >= 0, "\(String(describing: row))")
        #expect(row?["stuckIn"] as? String == "block", "\(String(describing: row))")
        #expect(Self.rows(try Self.timedList(h.socket).reply)["calm"]?["state"] as? String == "running")
        // The send that got stuck was answered with the documented error.
        #expect(await sender.wait(timeout: .seconds(30)) == 1)
        #expect(sender.text.contains("deadline_exceeded") || sender.text.contains("did not finish"), "\(sender.text)")

        // The other module still gets events; the stuck one is given no more work.
        let calm = try h.ctl("send", "hello", "--to", "calm")
        #expect(calm.status == 0, "\(calm.standardError)")
        #expect(await h.waitFor("event hello (alive)"))
        let refused = try h.ctl("send", "again", "--to", "hang")
        #expect(refused.status != 0)
        #expect(refused.standardError.contains("stuck"), "\(refused.standardError)")
        #expect(!h.daemon.text.contains("event again"))
        let status = try h.ctl("status", "--json")
        #expect(status.status == 0)

        // SIGTERM ends the daemon within the budget, naming the stuck module.
        let (exit, took) = await Self.terminate(h)
        #expect(took < .seconds(15), "shutdown took \(took)")
        #expect(exit == 1, "exit status \(exit)")
        #expect(h.daemon.text.contains("shutdown budget"), "\(h.daemon.text)")
        #expect(h.daemon.text.contains("hang"))
    }

    /// An event sent to every module reaches the C modules after one that never returns from
    /// it, once the deadline has passed; the next event skips the stuck one at once, and the
    /// others get it in order.
    @Test func anEventToEveryModuleReachesTheModulesAfterOneThatNeverReturns() async throws {
        let scratch = TemporaryDirectory("stuck-fanout")
        // In module order: first, hang, last, later.
        let hanging = try Self.plugin("Hang", modules: ["hang"], hangOn: ["block"], in: scratch.path)
        let calm = try Self.plugin("Calm", modules: ["first", "later", "last"], hangOn: [], in: scratch.path)
        let h = try Harness([], files: [hanging, calm], arguments: ["--event-deadline", "0.5", "--shutdown-budget", "3"])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")

        // The log lines of the modules given `event`, in the order they were logged.
        func given(_ event: String) -> [String] {
            h.daemon.text.split(separator: "\n").filter { $0.contains("event \(event) (alive)") }.compactMap { line in
                line.split(separator: " ").first { $0.hasPrefix("module=") }.map { String($0.dropFirst("module=".count)) }
            }
        }
        func waitUntil(_ condition: () -> Bool) async -> Bool {
            for _ in 0..<1500 {
                if condition() { return true }
                try? await Task.sleep(for: .milliseconds(20))
            }
            return condition()
        }

        let clock = ContinuousClock()
        let started = clock.now
        let blocked = try h.ctl("send", "block")
        #expect(blocked.status == 1, "\(blocked.standardOutput)")
        #expect(blocked.standardError.contains("module hang did not finish event block within the event deadline of 0.5 s"),
                "\(blocked.standardError)")
        #expect(clock.now - started >= .milliseconds(500))
        #expect(await waitUntil { given("block") == ["first", "hang", "last", "later"] }, "\(h.daemon.text)")
        #expect(h.daemon.text.contains("C module did not return from block within 0.5 s"), "\(h.daemon.text)")
        // Only hang overran: one line says so, naming it.
        let overran = h.daemon.text.split(separator: "\n").filter { $0.contains("did not return from block") }
        #expect(overran.count == 1 && overran.allSatisfy { $0.contains("module=hang") }, "\(overran)")
        // One thread is left to hang's call and one called the modules after it: no more.
        let tasks = "/proc/\(h.daemon.pid)/task"
        let lanes = try FileManager.default.contentsOfDirectory(atPath: tasks).filter {
            (try? String(contentsOfFile: "\(tasks)/\($0)/comm", encoding: .utf8))?.hasPrefix("plugin-lane") == true
        }
        #expect(lanes.count <= 2, "\(lanes.count) lane threads")
        let rows = Self.rows(try Self.timedList(h.socket).reply)
        #expect(rows["hang"]?["state"] as? String == "stuck")
        #expect(rows["hang"]?["stuckIn"] as? String == "block")
        #expect(rows["later"]?["state"] as? String == "running")

        // The stuck module is passed over without waiting; the others get the event in order.
        let again = clock.now
        let next = try h.ctl("send", "next")
        #expect(next.status == 0, "\(next.standardError)")
        #expect(clock.now - again < .milliseconds(500), "the send waited for the stuck module")
        #expect(await waitUntil { given("next") == ["first", "last", "later"] }, "\(h.daemon.text)")
        #expect(h.daemon.text.contains("C module is stuck in block for "), "\(h.daemon.text)")

        _ = await Self.terminate(h)
    }

    /// `post` says which listeners did not get the notification (stuck in another callback)
    /// and which did not finish it (now stuck), naming every one, instead of counting them
    /// among the listeners reached or naming only the first.
    @Test func postNamesTheListenersThatWereStuckOrOverranAndThoseItReached() async throws {
        let scratch = TemporaryDirectory("stuck-post")
        let hanging = try Self.plugin("Hang", modules: ["hang", "slowa", "slowb"], hangOn: ["block", "tick"], in: scratch.path,
                                      listensTo: ["tick"])
        let calm = try Self.plugin("Calm", modules: ["calm"], hangOn: [], in: scratch.path, listensTo: ["tick"])
        let h = try Harness([], files: [hanging, calm], arguments: ["--event-deadline", "0.5", "--shutdown-budget", "3"])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")

        // hang is stuck in block before anything is posted.
        let sender = try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket, "send", "block", "--to", "hang"])
        let stuck = try await Self.listUntil(h.socket) { rows in rows["hang"]?["state"] as? String == "stuck" }
        #expect(stuck.met, "list never showed hang as stuck")
        #expect(await sender.wait(timeout: .seconds(30)) == 1)

        // slowa and slowb get tick and overrun; hang does not get it; calm does.
        let first = try h.ctl("post", "tick")
        #expect(first.status == 1, "\(first.standardOutput)")
        #expect(first.standardError.contains("modules slowa, slowb did not finish notification tick within the event deadline of 0.5 s"),
                "\(first.standardError)")
        #expect(first.standardError.contains("notification tick was not delivered to module hang (stuck in block for "), "\(first.standardError)")
        #expect(first.standardError.contains("it reached calm (deadline_exceeded)"), "\(first.standardError)")
        #expect(await h.waitFor("event tick (alive)"))

        // Posted again: the three are stuck and do not get it; that is module_stuck, not an overrun.
        let second = try h.ctl("post", "tick")
        #expect(second.status == 1)
        #expect(second.standardError.contains("notification tick was not delivered to modules hang (stuck in block for "), "\(second.standardError)")
        #expect(second.standardError.contains("slowa (stuck in tick for ") && second.standardError.contains("slowb (stuck in tick for "),
                "\(second.standardError)")
        #expect(!second.standardError.contains("did not finish"), "\(second.standardError)")
        #expect(second.standardError.contains("it reached calm (module_stuck)"), "\(second.standardError)")

        _ = await Self.terminate(h)
    }

    @Test func aModuleHangingInInitLetsTheDaemonBecomeReadyAndAnswer() async throws {
        let scratch = TemporaryDirectory("stuck-init")
        let plugin = try Self.plugin("Sleeper", modules: ["sleeper"], hangOn: ["init"], in: scratch.path)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "0.5", "--shutdown-budget", "3"])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let stuck = try await Self.listUntil(h.socket) { rows in
            rows["sleeper"]?["state"] as? String == "stuck"
        }
        #expect(stuck.met)
        #expect(stuck.fast, "list answers took \(stuck.times)")
        let status = try h.ctl("status")
        #expect(status.status == 0)
        #expect(status.standardOutput.contains("ready:               yes"), "\(status.standardOutput)")
        #expect(!h.daemon.text.contains("event start"), "a stuck module must get no more work")
        h.daemon.send(SIGTERM)
        #expect(await h.daemon.wait(timeout: .seconds(30)) == 1)
        #expect(h.daemon.text.contains("sleeper"))
    }

    /// A module whose `create` is running is in `list` from the moment its plugin is
    /// loaded: `loading` while `create` runs within the event deadline, `stuck` in `create`
    /// past it; and `status` counts it as running in neither case, as `list` does (found
    /// from outside: `list` had no row for it while `create` ran, though `status` counted
    /// its plugin as loaded, and `status` counted a stuck module as running).
    @Test(arguments: [30, 1])
    func aModuleInCreateIsListedAndNotCountedAsRunning(deadline: Int) async throws {
        let scratch = TemporaryDirectory("listed-create")
        let plugin = try Self.plugin("Evil", modules: ["evil"], hangOn: [], in: scratch.path)
        let h = try Harness([], files: [plugin], arguments: ["--shutdown-budget", "3"], config: """
            {"eventDeadlineSeconds":\(deadline),"modules":{"evil":{"configuration":{"hangcreate":1}}}}
            """)
        #expect(await h.waitFor("control socket"), "\(h.daemon.text)")
        let listed = try await Self.listUntil(h.socket) { rows in
            deadline > 1 ? rows["evil"]?["state"] as? String == "loading"
                         : rows["evil"]?["state"] as? String == "stuck" && rows["evil"]?["stuckIn"] as? String == "create"
        }
        #expect(listed.met, "\(h.daemon.text)")
        #expect(listed.fast, "list answers took \(listed.times)")
        let status = try h.ctl("--json", "status")
        let counts = try #require(try JSONSerialization.jsonObject(with: Data(status.standardOutput.utf8)) as? [String: Any])
        #expect(counts["pluginsLoaded"] as? Int == 1 && counts["modulesRunning"] as? Int == 0, "\(status.standardOutput)")
        _ = await Self.terminate(h)
    }

    /// Builds, with plugin.mk, the Swift plugin `name` of one module (`name` in lower case,
    /// version 1.0) whose class has `members` after its name and version (and an empty
    /// initializer, unless `members` has one). `variant` names the build directory (kept
    /// between runs).
    static func swiftPlugin(_ name: String, variant: String, members: String) throws -> String {
        let initializer = members.contains("init?(host:") ? "" : "public init?(host: isolated HostInstance, configuration: JSONValue) {}"
        let module = name.lowercased()
        let source = """
            import Glibc
            import ModuleKit

            public final class \(name): PluginModule {
                public static let name = "\(module)"
                public static let version = "1.0"
                \(initializer)
            \(members)
            }

            @_cdecl("modhost_plugin_entry_v1")
            public func modhostPluginEntry() -> UnsafeRawPointer? { PluginExport.plugin("\(name)", modules: [\(name).self]) }
            """
        return try IsolationTests.buildWithPluginMakefile(
            name, variant: variant,
            files: ["\(name).swift": source, "plugin.json": #"{"name": "\#(name)", "version": "1.0", "modules": ["\#(module)"]}"#])
    }

    /// A Swift plugin whose tasks block every thread Swift concurrency runs on (one per CPU,
    /// each in `sleep`): `ping` still answers at once, a SIGTERM still ends the daemon, with
    /// status 1 one second past the shutdown budget and a log line saying why, and a second
    /// SIGTERM ends it at once (found from outside: ping, list and both signals went
    /// unanswered for good; only SIGKILL ended the daemon).
    @Test(arguments: [false, true])
    func aSwiftPluginHoldingEveryConcurrencyThreadCannotKeepTheDaemonFromStopping(signalTwice: Bool) async throws {
        let threads = ProcessInfo.processInfo.activeProcessorCount
        let plugin = try Self.swiftPlugin("Hog", variant: "\(threads)", members: """
            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                guard case .start = event else { return }
                let logger = host.logger(for: Self.name)
                // More tasks than threads: every thread of the pool ends up in sleep.
                for index in 0..<\(threads * 2) {
                    Task.detached {
                        logger.info("hog task \\(index) blocks its thread")
                        sleep(100_000)
                    }
                }
            }
            """)
        let h = try Harness([], files: [plugin], arguments: ["--shutdown-budget", "2"])
        #expect(await h.waitFor("loaded plugin Hog"), "\(h.daemon.text)")
        // Every thread of the pool is in sleep once as many tasks as threads have said so.
        var blocked = false
        for _ in 0..<1200 where !blocked {
            blocked = h.daemon.text.components(separatedBy: "blocks its thread").count > threads
            if !blocked { try await Task.sleep(for: .milliseconds(50)) }
        }
        #expect(blocked, "\(h.daemon.text)")
        let raw = try RawConnection(h.socket)
        let clock = ContinuousClock()
        let asked = clock.now
        raw.send("{\"v\":1,\"id\":1,\"cmd\":\"ping\"}\n")
        let (lines, _) = raw.readLines(1)
        #expect(lines.first?.contains("\"pong\":true") == true, "\(lines)")
        #expect(clock.now - asked < .seconds(1), "ping took \(clock.now - asked)")

        let signalled = clock.now
        h.daemon.send(SIGTERM)
        if signalTwice {
            try await Task.sleep(for: .milliseconds(200))
            h.daemon.send(SIGTERM)
        }
        let exit = await h.daemon.wait(timeout: .seconds(60))
        let took = clock.now - signalled
        #expect(exit == 1, "exit \(exit): \(h.daemon.text.suffix(3000))")
        if signalTwice {
            #expect(took < .seconds(2), "took \(took)")
            #expect(h.daemon.text.contains("SIGTERM received again during shutdown, exiting now"), "\(h.daemon.text.suffix(2000))")
        } else {
            #expect(took >= .seconds(3) && took < .seconds(10), "took \(took)")
            #expect(h.daemon.text.contains("the shutdown budget of 2 s ran out and the shutdown could not go on"), "\(h.daemon.text.suffix(2000))")
            #expect(h.daemon.text.contains("module hog (not yet deinitialized)"), "\(h.daemon.text.suffix(2000))")
        }
    }

    /// An awaited `send` to a Swift module whose handler does not finish within the event
    /// deadline (it never returns, whatever the cancellation) replies `deadline_exceeded`,
    /// as docs/daemon.md says, and the module runs on (found from outside: it replied ok).
    @Test func anAwaitedSendPastTheDeadlineOfASwiftHandlerIsDeadlineExceeded() async throws {
        let plugin = try Self.swiftPlugin("Laggard", variant: "1", members: """
            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                host.logger(for: Self.name).info("laggard got \\(event.name)")
            }
            public func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
                guard event.name == "hang" else { return }
                // Never resumed: the handler outlives any deadline and ignores cancellation.
                await withCheckedContinuation { (_: CheckedContinuation<Void, Never>) in }
            }
            """)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "1"])
        #expect(await h.waitFor("started 1 module: laggard"), "\(h.daemon.text)")
        let quick = try h.ctl("send", "quick", "--to", "laggard", "--await")
        #expect(quick.status == 0, "\(quick)")
        let hang = try h.ctl("send", "hang", "--to", "laggard", "--await")
        #expect(hang.status == 1, "\(hang)")
        #expect(hang.standardError.contains("module laggard did not finish event hang within the event deadline of 1 s")
                && hang.standardError.contains("(deadline_exceeded)"), "\(hang.standardError)")
        #expect(try h.ctl("send", "after", "--to", "laggard").status == 0)
        #expect(await h.waitFor("laggard got after"), "\(h.daemon.text)")
        _ = await Self.terminate(h)
    }

    /// A Swift module whose synchronous handler does not return within the event deadline
    /// (it cannot be interrupted, and every module of its host waits for it) is shown as
    /// `stuck` in that event by `list`, within 100 ms, is logged by module and plugin,
    /// counted as a deadline overrun, not counted as running, and refused further events;
    /// once it returns it is `running` again and the log says after how long (found from
    /// outside: `list` showed it running, nothing was logged and the overrun count stayed 0).
    @Test func aSwiftHandlerPastTheEventDeadlineIsShownStuckLoggedAndCounted() async throws {
        let plugin = try Self.swiftPlugin("Sticky", variant: "1", members: """
            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                // Blocks its thread until the file named by the payload exists.
                guard event.name == "block", let release = event.payload["release"]?.stringValue else { return }
                host.logger(for: Self.name).info("sticky blocks")
                while access(release, F_OK) != 0 { usleep(10_000) }
                host.logger(for: Self.name).info("sticky returns")
            }
            """)
        let scratch = TemporaryDirectory("swift-stuck")
        let release = scratch.path + "/release"
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "0.5", "--shutdown-budget", "4"])
        #expect(await h.waitFor("started 1 module: sticky"), "\(h.daemon.text)")
        let sender = try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket, "send", "block", "--to", "sticky",
                                                                   "--payload", "{\"release\":\"\(release)\"}"])
        #expect(await h.waitFor("sticky blocks"), "\(h.daemon.text)")

        let stuck = try await Self.listUntil(h.socket) { rows in rows["sticky"]?["state"] as? String == "stuck" }
        #expect(stuck.met, "list never showed sticky as stuck: \(h.daemon.text)")
        #expect(stuck.fast, "list answers took \(stuck.times) while a Swift handler was stuck")
        let row = Self.rows(try Self.timedList(h.socket).reply)["sticky"]
        #expect(row?["stuckIn"] as? String == "block", "\(String(describing: row))")
        #expect((row?["stuckSeconds"] as? Double ?? -1) >= 0.5, "\(String(describing: row))")
        #expect(await h.waitFor("did not return from block within the event deadline"), "\(h.daemon.text)")
        let warning = h.daemon.text.split(separator: "\n").first { $0.contains("did not return from block") }.map(String.init) ?? ""
        #expect(warning.contains("sticky") && warning.contains("Sticky"), "the warning names neither the module nor its plugin: \(warning)")
        let status = try h.ctl("--json", "status")
        let counts = try #require(try JSONSerialization.jsonObject(with: Data(status.standardOutput.utf8)) as? [String: Any])
        #expect(counts["modulesRunning"] as? Int == 0, "\(status.standardOutput)")
        let metrics = try h.ctl("metrics")
        #expect(metrics.standardOutput.contains("modhost_module_deadline_overruns_total{module=\"sticky\",plugin=\"Sticky\"} 1"), "\(metrics.standardOutput)")
        let refused = try h.ctl("send", "again", "--to", "sticky")
        #expect(refused.status != 0 && refused.standardError.contains("stuck in block"), "\(refused.standardError)")

        // It returns: running again, and the log says after how long.
        _ = FileManager.default.createFile(atPath: release, contents: nil)
        let running = try await Self.listUntil(h.socket) { rows in rows["sticky"]?["state"] as? String == "running" }
        #expect(running.met, "\(h.daemon.text)")
        #expect(await h.waitFor("returned from block after"), "\(h.daemon.text)")
        // The send that blocked says so once the handler has returned.
        #expect(await sender.wait(timeout: .seconds(30)) == 1)
        #expect(sender.text.contains("module sticky did not finish event block within the event deadline of 0.5 s; a synchronous handler cannot be interrupted")
                && sender.text.contains("(deadline_exceeded)"), "\(sender.text)")
        #expect(try h.ctl("send", "after", "--to", "sticky").status == 0)
        let (exit, _) = await Self.terminate(h)
        #expect(exit == 0, "\(h.daemon.text)")
    }

    /// A `post` whose Swift listener's synchronous handler ran past the event deadline
    /// replies `deadline_exceeded` naming it, as docs/daemon.md says and as a `send` does
    /// (found from outside: the post replied that it reached the module).
    @Test func aPostWhoseSwiftListenerOverranSaysSo() async throws {
        let plugin = try Self.swiftPlugin("Drowsy", variant: "1", members: """
            public var notifications: Set<String> { ["slow", "quick"] }
            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                if case .notification(let name, _) = event, name == "slow" { usleep(1_500_000) }
            }
            """)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "0.5"])
        #expect(await h.waitFor("started 1 module: drowsy"), "\(h.daemon.text)")
        let slow = try h.ctl("post", "slow")
        #expect(slow.status != 0 && slow.standardError.contains("(deadline_exceeded)"), "\(slow.standardOutput)\(slow.standardError)")
        #expect(slow.standardError.contains("module drowsy did not finish notification slow within the event deadline of 0.5 s but has returned since"),
                "\(slow.standardError)")
        #expect(!slow.standardOutput.contains("drowsy") && slow.standardError.contains("no listener got it"), "\(slow.standardOutput)\(slow.standardError)")
        let quick = try h.ctl("post", "quick")
        #expect(quick.status == 0 && quick.standardOutput.contains("drowsy"), "\(quick.standardOutput)\(quick.standardError)")
        let (exit, _) = await Self.terminate(h)
        #expect(exit == 0, "\(h.daemon.text)")
    }

    /// A Swift module whose initializer (its `create`) blocks past the event deadline is
    /// listed as `stuck` in `create` and logged by module and plugin, while the daemon
    /// answers; once it returns, the module starts and runs (found from outside: it stayed
    /// `loading` for as long as it blocked, with nothing logged).
    @Test func aSwiftModuleBlockingInCreateIsShownStuckInCreate() async throws {
        let plugin = try Self.swiftPlugin("Slow", variant: "1", members: """
            public init?(host: isolated HostInstance, configuration: JSONValue) {
                // Blocks its thread until the file named by the configuration exists.
                guard let release = configuration["release"]?.stringValue else { return }
                host.logger(for: Self.name).info("slow blocks in create")
                while access(release, F_OK) != 0 { usleep(10_000) }
            }
            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                host.logger(for: Self.name).info("slow got \\(event.name)")
            }
            """)
        let scratch = TemporaryDirectory("swift-stuck-create")
        let release = scratch.path + "/release"
        let h = try Harness([], files: [plugin], arguments: ["--shutdown-budget", "4"], config: """
            {"eventDeadlineSeconds":0.5,"modules":{"slow":{"configuration":{"release":"\(release)"}}}}
            """)
        #expect(await h.waitFor("slow blocks in create"), "\(h.daemon.text)")
        let stuck = try await Self.listUntil(h.socket) { rows in
            rows["slow"]?["state"] as? String == "stuck" && rows["slow"]?["stuckIn"] as? String == "create"
        }
        #expect(stuck.met, "list never showed slow stuck in create: \(h.daemon.text)")
        #expect(stuck.fast, "list answers took \(stuck.times)")
        #expect(await h.waitFor("did not return from create within the event deadline"), "\(h.daemon.text)")
        let warning = h.daemon.text.split(separator: "\n").first { $0.contains("did not return from create") }.map(String.init) ?? ""
        #expect(warning.contains("module=slow") && warning.contains("plugin=Slow"), "\(warning)")

        _ = FileManager.default.createFile(atPath: release, contents: nil)
        let running = try await Self.listUntil(h.socket) { rows in rows["slow"]?["state"] as? String == "running" }
        #expect(running.met, "\(h.daemon.text)")
        #expect(await h.waitFor("slow got start"), "\(h.daemon.text)")

        // Enabled again after a disable, it is stuck in create too, not shown disabled.
        try FileManager.default.removeItem(atPath: release)
        #expect(try h.ctl("disable", "slow").status == 0)
        let enabling = try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket, "enable", "slow"])
        let again = try await Self.listUntil(h.socket) { rows in
            rows["slow"]?["state"] as? String == "stuck" && rows["slow"]?["stuckIn"] as? String == "create"
        }
        #expect(again.met, "list did not show slow stuck in create while enabled: \(h.daemon.text)")
        _ = FileManager.default.createFile(atPath: release, contents: nil)
        _ = await enabling.wait(timeout: .seconds(30))
        #expect(try await Self.listUntil(h.socket) { rows in rows["slow"]?["state"] as? String == "running" }.met)
        let (exit, _) = await Self.terminate(h)
        #expect(exit == 0, "\(h.daemon.text)")
    }

    /// A Swift module whose task posts notifications in a loop (never giving up its
    /// thread) costs the daemon neither its memory nor its control plane: `list` answers,
    /// and a SIGTERM stops the daemon cleanly (found from outside: on 2 CPUs `list` went
    /// unanswered and only the shutdown watchdog ended the daemon, 31 s after SIGTERM).
    @Test func aSwiftTaskFloodingNotificationsLeavesTheDaemonManageable() async throws {
        let plugin = try Self.swiftPlugin("Flood", variant: "1", members: """
            public var notifications: Set<String> { ["flood.tick"] }
            var heard = 0
            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                switch event {
                case .start:
                    Task.detached { [host] in
                        var index = 0
                        while true {
                            host.postFromAnywhere(notification: "flood.tick", payload: .number(Double(index)))
                            index &+= 1
                        }
                    }
                case .notification:
                    heard += 1
                    if heard == 100_000 { host.logger(for: Self.name).info("flood heard 100000") }
                default:
                    break
                }
            }
            """)
        let h = try Harness(["Counter"], files: [plugin], arguments: ["--shutdown-budget", "20"])
        #expect(await h.daemon.waitFor("flood heard 100000", timeout: .seconds(120)), "\(h.daemon.text.suffix(2000))")
        let list = try h.ctl("--timeout", "10", "list")
        #expect(list.status == 0 && list.standardOutput.contains("counter"), "\(list)")
        let (exit, took) = await Self.terminate(h)
        #expect(exit == 0 && took < .seconds(10), "exit \(exit) after \(took): \(h.daemon.text.suffix(2000))")
    }

    @Test func aCallThatNeverReturnsTimesOutWhileListKeepsAnswering() async throws {
        let scratch = TemporaryDirectory("stuck-call")
        let h = try Harness([], files: [try Self.plugin("Spin", modules: ["spin"], hangOn: [], in: scratch.path,
                                   exports: [("spin_forever", "i32(i32)"), ("twice", "i32(i32)")],
                                   functions: """
                                       __attribute__((visibility("default"))) int spin_forever(int x) { for (;;) sleep(1); return x; }
                                       __attribute__((visibility("default"))) int twice(int x) { return 2 * x; }
                                       """)],
                            arguments: ["--request-deadline", "1", "--shutdown-budget", "3"])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        #expect(try h.ctl("call", "Spin", "twice", "21").standardOutput.contains("42"))

        let caller = try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket, "call", "Spin", "spin_forever", "1"])
        let answered = try await Self.listUntil(h.socket) { _ in
            !caller.text.isEmpty
        }
        #expect(answered.met)
        #expect(answered.fast, "list answers took \(answered.times) during a call")
        #expect(await caller.wait(timeout: .seconds(30)) == 1)
        #expect(caller.text.contains("deadline_exceeded"), "\(caller.text)")
        // The plugin is busy until the call returns: no more calls are given to it.
        let again = try h.ctl("call", "Spin", "twice", "2")
        #expect(again.status != 0)
        #expect(again.standardError.contains("busy"), "\(again.standardError)")
        h.daemon.send(SIGTERM)
        #expect(await h.daemon.wait(timeout: .seconds(30)) == 1)
        #expect(h.daemon.text.contains("Spin"))
    }

    /// Outside attack: a call queued behind a slow one got `deadline_exceeded` without ever
    /// starting, and ran later anyway (its caller told it failed, its effect came after);
    /// and an overrun was logged neither when it happened nor when the call returned. A
    /// call whose turn does not come within the request deadline is now refused
    /// (`plugin_busy`) and never runs; one that started and overran is logged at both ends.
    /// In process and isolated alike (in its worker, the same happened: calls queued on
    /// the calls socket ran after their callers had given up).
    @Test(arguments: ["in-process", "process"])
    func aCallWhoseTurnDoesNotComeWithinTheDeadlineNeverRuns(isolation: String) async throws {
        let scratch = TemporaryDirectory("queued-call")
        let marks = scratch.file("marks")
        let h = try Harness([], files: [try Self.plugin("Queue", modules: ["queue"], hangOn: [], in: scratch.path,
                                   exports: [("nap", "i32(i32)"), ("mark", "i32(i32)")],
                                   functions: """
                                       static void note(const char *text) {
                                           FILE *file = fopen("\(marks)", "a");
                                           if (file) { fputs(text, file); fclose(file); }
                                       }
                                       __attribute__((visibility("default"))) int nap(int ms) { note("nap\\n"); usleep((useconds_t)ms * 1000); return ms; }
                                       __attribute__((visibility("default"))) int mark(int n) { char text[32]; snprintf(text, sizeof text, "mark %d\\n", n); note(text); return n; }
                                       """)],
                            arguments: ["--request-deadline", "2"], config: #"{"isolation":"\#(isolation)"}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        func noted() -> String { (try? String(contentsOfFile: marks, encoding: .utf8)) ?? "" }
        let slow = try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket, "call", "Queue", "nap", "4000"])
        #expect(await DaemonLifecycleTests().eventually { noted() == "nap\n" }, "\(noted())")
        // Queued behind nap, which runs past this call's deadline too.
        let queued = try h.ctl("call", "Queue", "mark", "1")
        #expect(queued.status != 0 && queued.standardError.contains("(plugin_busy)"), "\(queued.standardOutput)\(queued.standardError)")
        #expect(queued.standardError.contains("plugin Queue is busy (") && queued.standardError.contains("call mark did not start within the deadline of 2 s and will not run"),
                "\(queued.standardError)")
        #expect(await slow.wait(timeout: .seconds(30)) != 0 && slow.text.contains("deadline_exceeded"), "\(slow.text)")
        #expect(await h.waitFor("call Queue.nap did not return within the request deadline of 2 s"), "\(h.daemon.text)")
        // Once nap has returned (said in the log), calls run again; mark 1 never did.
        #expect(await h.waitFor("call Queue.nap returned after"), "\(h.daemon.text)")
        let after = try h.ctl("call", "Queue", "mark", "2")
        #expect(after.status == 0, "\(after.standardOutput)\(after.standardError)")
        #expect(noted() == "nap\nmark 2\n", "\(noted())")
        let metrics = try h.ctl("metrics").standardOutput
        #expect(metrics.contains("modhost_call_deadline_overruns_total{plugin=\"Queue\",function=\"nap\"} 1"), "\(metrics)")
        let (exit, _) = await Self.terminate(h)
        #expect(exit == 0, "\(h.daemon.text)")
    }

    @Test func lifecycleEventNamesAreRefusedBySend() async throws {
        let scratch = TemporaryDirectory("reserved")
        let h = try Harness([], files: [try Self.plugin("Freer", modules: ["freer"], hangOn: [], in: scratch.path)])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        for name in ["init", "start", "deinit", "willTerminate", "willUnload", "configurationChanged"] {
            for target in [["--to", "freer"], []] {
                let result = try run(BuildProducts.modhostctl, ["--socket", h.socket, "send", name] + target)
                #expect(result.status != 0, "send \(name) was accepted")
                #expect(result.standardError.contains("reserved_event") || result.standardError.contains("reserved"),
                        "\(result.standardError)")
                #expect(result.standardError.contains(name))
            }
        }
        // Nor one hidden behind a NUL or a control character, which C would read as "deinit".
        for name in [#"deinit\u0000x"#, #"deinit\u0000"#, #"deinit\nx"#] {
            let connection = try RawConnection(h.socket)
            connection.send(#"{"v":1,"id":1,"cmd":"send","event":"\#(name)","to":"freer","await":true}"# + "\n")
            let reply = connection.readLines(1, timeout: .seconds(10)).lines.first ?? ""
            #expect(reply.contains(#""code":"invalid_request""#) && reply.contains("not a name"), "\(reply)")
        }
        // The module never saw a spoofed lifecycle event and still has its state.
        #expect(try h.ctl("send", "hello", "--to", "freer").status == 0)
        #expect(await h.waitFor("event hello (alive)"))
        #expect(!h.daemon.text.contains("event deinit"))
        #expect(await h.stop() == 0)
        #expect(h.daemon.text.contains("event deinit (alive)"))
    }

    @Test func disableRepliesWithinTheRequestDeadlineWhileAModuleHoldsItsUnload() async throws {
        let scratch = TemporaryDirectory("stuck-disable")
        let plugin = try Self.plugin("Leaver", modules: ["leaver"], hangOn: ["willUnload"], in: scratch.path)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "5", "--request-deadline", "1", "--shutdown-budget", "2"])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let clock = ContinuousClock()
        let started = clock.now
        let disable = try h.ctl("disable", "leaver")
        #expect(clock.now - started < .seconds(4), "disable took \(clock.now - started)")
        #expect(disable.status == 1)
        #expect(disable.standardError.contains("deadline_exceeded"), "\(disable.standardError)")
        let answered = try await Self.listUntil(h.socket) { rows in
            rows["leaver"]?["state"] as? String == "disabled"
        }
        #expect(answered.met)
        #expect(answered.fast, "list answers took \(answered.times) during an update")
        // Enabled again: a new instance, not stuck because its predecessor still is.
        #expect(try h.ctl("enable", "leaver").status == 0)
        #expect(Self.rows(try Self.timedList(h.socket).reply)["leaver"]?["state"] as? String == "running")
        let hello = try h.ctl("send", "hello", "--to", "leaver")
        #expect(hello.status == 0, "\(hello.standardError)")
        #expect(await h.waitFor("event hello (alive)"))
        h.daemon.send(SIGTERM)
        #expect(await h.daemon.wait(timeout: .seconds(30)) == 1)
        #expect(h.daemon.text.contains("module leaver (in willUnload"), "\(h.daemon.text)")
    }

    @Test func manyModulesHangingInWillTerminateFitTheShutdownBudget() async throws {
        let scratch = TemporaryDirectory("stuck-shutdown")
        let names = ["slow1", "slow2", "slow3", "slow4"]
        let plugin = try Self.plugin("Slow", modules: names, hangOn: ["willTerminate"], in: scratch.path)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "2", "--shutdown-budget", "3"])
        #expect(await h.waitFor("started 4 modules"), "\(h.daemon.text)")
        let (exit, took) = await Self.terminate(h)
        #expect(took < .seconds(8), "shutdown took \(took) with a budget of 3 s")
        #expect(exit == 1)
        let line = h.daemon.text.split(separator: "\n").first { $0.contains("shutdown budget of 3 s ran out") } ?? ""
        for name in names { #expect(line.contains("module \(name) "), "\(line)") }
    }

    /// A Swift module whose `deinit` handler never returns holds the shutdown until the
    /// budget runs out; the daemon then exits 1 naming the module and the callback it is
    /// in, not merely as "not yet deinitialized".
    @Test func aSwiftModuleStuckInDeinitIsNamedWhenTheShutdownBudgetRunsOut() async throws {
        let plugin = try Self.swiftPlugin("Clingy", variant: "1", members: """
            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                guard case .deinitialize = event else { return }
                host.logger(for: Self.name).info("clingy blocks in deinit")
                while true { sleep(1) }
            }
            """)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "0.5", "--shutdown-budget", "3"])
        #expect(await h.waitFor("started 1 module: clingy"), "\(h.daemon.text)")
        let (exit, took) = await Self.terminate(h)
        #expect(exit == 1, "\(h.daemon.text)")
        #expect(took < .seconds(10), "shutdown took \(took) with a budget of 3 s")
        #expect(h.daemon.text.contains("clingy blocks in deinit"), "\(h.daemon.text)")
        let line = h.daemon.text.split(separator: "\n").first { $0.contains("shutdown budget of 3 s ran out") }.map(String.init) ?? ""
        #expect(line.contains("module clingy (in deinit for "), "\(line)")
    }

    /// A Swift module whose deinit overruns the event deadline but returns well within the
    /// shutdown budget does not make the shutdown fail: exit 0, "stopped", and no line
    /// saying the budget ran out (found from outside: the daemon exited 1 as soon as the
    /// handler returned, saying the budget of 3 s ran out and naming it).
    @Test func aSwiftDeinitPastTheEventDeadlineButWithinTheBudgetStopsCleanly() async throws {
        let plugin = try Self.swiftPlugin("Tardy", variant: "1", members: """
            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                guard case .deinitialize = event else { return }
                usleep(900_000)
                host.logger(for: Self.name).info("tardy leaves deinit")
            }
            """)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "0.5", "--shutdown-budget", "3"])
        #expect(await h.waitFor("started 1 module: tardy"), "\(h.daemon.text)")
        let (exit, _) = await Self.terminate(h)
        #expect(exit == 0, "\(h.daemon.text)")
        #expect(h.daemon.text.contains("did not return from deinit within the event deadline"), "\(h.daemon.text)")
        #expect(h.daemon.text.contains("tardy leaves deinit") && h.daemon.text.contains("stopped"), "\(h.daemon.text)")
        #expect(!h.daemon.text.contains("ran out"), "\(h.daemon.text)")
    }

    /// An isolated module that does not return from deinit gets its worker killed at the
    /// event deadline; during shutdown no new worker follows it, even while the daemon still
    /// waits for another module (in process, stuck in deinit too).
    @Test func aWorkerKilledDuringShutdownIsNotRestarted() async throws {
        let scratch = TemporaryDirectory("stuck-isolated-shutdown")
        let isolated = try Self.plugin("Lingers", modules: ["lingers"], hangOn: ["deinit"], in: scratch.path)
        let inProcess = try Self.plugin("Later", modules: ["later"], hangOn: ["deinit"], in: scratch.path)
        let h = try Harness([], files: [isolated, inProcess], arguments: ["--event-deadline", "1", "--shutdown-budget", "3"],
                            config: #"{"plugins": {"Lingers": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("started 2 modules: later, lingers"), "\(h.daemon.text)")
        // Later is still in deinit when the budget runs out.
        let (exit, _) = await Self.terminate(h)
        #expect(exit == 1, "\(h.daemon.text)")
        let log = h.daemon.text
        #expect(log.contains("killed because its code did not return from deinit within 1 s; it is not restarted: the daemon is shutting down"), "\(log)")
        #expect(!log.contains("restarted plugin Lingers's worker"), "\(log)")
        #expect(!log.contains("modhost-worker: refused"), "\(log)")
    }

    @Test func aSecondSignalDuringAStuckShutdownEndsTheDaemonAtOnce() async throws {
        let scratch = TemporaryDirectory("second-signal")
        let plugin = try Self.plugin("Lingers", modules: ["lingers"], hangOn: ["willTerminate"], in: scratch.path)
        let h = try Harness([], files: [plugin], arguments: ["--event-deadline", "60", "--shutdown-budget", "80"])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        h.daemon.send(SIGTERM)
        #expect(await h.waitFor("event willTerminate"))
        let clock = ContinuousClock()
        let started = clock.now
        h.daemon.send(SIGINT)
        let exit = await h.daemon.wait(timeout: .seconds(40))
        #expect(clock.now - started < .seconds(10))
        #expect(exit == 1, "exit status \(exit)")
        #expect(h.daemon.text.contains("received again during shutdown"))
    }

    /// Two plugins, one of whose modules ("early") never returns from init; the other
    /// ("later") is fine. The daemon is still starting when the signal comes.
    static func startupHanging(_ label: String, _ arguments: [String]) async throws -> Harness {
        let scratch = TemporaryDirectory(label)
        let hanging = try Self.plugin("Early", modules: ["early"], hangOn: ["init"], in: scratch.path)
        let fine = try Self.plugin("Later", modules: ["later"], hangOn: [], in: scratch.path)
        let h = try Harness([], files: [hanging, fine], arguments: arguments)
        #expect(await h.waitFor("event init"), "\(h.daemon.text)")
        return h
    }

    @Test func sigtermDuringAStuckStartupEndsWithinTheShutdownBudget() async throws {
        // "early" (loaded first: plugins without dependencies load by name) hangs in init
        // forever; startup waits the event deadline (1 s) for it, then would go on loading
        // "later", all within the budget of 3 s, were the signal not to stop it.
        let h = try await Self.startupHanging("stuck-startup", ["--event-deadline", "1", "--shutdown-budget", "3"])
        let initsBefore = h.daemon.text.components(separatedBy: "event init").count
        let (exit, took) = await Self.terminate(h)
        #expect(took < .seconds(9), "a SIGTERM during startup took \(took) with a budget of 3 s")
        #expect(exit == 1, "exit status \(exit)")
        let text = h.daemon.text
        #expect(text.contains("SIGTERM received"), "\(text)")
        #expect(!text.contains("control socket ready"), "\(text)")
        let line = text.split(separator: "\n").first { $0.contains("shutdown budget of 3 s ran out") } ?? ""
        #expect(line.contains("early"), "\(text)")
        // Nothing more is loaded or initialized once the signal is seen.
        #expect(text.components(separatedBy: "event init").count == initsBefore, "\(text)")
        #expect(!text.contains("event start"), "\(text)")
    }

    @Test func aSecondSignalDuringAStuckStartupEndsTheDaemonAtOnce() async throws {
        let h = try await Self.startupHanging("second-signal-startup", ["--event-deadline", "60", "--shutdown-budget", "80"])
        h.daemon.send(SIGTERM)
        #expect(await h.waitFor("SIGTERM received"), "\(h.daemon.text)")
        let clock = ContinuousClock()
        let started = clock.now
        h.daemon.send(SIGINT)
        let exit = await h.daemon.wait(timeout: .seconds(40))
        #expect(clock.now - started < .seconds(8), "\(h.daemon.text)")
        #expect(exit == 1, "exit status \(exit)")
        #expect(h.daemon.text.contains("received again during shutdown"), "\(h.daemon.text)")
    }

    /// A module whose create hangs (for longer than the budget, within the event deadline)
    /// when the SIGTERM comes during startup: the budget message names it, the daemon exits
    /// 1, and the next start does not take the hang for a crash (nothing is quarantined).
    @Test(arguments: ["in-process", "process"])
    func aShutdownDuringAHangingCreateNamesItAndIsNotACrash(isolation: String) async throws {
        let scratch = TemporaryDirectory("hanging-create")
        let plugin = try Self.plugin("Evil", modules: ["evil"], hangOn: [], in: scratch.path)
        let plugins = scratch.directory("plugins")
        try scratch.copy(plugin, as: "plugins/libEvil.so")
        func start(_ configuration: String) throws -> RunningProcess {
            try scratch.write("modhostd.json", text: configuration)
            return try RunningProcess(BuildProducts.modhostd, ["--plugins", plugins, "--state-dir", scratch.file("state"),
                                                               "--socket", scratch.file("sock"), "--config", scratch.file("modhostd.json")])
        }
        // An event deadline far past the budget: on a loaded machine the SIGTERM may come
        // seconds after create began, and the budget must still run out before create's
        // deadline does (a clean-clone run saw create given up on at 4.8 s, then exit 0).
        let first = try start("""
            {"eventDeadlineSeconds":30,"shutdownBudgetSeconds":3,"isolation":"\(isolation)","modules":{"evil":{"configuration":{"hangcreate":1}}}}
            """)
        #expect(await first.waitFor("loading plugins", timeout: .seconds(60)), "\(first.text)")
        try await Task.sleep(for: .milliseconds(700))
        first.send(SIGTERM)
        let exit = await first.wait(timeout: .seconds(60))
        #expect(exit == 1, "exit status \(exit): \(first.text)")
        let line = first.text.split(separator: "\n").first { $0.contains("shutdown budget of 3 s ran out") } ?? ""
        #expect(line.contains("Evil (in init for "), "\(first.text)")
        #expect(!first.text.contains("modhostd: stopped"), "\(first.text)")
        // The next start runs the plugin: a shutdown is not a crash.
        let second = try start("{\"isolation\":\"\(isolation)\"}")
        #expect(await second.waitFor("started 1 module: evil", timeout: .seconds(60)), "\(second.text)")
        #expect(!second.text.contains("crashed"), "\(second.text)")
        second.send(SIGTERM)
        #expect(await second.wait(timeout: .seconds(60)) == 0)
        // An isolated plugin's create and init run in its worker: even a daemon killed during
        // them (SIGKILL) does not blame it (an in-process one is blamed, as documented).
        guard isolation == "process" else { return }
        let third = try start("""
            {"eventDeadlineSeconds":5,"isolation":"process","modules":{"evil":{"configuration":{"hangcreate":1}}}}
            """)
        #expect(await third.waitFor("loading plugins", timeout: .seconds(60)), "\(third.text)")
        try await Task.sleep(for: .milliseconds(700))
        third.send(SIGKILL)
        _ = await third.wait(timeout: .seconds(60))
        let fourth = try start("{\"isolation\":\"process\"}")
        #expect(await fourth.waitFor("started 1 module: evil", timeout: .seconds(60)), "\(fourth.text)")
        #expect(!fourth.text.contains("crashed"), "\(fourth.text)")
        fourth.send(SIGTERM)
        #expect(await fourth.wait(timeout: .seconds(60)) == 0)
    }
}
