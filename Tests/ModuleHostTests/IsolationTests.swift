import ControlProtocol
import DaemonShell
import Foundation
import Glibc
import ModuleHost
import ModuleKit
import PluginCall
import PluginFormat
import Synchronization
import Testing
import TestSupport

/// Isolated plugins (docs/isolation.md) driven through a PluginSet in this test process:
/// real C plugins that crash, exit, block, fork and eat memory in their worker, while the
/// set, its host and the other modules carry on. Plus "one suite, two modes": the same
/// plugin file behaves the same in process and isolated.
@Suite(.serialized)
struct IsolationTests {
    static var worker: String { BuildProducts.directory + "/bin/modhost-worker" }

    /// A C plugin `name` with one module (`name` in lower case) that appends
    /// `MODULE EVENT PAYLOAD` to `events` for every event, and misbehaves on the events
    /// named after faults: segv, thread (a thread it starts segfaults), exit0, block,
    /// hog (allocates until it fails, then aborts), forkbomb (forks 20 children that sleep,
    /// then blocks). It exports `faulty_add(a, b)` (i32(i32,i32)), which segfaults when a is
    /// 13, and posts notification `pong` when it gets notification `ping`. With `crashInCreate`,
    /// its create segfaults.
    static func faultyPlugin(_ name: String, in directory: String, events: String, crashInCreate: Bool = false) throws -> String {
        let module = name.lowercased()
        let source = """
            #define _GNU_SOURCE
            #include <modulehost.h>
            #include <fcntl.h>
            #include <pthread.h>
            #include <stdint.h>
            #include <stdio.h>
            #include <stdlib.h>
            #include <string.h>
            #include <unistd.h>
            static void note(const char *event, const char *payload) {
                char line[512];
                int n = snprintf(line, sizeof line, "\(module) %s %s\\n", event, payload ? payload : "-");
                int fd = open("\(events)", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
                if (fd >= 0) { if (write(fd, line, (size_t)n) < 0) {} close(fd); }
            }
            static void crash(void) { volatile int *nowhere = NULL; *nowhere = 1; }
            static void *crash_later(void *unused) { (void)unused; crash(); return NULL; }
            static void *create(const modhost_host_api *host, const char *config) {
                \(crashInCreate ? "crash();" : "")
                note("create", config);
                return (void *)host;
            }
            static void handle(void *instance, const char *event, const char *payload) {
                const modhost_host_api *host = instance;
                note(event, payload);
                if (strcmp(event, "segv") == 0) crash();
                if (strcmp(event, "thread") == 0) { pthread_t t; pthread_create(&t, NULL, crash_later, NULL); pthread_join(t, NULL); }
                if (strcmp(event, "exit0") == 0) exit(0);
                if (strcmp(event, "block") == 0) for (;;) pause();
                if (strcmp(event, "hog") == 0) {
                    for (;;) { char *p = malloc(64 << 20); if (!p) abort(); memset(p, 1, 64 << 20); }
                }
                if (strcmp(event, "forkbomb") == 0) {
                    for (int i = 0; i < 20; i++) if (fork() == 0) for (;;) pause();
                    for (;;) pause();
                }
                if (strcmp(event, "ping") == 0) host->post_notification("pong", payload);
                if (strcmp(event, "greet") == 0) host->log(MODHOST_LOG_INFO, "hello from the plugin");
            }
            static void destroy(void *instance) { (void)instance; note("destroy", NULL); }
            __attribute__((visibility("default"))) int32_t faulty_add(int32_t a, int32_t b) {
                if (a == 13) crash();
                return a + b;
            }
            static const char *const notes[] = {"ping", NULL};
            static const modhost_module modules[] = {{
                .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "\(module)", .version = "2.5",
                .notifications = notes, .create = create, .handle_event = handle, .destroy = destroy,
            }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(name)", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        return try PluginFactory(directory: directory).buildC(
            name, source: source, manifest: PluginFactory.manifest(plugin: name, modules: [module], exports: [("faulty_add", "i32(i32,i32)")]),
            flags: "-lpthread")
    }

    /// A plugin set over a plugin directory of its own, with `isolated` plugins in workers.
    final class Fixture: Sendable {
        let root = TemporaryDirectory("isolation")
        let plugins: String
        let events: String
        let host: HostInstance
        let set: PluginSet

        init(isolation: Isolation = .process, plugins settings: [String: PluginIsolationSettings] = [:],
             deadline: Duration = .seconds(2), window: Duration = .seconds(10)) throws {
            plugins = root.directory("plugins")
            let state = root.directory("state")
            let images = root.directory("state/images")
            chmod(state, 0o700)
            chmod(images, 0o700)
            events = root.file("events.log")
            host = HostInstance(name: "test", eventDeadline: deadline)
            set = PluginSet(host: host, directories: [plugins], imagesDirectory: images,
                            crashGuard: try CrashGuard(directory: state), trialLoader: nil,
                            isolation: IsolationPolicy(defaultIsolation: isolation, plugins: settings,
                                                       workerExecutable: IsolationTests.worker, window: window),
                            logger: Logger(label: "isolation-test"))
        }

        /// A fixture running the faulty plugin `name`, isolated, started.
        static func running(_ name: String, deadline: Duration = .seconds(2)) async throws -> Fixture {
            let f = try Fixture(deadline: deadline)
            try f.add(name)
            await f.set.reconcile()
            await f.set.start()
            return f
        }

        /// Builds the faulty plugin `name` into the plugin directory.
        func add(_ name: String, crashInCreate: Bool = false) throws {
            let build = root.directory("build-\(name)")
            let file = try IsolationTests.faultyPlugin(name, in: build, events: events, crashInCreate: crashInCreate)
            try FileManager.default.copyItem(atPath: file, toPath: plugins + "/lib\(name).so")
        }

        func lines() -> [String] {
            ((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }

        /// Waits (up to a minute) until `condition` holds.
        func until(_ condition: () async -> Bool) async -> Bool {
            for _ in 0..<1200 {
                if await condition() { return true }
                try? await Task.sleep(for: .milliseconds(50))
            }
            return false
        }

        /// Sends `event` to `module` until it has written it down (a module whose worker is
        /// restarting gets nothing meanwhile).
        func knock(_ module: String, _ event: String) async -> Bool {
            await until {
                let before = lines().filter { $0.hasPrefix("\(module) \(event) ") }.count
                await host.send(ModuleEvent.custom(name: event, payload: .null), to: module)
                return lines().filter { $0.hasPrefix("\(module) \(event) ") }.count > before
            }
        }

        func worker(_ plugin: String) async -> WorkerStatus? {
            await set.snapshot().plugins.first { $0.name == plugin }?.worker
        }

        /// Waits until `plugin`'s worker runs after its first restart.
        func runsAgain(_ plugin: String) async -> Bool {
            await until {
                let worker = await worker(plugin)
                return worker?.phase == .running && worker?.restarts == 1
            }
        }

        func call(_ plugin: String, _ a: Int32, _ b: Int32) async throws -> CallValue {
            guard let isolated = await set.plugin(named: plugin)?.isolated else { throw CallError.nullResult(function: "no worker") }
            return try await isolated.call("faulty_add", texts: ["\(a)", "\(b)"])
        }
    }

    /// Each fault, in a module's handler: the worker ends with the expected cause, its module
    /// is crashed and then runs again in a new worker (restarted at once), gets events and
    /// answers calls; the other plugin's module never stops getting events.
    @Test(arguments: [
        ("segv", "signal 11"), ("thread", "signal 11"), ("exit0", "exited with status 0"),
        ("block", "did not answer block"), ("hog", "signal 6"), ("forkbomb", "did not answer forkbomb"),
    ])
    func aFaultInAHandlerCostsOnlyItsWorker(fault: String, cause: String) async throws {
        // The hog reaches its 1 GiB limit within the deadline.
        let f = try Fixture(plugins: ["Faulty": PluginIsolationSettings(limits: WorkerLimits(addressSpaceBytes: 1 << 30))],
                            deadline: .seconds(fault == "hog" ? 10 : 1))
        try f.add("Faulty")
        try f.add("Calm")
        let changes = await f.set.reconcile()
        #expect(changes.added.sorted() == ["Calm", "Faulty"])
        await f.set.start()
        let first = try #require(await f.worker("Faulty")?.pid)
        #expect(await f.knock("calm", "before"))

        await f.host.send(ModuleEvent.custom(name: fault, payload: .null), to: "faulty")
        let restarted = await f.until {
            let worker = await f.worker("Faulty")
            return (worker?.restarts ?? 0) >= 1 && worker?.phase == .running
        }
        #expect(restarted)
        let status = try #require(await f.worker("Faulty"))
        #expect(status.lastCrash?.contains(cause) == true, "\(status)")
        #expect(status.crashes == 1)
        #expect(status.pid != first)
        // Nothing of the old worker's process group is left (the fork bomb's children).
        #expect(await f.until { Self.processes(inGroup: first).isEmpty }, "left: \(Self.processes(inGroup: first))")

        // The other module kept running; the restarted one gets events and calls again,
        // created, initialized and started anew.
        #expect(await f.knock("calm", "after"))
        #expect(await f.knock("faulty", "again"))
        #expect(f.lines().filter { $0.hasPrefix("faulty create") }.count == 2)
        #expect(f.lines().filter { $0 == "faulty start -" }.count == 2, "\(f.lines())")
        #expect(try await f.call("Faulty", 2, 3) == .int32(5))
        await f.set.shutdown()
        #expect(await f.until { Self.processes(inGroup: status.pid ?? 0).isEmpty })
    }

    @Test func aCrashInACallByNameFailsThatCallOnlyAndTheWorkerComesBack() async throws {
        let f = try await Fixture.running("Caller")
        #expect(try await f.call("Caller", 40, 2) == .int32(42))
        do {
            _ = try await f.call("Caller", 13, 1)
            Issue.record("a call that crashed its worker returned")
        } catch let error as IsolatedCallError {
            #expect(error.code == "call_failed")
            #expect(error.message.contains("Caller") && error.message.contains("faulty_add"), "\(error.message)")
        }
        #expect(await f.runsAgain("Caller"))
        #expect(await f.worker("Caller")?.lastCrash?.contains("signal 11") == true)
        #expect(try await f.call("Caller", 1, 2) == .int32(3))
        // The same argument errors as in process.
        let isolated = try #require(await f.set.plugin(named: "Caller")?.isolated)
        do {
            _ = try await isolated.call("faulty_add", texts: ["1"])
            Issue.record("a call with one argument of two returned")
        } catch {
            #expect(error.code == "invalid_arguments")
        }
        await f.set.shutdown()
    }

    /// A worker that answers nothing at all (stopped): a synchronous event to it returns
    /// once its deadline has passed, and the worker is killed, named as unanswering, and
    /// restarted; the module gets events again.
    @Test func aSynchronousEventToAWorkerThatNeverAnswersEndsAtItsDeadline() async throws {
        let f = try await Fixture.running("Frozen", deadline: .seconds(1))
        #expect(await f.knock("frozen", "before"))
        let pid = try #require(await f.worker("Frozen")?.pid)
        kill(pid, SIGSTOP)
        // Stopped once every thread is (a thread woken by a request before the stop reached
        // it would still answer).
        #expect(await f.until { Self.isStopped(pid) })
        let returned = await withDeadline(.seconds(60)) {
            await f.host.send(ModuleEvent.custom(name: "tick", payload: .null), to: "frozen")
            return true
        }
        #expect(returned == true, "a synchronous event to a stopped worker did not return")
        #expect(await f.runsAgain("Frozen"))
        let status = try #require(await f.worker("Frozen"))
        #expect(status.lastCrash?.contains("signal 9") == true && status.lastCrash?.contains("did not answer tick within 1 s") == true,
                "\(status)")
        #expect(await f.knock("frozen", "after"))
        await f.set.shutdown()
    }

    /// Calls by name run beside the ordered requests: a call answers while the module's
    /// handler blocks the worker's ordered requests.
    @Test func aCallAnswersWhileAHandlerBlocks() async throws {
        let f = try await Fixture.running("Busy", deadline: .seconds(5))
        let blocked = Task { await f.host.send(ModuleEvent.custom(name: "block", payload: .null), to: "busy") }
        #expect(await f.until { f.lines().contains("busy block -") })
        #expect(try await f.call("Busy", 2, 3) == .int32(5))
        // The blocked worker is killed at the end (its handler never returns).
        await f.set.shutdown()
        await blocked.value
    }

    /// A module whose create crashes its worker every time: five crashes within the window
    /// quarantine the plugin (no more restarts); enabling its module starts it again.
    @Test func aWorkerThatKeepsCrashingIsQuarantinedUntilEnabled() async throws {
        let f = try Fixture()
        try f.add("Doomed", crashInCreate: true)
        try f.add("Calm")
        await f.set.reconcile()
        await f.set.start()
        #expect(await f.until { await f.worker("Doomed")?.phase == .quarantined })
        let status = try #require(await f.worker("Doomed"))
        #expect(status.crashes == 5)
        #expect(status.restarts == 4)
        #expect(status.pid == nil)
        // The host still counts the module (it is crashed, not removed), and the rest runs.
        #expect(f.host.registeredModulesSnapshot.contains { $0.name == "doomed" })
        #expect(await f.knock("calm", "still"))
        try await f.set.setEnabled(true, module: "doomed")
        #expect(await f.until { (await f.worker("Doomed")?.crashes ?? 0) > 5 })
        await f.set.shutdown()
    }

    /// `modhostctl disable m; modhostctl enable m` on a module of an isolated plugin: the
    /// worker's module is deinitialized and destroyed, then created, initialized and started
    /// anew in the same worker, and gets events again; the other module of the set runs on.
    @Test func aDisabledModuleOfAnIsolatedPluginRunsAgainWhenEnabled() async throws {
        let f = try Fixture()
        try f.add("Toggled")
        try f.add("Calm")
        await f.set.reconcile()
        await f.set.start()
        let pid = try #require(await f.worker("Toggled")?.pid)
        #expect(await f.knock("toggled", "before"))
        try await f.set.setEnabled(false, module: "toggled")
        #expect(await f.until { f.lines().contains("toggled destroy -") }, "\(f.lines())")
        try await f.set.setEnabled(true, module: "toggled")
        #expect(await f.knock("toggled", "after"))
        #expect(await f.knock("calm", "after"))
        let toggled = f.lines().filter { $0.hasPrefix("toggled ") }.map { $0.split(separator: " ")[1] }
        #expect(toggled == ["create", "init", "start", "before", "willUnload", "deinit", "destroy", "create", "init", "start", "after"],
                "\(toggled)")
        let status = try #require(await f.worker("Toggled"))
        #expect(status.pid == pid && status.restarts == 0 && status.crashes == 0, "\(status)")
        await f.set.shutdown()
    }

    /// The configuration's isolation fields: read into the policy, and every wrong value
    /// refused with the field and the fix.
    @Test func theConfigurationChoosesIsolationPerPlugin() throws {
        let directory = TemporaryDirectory("isolation-config")
        let good = try directory.write("good.json", text: """
            {"isolation": "process", "plugins": {"Ledger": {"isolation": "in-process", "limits": {"addressSpaceBytes": 1073741824,
             "openFiles": 64, "cpuSeconds": 10, "processes": 32}, "user": "nobody", "group": "nogroup"}}}
            """)
        let configuration = try DaemonConfiguration.load(good)
        #expect(configuration.isolation == .process)
        #expect(configuration.plugins["Ledger"] == PluginIsolationSettings(
            isolation: .inProcess, limits: WorkerLimits(addressSpaceBytes: 1 << 30, openFiles: 64, cpuSeconds: 10, processes: 32),
            user: "nobody", group: "nogroup"))
        let bad: [(String, String)] = [
            (#"{"isolation": "container"}"#, #"field "isolation" is "container", not "in-process" or "process""#),
            (#"{"plugins": {"Ledger": {"isolation": 1}}}"#, #"field "plugins.Ledger.isolation" is 1"#),
            (#"{"plugins": {"Ledger": {"limits": {"memory": 5}}}}"#, #"field "plugins.Ledger.limits.memory" is unknown"#),
            (#"{"plugins": {"Ledger": {"limits": {"openFiles": -1}}}}"#, #"field "plugins.Ledger.limits.openFiles" is -1, not a whole number"#),
            (#"{"plugins": {"Ledger": {"limits": {"cpuSeconds": 1.5}}}}"#, #"field "plugins.Ledger.limits.cpuSeconds" is 1.5"#),
            (#"{"plugins": {"Ledger": {"sandbox": true}}}"#, #"field "plugins.Ledger.sandbox" is unknown"#),
            (#"{"plugins": {"../x": {}}}"#, #"field "plugins" names"#),
            (#"{"plugins": {"Ledger": {"user": ""}}}"#, #"field "plugins.Ledger.user" is not a user or group name"#),
        ]
        for (text, message) in bad {
            let path = try directory.write("bad.json", text: text)
            #expect {
                _ = try DaemonConfiguration.load(path)
            } throws: { error in
                (error as? DaemonError)?.message.contains(message) == true
            }
        }
    }

    /// Which plugins run isolated: the plugin's setting, else its manifest's preference,
    /// else the default.
    @Test func thePolicyPrefersThePluginSettingThenTheManifestThenTheDefault() throws {
        func manifest(_ isolation: String?) throws -> Manifest {
            let field = isolation.map { #","isolation":"\#($0)""# } ?? ""
            return try Manifest.parse(Array(#"{"name":"Ledger","version":"1","abi":"1.0","language":"c","modules":["ledger"]\#(field)}"#.utf8))
        }
        #expect(IsolationPolicy().isolation(of: try manifest(nil)) == .inProcess)
        #expect(IsolationPolicy().isolation(of: try manifest("process")) == .process)
        #expect(IsolationPolicy(defaultIsolation: .process).isolation(of: try manifest("in-process")) == .process)
        #expect(IsolationPolicy(plugins: ["Ledger": PluginIsolationSettings(isolation: .inProcess)]).isolation(of: try manifest("process")) == .inProcess)
        #expect(throws: ManifestError.self) { try manifest("vm") }
    }

    /// The worker refuses to run unless the daemon started it over a socketpair.
    @Test func theWorkerRefusesToBeStartedByHand() throws {
        let result = try run(Self.worker, [])
        #expect(result.status == 64)
        #expect(result.standardError.contains("never started by hand"), "\(result.standardError)")
    }

    /// One suite, two modes: the same file gives the same events, notifications, calls and
    /// errors in process and in a worker.
    @Test(arguments: [Isolation.inProcess, Isolation.process])
    func theSamePluginBehavesTheSameInProcessAndIsolated(isolation: Isolation) async throws {
        let f = try Fixture(isolation: isolation)
        // Plugin names differ per mode: this process binds an in-process plugin by SONAME.
        let name = isolation == .process ? "SameIsolated" : "SameInProcess"
        try f.add(name)
        let module = name.lowercased()
        await f.set.reconcile()
        await f.set.start()
        let pongs = Received()
        let listener = ModuleFactory(name: "listener-\(module)", version: "1") { _, _ in PongListener(pongs, name: "listener-\(module)") }
        await f.host.add([listener])
        await f.host.send(ModuleEvent.custom(name: "hello", payload: ["n": 1]), to: module)
        await f.host.send(AsyncModuleEvent.custom(name: "flush", payload: .null), to: module)
        await f.host.post(notification: "ping", payload: ["seq": 7])
        #expect(await f.until { pongs.values.withLock { $0 } == [["seq": 7]] }, "\(pongs.values.withLock { $0 })")
        let info = await f.host.infos().first { $0.name == module }
        #expect(info?.version == "2.5")
        let expected = ["create {}", "init -", "start -", "hello {\"n\":1}", "flush -", "ping {\"seq\":7}"].map { "\(module) \($0)" }
        #expect(await f.until { f.lines() == expected }, "\(f.lines())")

        let loaded = try #require(await f.set.plugin(named: name))
        func call(_ texts: [String]) async -> String {
            do {
                if let isolated = loaded.isolated { return "\(try await isolated.call("faulty_add", texts: texts))" }
                return "\(try loaded.functions!.call("faulty_add", texts: texts))"
            } catch let error as IsolatedCallError {
                return "\(error.code): \(error.message)"
            } catch let error as CallError {
                return "\(error.code): \(error)"
            } catch {
                return "\(error)"
            }
        }
        #expect(await call(["20", "22"]) == "i32:42")
        #expect(await call(["1"]) == "invalid_arguments: faulty_add: expected 2 arguments for i32(i32,i32), got 1")
        #expect(await call(["x", "1"]).hasPrefix("invalid_arguments: faulty_add: argument 1:"))
        let nope: String
        do {
            if let isolated = loaded.isolated {
                _ = try await isolated.call("nope", texts: [])
            } else {
                _ = try loaded.functions!.call("nope", texts: [])
            }
            nope = "returned"
        } catch let error as IsolatedCallError {
            nope = error.code
        } catch let error as CallError {
            nope = error.code
        }
        #expect(nope == "unknown_function")

        await f.set.shutdown()
        #expect(await f.until { f.lines().suffix(2) == ["\(module) deinit -", "\(module) destroy -"] }, "\(f.lines())")
    }

    /// True when every thread of process `pid` is stopped (state T), from /proc.
    static func isStopped(_ pid: Int32) -> Bool {
        guard let threads = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task"), !threads.isEmpty else { return false }
        return threads.allSatisfy { thread in
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/task/\(thread)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { return false }
            return stat[stat.index(after: close)...].split(separator: " ").first == "T"
        }
    }

    /// The pids of the processes in process group `group`, from /proc.
    static func processes(inGroup group: Int32) -> [Int32] {
        guard group > 0, let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return [] }
        return entries.compactMap(Int32.init).filter { pid in
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { return false }
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            // state ppid pgrp: a zombie still counts (it was not reaped).
            return fields.count > 2 && Int32(fields[2]) == group
        }
    }
}

/// What a `PongListener` received.
final class Received: Sendable {
    let values = Mutex<[JSONValue]>([])
}

/// Listens to `pong` and keeps its payloads.
private final class PongListener: Module {
    let received: Received
    let moduleName: String
    var info: ModuleInfo { ModuleInfo(name: moduleName, version: "1") }
    var notifications: Set<String> { ["pong"] }

    init(_ received: Received, name: String) {
        self.received = received
        moduleName = name
    }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        if case .notification("pong", let payload) = event { received.values.withLock { $0.append(payload) } }
    }
}

/// Isolated plugins in a real modhostd: configured with one line, listed with their worker,
/// crashing without taking the daemon or the other modules along, and never outliving the
/// daemon, even after `kill -9`.
@Suite(.serialized)
struct IsolatedDaemonTests {
    typealias Harness = DaemonLifecycleTests.Harness

    @Test func aCrashingIsolatedPluginIsRestartedWhileTheDaemonAnswers() async throws {
        let scratch = TemporaryDirectory("isolated-daemon")
        let events = scratch.file("events.log")
        let faulty = try IsolationTests.faultyPlugin("Faulty", in: scratch.directory("faulty"), events: events)
        let calm = try IsolationTests.faultyPlugin("Calm", in: scratch.directory("calm"), events: events)
        let h = try Harness([], files: [faulty, calm], arguments: ["--event-deadline", "1"],
                            config: #"{"plugins": {"Faulty": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let before = try h.modules()
        #expect(before["faulty"]?["isolation"] as? String == "process")
        #expect(before["calm"]?["isolation"] as? String == "in-process")
        #expect(before["calm"]?["workerPid"] == nil)
        let pid = try #require(before["faulty"]?["workerPid"] as? Int)
        #expect(before["faulty"]?["restarts"] as? Int == 0)
        #expect(try h.ctl("call", "Faulty", "faulty_add", "2", "3").standardOutput == "5\n")

        // A segfault in the isolated module's handler: logged with the plugin, pid and signal.
        _ = try h.ctl("send", "segv", "--to", "faulty")
        #expect(await h.waitFor("plugin Faulty's worker (pid \(pid)) was killed by signal 11 (Segmentation fault)"), "\(h.daemon.text)")
        let answers = try await StuckModuleTests.listUntil(h.socket) { rows in
            rows["faulty"]?["restarts"] as? Int == 1 && rows["faulty"]?["state"] as? String == "running"
        }
        #expect(answers.met, "the worker was not restarted: \(h.daemon.text)")
        #expect(answers.fast, "list answers took \(answers.times) while a worker restarted")
        let after = try h.modules()
        let restarted = try #require(after["faulty"]?["workerPid"] as? Int)
        #expect(restarted != pid)
        #expect((after["faulty"]?["lastError"] as? String)?.contains("signal 11") == true)
        // The in-process module never stopped; the isolated one works again.
        #expect(try h.ctl("send", "hello", "--to", "calm").status == 0)
        #expect(try h.ctl("send", "hello", "--to", "faulty").status == 0)
        let lines = ((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").split(separator: "\n")
        #expect(lines.contains("calm hello -") && lines.contains("faulty hello -"), "\(lines)")
        #expect(try h.ctl("call", "Faulty", "faulty_add", "20", "22").standardOutput == "42\n")
        // A crash in a call by name fails that call, with the cause.
        let crashed = try h.ctl("call", "Faulty", "faulty_add", "13", "0")
        #expect(crashed.status != 0)
        #expect(crashed.standardError.contains("call_failed"), "\(crashed.standardError)")

        // kill -9 of the daemon: no worker, and nothing in a worker's process group, is left.
        let current = try await Self.workerPid(h)
        h.daemon.send(SIGKILL)
        _ = await h.daemon.wait(timeout: .seconds(30))
        var left: [Int32] = []
        for _ in 0..<600 {
            left = IsolationTests.processes(inGroup: Int32(current))
            if left.isEmpty { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(left.isEmpty, "processes of the worker's group left after kill -9 of the daemon: \(left)")
    }

    /// The worker pid once a worker runs again.
    static func workerPid(_ h: Harness) async throws -> Int {
        for _ in 0..<600 {
            if let pid = try h.modules()["faulty"]?["workerPid"] as? Int { return pid }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw CallError.nullResult(function: "no worker pid")
    }
}
