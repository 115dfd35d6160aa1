import ControlProtocol
import DaemonShell
import Foundation
import Glibc
@testable import ModuleHost
import ModuleKit
import PluginCall
import PluginFormat
import Synchronization
import Testing
import TestSupport

/// Isolated plugins (docs/isolation.md) driven through a PluginSet in this test process:
/// real C and Swift plugins that crash, exit, block, fork and eat memory in their worker, while the
/// set, its host and the other modules carry on. Plus "one suite, two modes": the same
/// plugin file behaves the same in process and isolated.
@Suite(.timeLimit(.minutes(5)), .serialized)
struct IsolationTests {
    static var worker: String { BuildProducts.directory + "/bin/modhost-worker" }

    /// The language of a faulty plugin: the same faults, written in C or in Swift.
    enum Language: String, Sendable, CaseIterable {
        case c, swift
    }

    /// A C plugin `name` with one module (`name` in lower case) that appends
    /// `MODULE EVENT PAYLOAD` to `events` for every event, and misbehaves on the events
    /// named after faults: segv, thread (a thread it starts segfaults), exit0, block,
    /// hog (allocates until it fails, then aborts), forkbomb (forks 20 children that sleep,
    /// then blocks), fatal (aborts), spin (loops on the CPU); and two that probe limits and
    /// return: files (opens /dev/null until it fails, then notes `opened COUNT ERRNO`),
    /// forkmany (forks children that sleep until fork fails, then notes `forked COUNT
    /// ERRNO`), secret (opens the file EVENTS.secret and notes `read 1 OK` or `read 0
    /// ERRNO`); and halfframe, which writes the start of a frame on the worker's control
    /// socket and blocks. It exports `faulty_add(a, b)` (i32(i32,i32)), which segfaults when a is
    /// 13 and exits with status 3 when a is 14, and posts notification `pong` when it gets notification `ping`. With `crashInCreate`,
    /// its create segfaults; configured with `"slowDestroy": true`, its destroy takes 1.5 s.
    static func faultyPlugin(_ name: String, in directory: String, events: String, crashInCreate: Bool = false) throws -> String {
        let module = name.lowercased()
        let source = """
            #define _GNU_SOURCE
            #include <modulehost.h>
            #include <errno.h>
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
            static const char *errno_name(void) { return errno == EMFILE ? "EMFILE" : errno == EAGAIN ? "EAGAIN" : "other"; }
            static void *crash_later(void *unused) { (void)unused; crash(); return NULL; }
            static int slow_destroy;
            static void *create(const modhost_host_api *host, const char *config) {
                \(crashInCreate ? "crash();" : "")
                note("create", config);
                slow_destroy = config && strstr(config, "\\"slowDestroy\\":true") != NULL;
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
                if (strcmp(event, "fatal") == 0) abort();
                if (strcmp(event, "spin") == 0) for (volatile unsigned long i = 0;; i++) {}
                if (strcmp(event, "files") == 0) {
                    static int fds[4096];
                    int count = 0;
                    while (count < 4096 && (fds[count] = open("/dev/null", O_RDONLY)) >= 0) count++;
                    char text[64];
                    snprintf(text, sizeof text, "%d %s", count, errno_name());
                    for (int i = 0; i < count; i++) close(fds[i]);
                    note("opened", text);
                }
                if (strcmp(event, "secret") == 0) {
                    int fd = open("\(events).secret", O_RDONLY | O_CLOEXEC);
                    note("read", fd >= 0 ? "1 OK" : errno == EACCES ? "0 EACCES" : "0 other");
                    if (fd >= 0) close(fd);
                }
                if (strcmp(event, "forkmany") == 0) {
                    int count = 0;
                    pid_t child;
                    while (count < 100000 && (child = fork()) >= 0) {
                        if (child == 0) for (;;) pause();
                        count++;
                    }
                    char text[64];
                    snprintf(text, sizeof text, "%d %s", count, errno_name());
                    note("forked", text);
                }
                if (strcmp(event, "halfframe") == 0) {
                    static const char part[] = {0, 0, 0, 100, '{', '"'};
                    if (write(3, part, sizeof part) < 0) {}
                    for (;;) pause();
                }
                if (strcmp(event, "ping") == 0) host->post_notification("pong", payload);
                if (strcmp(event, "greet") == 0) host->log(MODHOST_LOG_INFO, "hello from the plugin");
            }
            static void destroy(void *instance) {
                (void)instance;
                if (slow_destroy) usleep(1500000);
                note("destroy", NULL);
            }
            __attribute__((visibility("default"))) int32_t faulty_add(int32_t a, int32_t b) {
                if (a == 13) crash();
                if (a == 14) _exit(3);
                return a + b;
            }
            __attribute__((visibility("default"))) void faulty_tick(void) {}
            __attribute__((visibility("default"))) double faulty_negative_zero(void) { return -0.0; }
            static const char *const notes[] = {"ping", NULL};
            static const modhost_module modules[] = {{
                .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "\(module)", .version = "2.5",
                .notifications = notes, .create = create, .handle_event = handle, .destroy = destroy,
            }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(name)", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        return try PluginFactory(directory: directory).buildC(
            name, source: source,
            manifest: PluginFactory.manifest(plugin: name, modules: [module],
                                             exports: [("faulty_add", "i32(i32,i32)"), ("faulty_tick", "void()"), ("faulty_negative_zero", "f64()")]),
            flags: "-lpthread")
    }

    /// The Swift twin of `faultyPlugin`: plugin `name` version `version`, one module (`name`
    /// in lower case) that notes every event and has the same faults (`fatal` is a
    /// fatalError) and probes, `faulty_add` exported with @_cdecl, and `crashInCreate`. It
    /// also counts `tick` events, notes `count N vVERSION` on `report`, and hands the count
    /// over on a replace (`relay` sends itself a `tick` with `host.send`; `lookup` looks up
    /// the module its payload's "name" names with `module(named:as:)` and notes `found NAME`
    /// or `lookup NAME: REASON`); its info's metadata is `{"ticks": COUNT}`, so its Info changes as
    /// it runs. On `shout` it posts notification `ping` with the event's payload (it listens
    /// to `ping` itself). It writes to the file its configuration's "events" names (the
    /// fixture gives it), so one build, with plugin.mk, serves the whole run.
    static func swiftFaultyPlugin(_ name: String, version: String = "2.5", crashInCreate: Bool = false) throws -> String {
        let module = name.lowercased()
        let source = """
            import Glibc
            import ModuleKit

            private func note(_ path: String, _ line: String) {
                let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
                guard fd >= 0 else { return }
                _ = line.withCString { write(fd, $0, strlen($0)) }
                close(fd)
            }
            private func crash() { UnsafeMutablePointer<Int32>(bitPattern: 8)!.pointee = 1 }
            private func errnoName() -> String { errno == EMFILE ? "EMFILE" : errno == EAGAIN ? "EAGAIN" : "errno \\(errno)" }

            public final class Faulty: PluginModule {
                public static let name = "\(module)"
                public static let version = "\(version)"
                public var notifications: Set<String> { ["ping"] }
                public var info: ModuleInfo { ModuleInfo(name: Self.name, version: Self.version, metadata: ["ticks": .number(Double(ticks))]) }
                let events: String
                var ticks = 0
                var bulky = false
                var held: [UnsafeMutableRawPointer] = []

                public init?(host: isolated HostInstance, configuration: JSONValue) {
                    \(crashInCreate ? "crash()" : "")
                    events = configuration["events"]?.stringValue ?? "/dev/null"
                    note(events, "\(module) create \\(configuration.jsonText)\\n")
                }
                deinit { note(events, "\(module) destroy -\\n") }

                public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                    var payload = "-"
                    if case .custom(_, let value) = event, value != .null { payload = value.jsonText }
                    if case .notification(_, let value) = event, value != .null { payload = value.jsonText }
                    note(events, "\(module) \\(event.name) \\(payload)\\n")
                    switch event.name {
                    case "segv": crash()
                    case "fatal": fatalError("the faulty module gave up")
                    case "thread":
                        var thread = pthread_t()
                        pthread_create(&thread, nil, { _ in crash(); return nil }, nil)
                        pthread_join(thread, nil)
                    case "exit0": exit(0)
                    case "block": while true { pause() }
                    case "hog":
                        while true {
                            guard let block = malloc(64 << 20) else { abort() }
                            memset(block, 1, 64 << 20)
                            held.append(block)  // kept, so the optimizer cannot drop the allocation
                        }
                    case "forkbomb":
                        for _ in 0..<20 where fork() == 0 { while true { pause() } }
                        while true { pause() }
                    case "spin":
                        var i = 0
                        while true { i &+= 1; if i == 0 { note(events, "") } }
                    case "files":
                        var fds: [Int32] = []
                        while fds.count < 4096, case let fd = open("/dev/null", O_RDONLY), fd >= 0 { fds.append(fd) }
                        let text = "\\(fds.count) \\(errnoName())"
                        for fd in fds { close(fd) }
                        note(events, "\(module) opened \\(text)\\n")
                    case "forkmany":
                        var count = 0
                        while count < 100_000 {
                            let child = fork()
                            if child < 0 { break }
                            if child == 0 { while true { pause() } }
                            count += 1
                        }
                        note(events, "\(module) forked \\(count) \\(errnoName())\\n")
                    case "tick": ticks += 1
                    case "bulk": bulky = true
                    case "relay": host.send(.custom(name: "tick", payload: .null), to: Self.name)
                    case "lookup":
                        guard case .custom(_, let value) = event, let name = value["name"]?.stringValue else { break }
                        do throws(ModuleLookupError) {
                            _ = try host.moduleManager.module(named: name, as: (any Module).self)
                            note(events, "\(module) found \\(name)\\n")
                        } catch {
                            note(events, "\(module) lookup \\(name): \\(error.reason.rawValue)\\n")
                        }
                    case "shout":
                        if case .custom(_, let value) = event { host.post(notification: "ping", payload: value) }
                    case "report": note(events, "\(module) count \\(ticks) v\\(Self.version)\\n")
                    default: break
                    }
                }

                public func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
                    if event.name == "slow" {
                        do {
                            try await Task.sleep(for: .seconds(30))
                            note(events, "\(module) slow finished\\n")
                        } catch {
                            note(events, "\(module) slow cancelled\\n")
                        }
                        return
                    }
                    note(events, "\(module) \\(event.name) -\\n")
                }

                public func stateForReplacement(host: isolated HostInstance) -> JSONValue? {
                    bulky ? ["ticks": .number(Double(ticks)), "bulk": .string(String(repeating: "x", count: 17 << 20))] : ["ticks": .number(Double(ticks))]
                }
                public func restore(state: JSONValue, host: isolated HostInstance) { ticks = Int(state["ticks"]?.numberValue ?? 0) }
            }

            @_cdecl("faulty_add")
            public func faultyAdd(_ a: Int32, _ b: Int32) -> Int32 {
                if a == 13 { crash() }
                if a == 14 { _exit(3) }
                return a &+ b
            }

            @_cdecl("modhost_plugin_entry_v1")
            public func modhostPluginEntry() -> UnsafeRawPointer? { PluginExport.plugin("\(name)", modules: [Faulty.self]) }
            """
        let manifest = """
            {"name": "\(name)", "version": "\(version)", "modules": ["\(module)"],
             "exports": [{"name": "faulty_add", "signature": "i32(i32,i32)"}]}
            """
        return try buildWithPluginMakefile(name, variant: "\(version)\(crashInCreate ? "-crash" : "")",
                                           files: ["\(name).swift": source, "plugin.json": manifest])
    }

    /// Builds plugin `name` from `files` with plugin.mk in a directory of build/ kept
    /// between runs (make rebuilds only what changed): the built file.
    static func buildWithPluginMakefile(_ name: String, variant: String, files: [String: String], make: String = "") throws -> String {
        let work = BuildProducts.directory + "/test-plugins/isolation/\(name)-\(variant)"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        var files = files
        // MODHOST_SDK given: plugin.mk's default, computed from the last makefile read, is
        // wrong once the dependency file of an earlier build is included.
        files["Makefile"] = "PLUGIN = \(name)\nMODHOST_SDK = \(BuildProducts.directory)\n\(make)include \(BuildProducts.pluginMakefile)\n"
        for (file, text) in files where (try? String(contentsOfFile: work + "/" + file, encoding: .utf8)) != text {
            try text.write(toFile: work + "/" + file, atomically: true, encoding: .utf8)
        }
        try shell("make -s", directory: work)
        return work + "/build/lib\(name).so"
    }

    /// A plugin set over a plugin directory of its own, with `isolated` plugins in workers.
    final class Fixture: Sendable {
        let root = TemporaryDirectory("isolation")
        let plugins: String
        let events: String
        let host: HostInstance
        let set: PluginSet

        init(isolation: Isolation = .process, plugins settings: [String: PluginIsolationSettings] = [:],
             deadline: Duration = .seconds(2), window: Duration = .seconds(10),
             hostName: String = "test", label: String = "modulehost") throws {
            plugins = root.directory("plugins")
            let state = root.directory("state")
            let images = root.directory("state/images")
            chmod(state, 0o700)
            chmod(images, 0o700)
            events = root.file("events.log")
            // Writable by a worker that runs as another user.
            _ = FileManager.default.createFile(atPath: events, contents: nil)
            chmod(events, 0o666)
            host = HostInstance(name: hostName, eventDeadline: deadline, logger: Logger(label: label))
            set = PluginSet(host: host, directories: [plugins], imagesDirectory: images,
                            crashGuard: try CrashGuard(directory: state), trialLoader: nil,
                            isolation: IsolationPolicy(defaultIsolation: isolation, plugins: settings,
                                                       workerExecutable: IsolationTests.worker, window: window),
                            logger: Logger(label: "isolation-test"))
        }

        /// A fixture running the faulty plugin `name`, isolated, started.
        static func running(_ name: String, deadline: Duration = .seconds(2)) async throws -> Fixture {
            let f = try Fixture(deadline: deadline)
            try await f.add(name)
            await f.set.reconcile()
            await f.set.start()
            return f
        }

        /// A fixture running, started, the Swift faulty plugin `swift` isolated, the faulty C
        /// plugin Other isolated (in another worker) and the faulty C plugin Near in process.
        static func acrossProcesses(swift: String) async throws -> Fixture {
            let f = try Fixture(plugins: ["Near": PluginIsolationSettings(isolation: .inProcess)])
            try await f.add(swift, language: .swift)
            try await f.add("Other")
            try await f.add("Near")
            await f.set.reconcile()
            await f.set.start()
            return f
        }

        /// Module settings given so far (a Swift faulty module's events file).
        private let settings = Mutex<[String: ModuleSettings]>([:])

        /// Builds the faulty plugin `name` in `language` into the plugin directory (in place
        /// of the file there: a new version to replace it).
        func add(_ name: String, language: Language = .c, version: String = "2.5", crashInCreate: Bool = false) async throws {
            let file: String
            switch language {
            case .c:
                file = try IsolationTests.faultyPlugin(name, in: root.directory("build-\(name)"), events: events, crashInCreate: crashInCreate)
            case .swift:
                file = try IsolationTests.swiftFaultyPlugin(name, version: version, crashInCreate: crashInCreate)
                let all = settings.withLock { settings in
                    settings[name.lowercased()] = ModuleSettings(configuration: ["events": .string(events)])
                    return settings
                }
                await set.updateSettings(all)
            }
            let target = plugins + "/lib\(name).so"
            try? FileManager.default.removeItem(atPath: target)
            try FileManager.default.copyItem(atPath: file, toPath: target)
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

        /// Sends the probe `event` (files, forkmany) to module faulty and returns what it noted
        /// (`faulty WHAT COUNT ERROR`), once it has (nil after a minute).
        func probe(_ event: String, notes what: String) async -> (count: Int, error: String)? {
            await host.send(ModuleEvent.custom(name: event, payload: .null), to: "faulty")
            let prefix = "faulty \(what) "
            guard await until({ lines().contains { $0.hasPrefix(prefix) } }),
                  let fields = lines().first(where: { $0.hasPrefix(prefix) })?.split(separator: " "), fields.count == 4
            else { return nil }
            return (Int(fields[2]) ?? -1, String(fields[3]))
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

        /// Waits until the worker of every plugin in `plugins` runs.
        func running(_ plugins: [String]) async -> Bool {
            await until {
                for plugin in plugins where await worker(plugin)?.phase != .running { return false }
                return true
            }
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

    /// A fault of a faulty plugin's handler and how its worker's end reads.
    struct Fault: Sendable, CustomTestStringConvertible {
        var language: Language
        var event: String
        var cause: String
        var testDescription: String { "\(event) in \(language.rawValue)" }
    }

    static let faults: [Fault] = Language.allCases.flatMap { language in
        [("segv", "signal 11"), ("thread", "signal 11"), ("exit0", "exited with status 0"),
         ("block", "did not answer block"), ("hog", "signal 6"), ("forkbomb", "did not answer forkbomb"),
         // abort() in C; a fatalError in Swift traps (ud2 on x86_64, brk on arm64).
         ("fatal", language == .c ? "signal 6" : "was killed by signal"),
         ("spin", "signal 24 (CPU time limit exceeded)")].map { Fault(language: language, event: $0.0, cause: $0.1) }
    }

    /// Each fault, in a module's handler, in C and in Swift: the worker ends with the
    /// expected cause (the memory hog over its address-space limit, the spinning handler
    /// over its CPU time), its module is crashed and then runs again in a new worker
    /// (restarted at once), gets events and answers calls; the other plugin's module never
    /// stops getting events.
    @Test(arguments: faults)
    func aFaultInAHandlerCostsOnlyItsWorker(fault: Fault) async throws {
        // The hog reaches its 1 GiB limit, and the spinner its 2 s of CPU, within the deadline.
        let limits = WorkerLimits(addressSpaceBytes: 1 << 30, cpuSeconds: fault.event == "spin" ? 2 : nil)
        let f = try Fixture(plugins: ["Faulty": PluginIsolationSettings(limits: limits)],
                            deadline: .seconds(["hog", "spin"].contains(fault.event) ? 30 : 1))
        try await f.add("Faulty", language: fault.language)
        try await f.add("Calm")
        let changes = await f.set.reconcile()
        #expect(changes.added.sorted() == ["Calm", "Faulty"])
        await f.set.start()
        let first = try #require(await f.worker("Faulty")?.pid)
        #expect(await f.knock("calm", "before"))

        await f.host.send(ModuleEvent.custom(name: fault.event, payload: .null), to: "faulty")
        let restarted = await f.until {
            let worker = await f.worker("Faulty")
            return (worker?.restarts ?? 0) >= 1 && worker?.phase == .running
        }
        #expect(restarted)
        let status = try #require(await f.worker("Faulty"))
        #expect(status.lastCrash?.contains(fault.cause) == true, "\(status)")
        #expect(status.crashes == 1)
        #expect(status.pid != first)
        // A handler that did not return by its deadline is counted as an overrun, as in process.
        let overruns = f.host.metrics.snapshot().modules.first { $0.module == "faulty" }?.deadlineOverruns
        #expect(overruns == (fault.cause.hasPrefix("did not answer") ? 1 : 0))
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

    @Test(arguments: Language.allCases)
    func aCrashInACallByNameFailsThatCallOnlyAndTheWorkerComesBack(language: Language) async throws {
        let f = try Fixture()
        try await f.add("Caller", language: language)
        await f.set.reconcile()
        await f.set.start()
        #expect(try await f.call("Caller", 40, 2) == .int32(42))
        do {
            _ = try await f.call("Caller", 13, 1)
            Issue.record("a call that crashed its worker returned")
        } catch let error as PluginSetError {
            #expect(error.code == .callFailed)
            #expect(error.message.contains("Caller") && error.message.contains("faulty_add"), "\(error.message)")
            // It names how this worker ended.
            #expect(error.message.contains("signal 11"), "\(error.message)")
        }
        #expect(await f.runsAgain("Caller"))
        #expect(await f.worker("Caller")?.lastCrash?.contains("signal 11") == true)
        #expect(try await f.call("Caller", 1, 2) == .int32(3))
        // The next worker's end is its own, not the one before it.
        do {
            _ = try await f.call("Caller", 14, 1)
            Issue.record("a call that ended its worker returned")
        } catch let error as PluginSetError {
            #expect(error.code == .callFailed)
            #expect(error.message.contains("status 3") && !error.message.contains("signal 11"), "\(error.message)")
        }
        #expect(await f.until {
            let worker = await f.worker("Caller")
            return worker?.restarts == 2 && worker?.phase == .running
        })
        #expect(try await f.call("Caller", 1, 2) == .int32(3))
        // The same argument errors as in process.
        let isolated = try #require(await f.set.plugin(named: "Caller")?.isolated)
        do {
            _ = try await isolated.call("faulty_add", texts: ["1"])
            Issue.record("a call with one argument of two returned")
        } catch {
            #expect(error.code == .invalidArguments)
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

    /// Calls by name from many tasks at once each get their own result (a caller that reads
    /// another call's reply hands it over); a call to a worker that answers nothing fails
    /// with deadline_exceeded at its deadline, and its late reply is taken for no other call.
    @Test func concurrentCallsGetTheirOwnResultsAndACallEndsAtItsDeadline() async throws {
        let f = try await Fixture.running("Many")
        let isolated = try #require(await f.set.plugin(named: "Many")?.isolated)
        let results = try await withThrowingTaskGroup(of: (Int32, CallValue).self) { group in
            for b in Int32(0)..<200 {
                group.addTask { (b, try await isolated.call("faulty_add", texts: ["1000", "\(b)"])) }
            }
            var results: [Int32: CallValue] = [:]
            for try await (b, value) in group { results[b] = value }
            return results
        }
        #expect(results.count == 200)
        #expect(results.filter { $0.value != .int32(1000 + $0.key) }.isEmpty)

        let pid = try #require(await f.worker("Many")?.pid)
        kill(pid, SIGSTOP)
        #expect(await f.until { Self.isStopped(pid) })
        do {
            _ = try await isolated.call("faulty_add", texts: ["1", "2"], deadline: .milliseconds(300))
            Issue.record("a call to a stopped worker returned")
        } catch {
            #expect(error.code == .deadlineExceeded, "\(error)")
        }
        kill(pid, SIGCONT)
        // Busy until the late reply has come (as in process), then called again.
        var answer: CallValue?
        for _ in 0..<300 where answer == nil {
            do {
                answer = try await isolated.call("faulty_add", texts: ["20", "22"])
            } catch {
                #expect(error.code == .pluginBusy, "\(error)")
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        #expect(answer == .int32(42))
        // It read the call it did not answer in time: not killed for it.
        #expect(await f.worker("Many")?.pid == pid)
        await f.set.shutdown()
    }

    /// A C module's destroy runs before its worker ends, even one that takes a while (within
    /// the event deadline), as in process: the worker answers the module's deinit once its
    /// destroy has returned, and only then may the daemon end the worker.
    @Test(arguments: [Isolation.inProcess, Isolation.process])
    func aSlowDestroyRunsBeforeTheWorkerEnds(isolation: Isolation) async throws {
        let f = try Fixture(isolation: isolation, deadline: .seconds(4))
        let name = isolation == .process ? "SlowIsolated" : "SlowInProcess"
        let module = name.lowercased()
        try await f.add(name)
        await f.set.updateSettings([module: ModuleSettings(configuration: ["slowDestroy": true])])
        await f.set.reconcile()
        await f.set.start()
        #expect(await f.until { f.lines().contains("\(module) start -") }, "\(f.lines())")
        await f.set.shutdown()
        #expect(await f.until { f.lines().last == "\(module) destroy -" }, "\(f.lines())")
    }

    /// A module whose create crashes its worker every time: five crashes within the window
    /// quarantine the plugin (no more restarts); enabling its module starts it again.
    @Test(arguments: Language.allCases)
    func aWorkerThatKeepsCrashingIsQuarantinedUntilEnabled(language: Language) async throws {
        let f = try Fixture()
        try await f.add("Doomed", language: language, crashInCreate: true)
        try await f.add("Calm")
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
        // A call says how it comes back: not by waiting.
        do {
            _ = try await f.call("Doomed", 1, 2)
            Issue.record("a call to a quarantined plugin returned")
        } catch let error as PluginSetError {
            #expect(error.message.contains("(quarantined)") && error.message.contains("modhostctl enable"), "\(error.message)")
        }
        try await f.set.setEnabled(true, module: "doomed")
        #expect(await f.until { (await f.worker("Doomed")?.crashes ?? 0) > 5 })
        await f.set.shutdown()
    }

    /// A handler that hangs on every event: each hang costs the sender a deadline, and five
    /// of them take longer than the crash window. The worker is killed at each deadline and
    /// restarted, and its fifth kill quarantines the plugin however long its deadline is
    /// against the window, so events sent to it stop being held up.
    @Test func aWorkerKilledForHangingOnEveryEventIsQuarantined() async throws {
        // Five hangs of 0.5 s take 2.5 s at least: never five within a window of 1 s.
        let f = try Fixture(deadline: .milliseconds(500), window: .seconds(1))
        try await f.add("Stuck")
        await f.set.reconcile()
        await f.set.start()
        #expect(await f.knock("stuck", "before"))
        var hangs = 0
        while hangs < 8 {
            await f.host.send(ModuleEvent.custom(name: "block", payload: .null), to: "stuck")
            hangs += 1
            // Killed for it (and reaped), then restarted, or quarantined.
            guard await f.until({ (await f.worker("Stuck")?.crashes ?? 0) >= hangs }),
                  await f.until({ [.running, .quarantined].contains(await f.worker("Stuck")?.phase) }),
                  await f.worker("Stuck")?.phase == .running
            else { break }
        }
        let status = try #require(await f.worker("Stuck"))
        #expect(status.phase == .quarantined, "\(status)")
        #expect(hangs == 5 && status.crashes == 5, "\(hangs) hangs, \(status)")
        #expect(status.lastCrash?.contains("did not answer block within 0.5 s") == true, "\(status)")
        // Quarantined, it holds up nothing: the event is not delivered and returns at once.
        let start = ContinuousClock.now
        await f.host.send(ModuleEvent.custom(name: "block", payload: .null), to: "stuck")
        #expect(ContinuousClock.now - start < .milliseconds(400))
        await f.set.shutdown()
    }

    /// `modhostctl disable m; modhostctl enable m` on a module of an isolated plugin: the
    /// worker's module is deinitialized and destroyed, then created, initialized and started
    /// anew in the same worker, and gets events again; the other module of the set runs on.
    @Test func aDisabledModuleOfAnIsolatedPluginRunsAgainWhenEnabled() async throws {
        let f = try Fixture()
        try await f.add("Toggled")
        try await f.add("Calm")
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

    /// The open-files limit holds in the worker, in C and in Swift: a module that opens
    /// files until it cannot stops short of the limit (EMFILE) and runs on in the same worker.
    @Test(arguments: Language.allCases)
    func theOpenFilesLimitBoundsTheWorker(language: Language) async throws {
        let f = try Fixture(plugins: ["Faulty": PluginIsolationSettings(limits: WorkerLimits(openFiles: 40))])
        try await f.add("Faulty", language: language)
        await f.set.reconcile()
        await f.set.start()
        let pid = try #require(await f.worker("Faulty")?.pid)
        let opened = try #require(await f.probe("files", notes: "opened"))
        #expect(opened.error == "EMFILE" && opened.count > 0 && opened.count < 40, "\(opened)")
        #expect(await f.knock("faulty", "after"))
        let status = try #require(await f.worker("Faulty"))
        #expect(status.pid == pid && status.crashes == 0, "\(status)")
        await f.set.shutdown()
    }

    /// A worker runs its plugin under a small address-space limit (256 MiB: the worker keeps
    /// one malloc arena, so its threads reserve no 64 MiB each), and every limit is applied
    /// as given, up to the largest the configuration takes (2^53).
    @Test(arguments: Language.allCases)
    func theLimitsAreAppliedAsGivenAndASmallAddressSpaceIsEnough(language: Language) async throws {
        let f = try Fixture(plugins: [
            "Small": PluginIsolationSettings(limits: WorkerLimits(addressSpaceBytes: 256 << 20, openFiles: 16)),
            "Large": PluginIsolationSettings(limits: WorkerLimits(addressSpaceBytes: 1 << 53, cpuSeconds: 1 << 53)),
        ])
        try await f.add("Small", language: language)
        try await f.add("Large")
        await f.set.reconcile()
        await f.set.start()
        #expect(await f.knock("small", "tick"))
        #expect(try await f.call("Small", 2, 3) == .int32(5))
        let small = try #require(await f.worker("Small")?.pid), large = try #require(await f.worker("Large")?.pid)
        func limit(_ pid: Int32, _ name: String) -> String? {
            let text = (try? String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8)) ?? ""
            return text.split(separator: "\n").first { $0.hasPrefix(name) }?.split(separator: " ", omittingEmptySubsequences: true)
                .dropFirst(name.split(separator: " ").count).first.map(String.init)
        }
        #expect(limit(small, "Max address space") == "268435456")
        #expect(limit(small, "Max open files") == "16")
        #expect(limit(large, "Max address space") == "9007199254740992")
        #expect(limit(large, "Max cpu time") == "9007199254740992")
        #expect(await f.worker("Small")?.crashes == 0)
        await f.set.shutdown()
    }

    /// A fork bomb is bounded by the `processes` limit, in C and in Swift: the worker runs as
    /// another user (RLIMIT_NPROC counts a user's processes and binds no root process), so a
    /// module that forks until it cannot stops short of the limit (EAGAIN); the other module
    /// runs on, the faulty one gets events again (in a new worker if the old one, left
    /// without threads, stopped answering), and nothing it forked outlives the worker.
    @Test(.enabled(if: geteuid() == 0, "RLIMIT_NPROC binds only a worker that runs as another user: starting one as nobody needs root"),
          arguments: Language.allCases)
    func aForkBombIsBoundedByTheProcessesLimit(language: Language) async throws {
        let limits = WorkerLimits(processes: 64)
        let f = try Fixture(plugins: ["Faulty": PluginIsolationSettings(limits: limits, user: "nobody", group: "nogroup")])
        try await f.add("Faulty", language: language)
        try await f.add("Calm")
        await f.set.reconcile()
        await f.set.start()
        let pid = try #require(await f.worker("Faulty")?.pid)
        let forked = try #require(await f.probe("forkmany", notes: "forked"))
        #expect(forked.error == "EAGAIN" && forked.count > 0 && forked.count < 64, "\(forked)")
        // The worker may now be unable to start a thread of its own (the limit counts threads
        // too): it then stops answering and is killed and restarted like any hang.
        #expect(await f.knock("calm", "after"))
        #expect(await f.knock("faulty", "after"))
        await f.set.shutdown()
        #expect(await f.until { Self.processes(inGroup: pid).isEmpty }, "left: \(Self.processes(inGroup: pid))")
    }

    /// Under root, a `processes` limit for a worker that would run as root (no `user`) would
    /// bind nothing: the plugin is refused with check isolation, and the fix names `user`.
    @Test(.enabled(if: geteuid() == 0, "only a daemon running as root starts a worker as root"))
    func aProcessesLimitOnAWorkerRunningAsRootIsRefused() async throws {
        let f = try Fixture(plugins: ["Faulty": PluginIsolationSettings(limits: WorkerLimits(processes: 64))])
        try await f.add("Faulty")
        try await f.add("Calm")
        let changes = await f.set.reconcile()
        #expect(changes.refused == [f.plugins + "/libFaulty.so"] && changes.added == ["Calm"], "\(changes)")
        let failure = try #require(await f.set.snapshot().files.first { $0.path.hasSuffix("/libFaulty.so") }?.failure)
        #expect(failure.check == .isolation)
        #expect(failure.problem.contains("processes") && failure.problem.contains("root"), "\(failure.problem)")
        #expect(failure.fix.contains("user"), "\(failure.fix)")
        await f.set.shutdown()
    }

    /// `user` and `group` when the daemon runs as root: the worker runs as them (its private
    /// copy of the plugin sits in the daemon's 0700 images directory, which they cannot
    /// enter), and the plugin runs, in C and in Swift: events, calls, a restart after a crash.
    @Test(.enabled(if: geteuid() == 0, "a worker takes another user only when the daemon runs as root"),
          arguments: Language.allCases)
    func aWorkerRunsAsTheConfiguredUserAndGroup(language: Language) async throws {
        let f = try Fixture(plugins: ["Faulty": PluginIsolationSettings(user: "nobody", group: "nogroup")])
        try await f.add("Faulty", language: language)
        await f.set.reconcile()
        await f.set.start()
        let pid = try #require(await f.worker("Faulty")?.pid)
        let identity = try Self.identity(of: pid)
        #expect(identity.uid == 65534 && identity.gid == 65534 && identity.groups == [65534], "\(identity)")
        #expect(await f.knock("faulty", "hello"))
        #expect(try await f.call("Faulty", 2, 3) == .int32(5))
        await f.host.send(ModuleEvent.custom(name: "segv", payload: .null), to: "faulty")
        #expect(await f.runsAgain("Faulty"))
        let restarted = try #require(await f.worker("Faulty")?.pid)
        #expect(try Self.identity(of: restarted).uid == 65534)
        #expect(await f.knock("faulty", "again"))
        await f.set.shutdown()
    }

    /// A numeric `user` alone takes that account's group and groups, as a login does, never
    /// the daemon's: a file only root's group may read is closed to the worker. A `group`
    /// without a `user`, which would leave the worker root, is refused.
    @Test(.enabled(if: geteuid() == 0, "a worker takes another user only when the daemon runs as root"))
    func aNumericUserTakesItsAccountsGroupsNotRoots() async throws {
        let f = try Fixture(plugins: ["Faulty": PluginIsolationSettings(user: "65534"), "Calm": PluginIsolationSettings(group: "nogroup")])
        try await f.add("Faulty")
        try await f.add("Calm")
        let secret = f.events + ".secret"
        #expect(FileManager.default.createFile(atPath: secret, contents: Data("root's group only\n".utf8)))
        #expect(chown(secret, 0, 0) == 0 && chmod(secret, 0o640) == 0)
        let changes = await f.set.reconcile()
        #expect(changes.added == ["Faulty"] && changes.refused == [f.plugins + "/libCalm.so"], "\(changes)")
        let failure = try #require(await f.set.snapshot().files.first { $0.path.hasSuffix("/libCalm.so") }?.failure)
        #expect(failure.check == .isolation && failure.problem.contains("without a user"), "\(failure.problem)")
        await f.set.start()
        let pid = try #require(await f.worker("Faulty")?.pid)
        let identity = try Self.identity(of: pid)
        #expect(identity.uid == 65534 && identity.gid == 65534 && identity.groups == [65534], "\(identity)")
        let read = try #require(await f.probe("secret", notes: "read"))
        #expect(read.count == 0 && read.error == "EACCES", "\(read)")
        await f.set.shutdown()
    }

    /// A worker works in the root directory, not in the daemon's: plugin code gets no
    /// relative path into wherever the daemon was started.
    @Test func aWorkerWorksInTheRootDirectory() async throws {
        let f = try await Fixture.running("Calm")
        let pid = try #require(await f.worker("Calm")?.pid)
        #expect(FileManager.default.currentDirectoryPath != "/")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd") == "/")
        await f.set.shutdown()
    }

    /// The real uid, gid and supplementary groups of process `pid` (/proc/PID/status).
    static func identity(of pid: Int32) throws -> (uid: Int, gid: Int, groups: [Int]) {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        func field(_ name: String) -> [Int] {
            let line = status.split(separator: "\n").first { $0.hasPrefix(name + ":") } ?? ""
            return line.dropFirst(name.count + 1).split(whereSeparator: { $0 == "\t" || $0 == " " }).compactMap { Int($0) }
        }
        return (field("Uid").first ?? -1, field("Gid").first ?? -1, field("Groups"))
    }

    /// Vowels, a Swift plugin that imports Greeting's module (the example), built with
    /// plugin.mk: its module counts vowels with Greeting's code, and it exports
    /// `vowels_times_ten`.
    static func vowelsPlugin() throws -> String {
        let source = """
            import Glibc
            import Greeting
            import ModuleKit

            public final class Vowels: PluginModule {
                public static let name = "vowels"
                let events: String
                public init?(host: isolated HostInstance, configuration: JSONValue) {
                    events = configuration["events"]?.stringValue ?? "/dev/null"
                }
                public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                    guard case .custom("count", let payload) = event, let text = payload["text"]?.stringValue else { return }
                    let line = "vowels \\(text) \\(text.withCString { greetingVowelCount($0) })\\n"
                    let fd = open(events, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
                    _ = line.withCString { write(fd, $0, strlen($0)) }
                    close(fd)
                }
            }

            @_cdecl("vowels_times_ten")
            public func vowelsTimesTen(_ text: UnsafePointer<CChar>?) -> Int32 { greetingVowelCount(text) &* 10 }

            @_cdecl("modhost_plugin_entry_v1")
            public func modhostPluginEntry() -> UnsafeRawPointer? { PluginExport.plugin("Vowels", modules: [Vowels.self]) }
            """
        let manifest = """
            {"name": "Vowels", "version": "1.0.0", "dependencies": ["Greeting"], "modules": ["vowels"],
             "exports": [{"name": "vowels_times_ten", "signature": "i32(str)"}]}
            """
        return try Self.buildWithPluginMakefile(
            "Vowels", variant: "1", files: ["Vowels.swift": source, "plugin.json": manifest],
            make: "MODULES_DIR = \(BuildProducts.directory)/plugin-modules\nLDLIBS = -L \(BuildProducts.pluginDirectory)\n")
    }

    /// A Swift plugin that imports another plugin's Swift module runs isolated: its worker
    /// maps the plugin it depends on (Greeting, the example) first, so the import resolves
    /// and Greeting's code runs in the worker, from an event and from a call by name.
    @Test func aSwiftPluginWithADependencyRunsIsolated() async throws {
        let f = try Fixture()
        let vowels = try Self.vowelsPlugin()
        try FileManager.default.copyItem(atPath: vowels, toPath: f.plugins + "/libVowels.so")
        try FileManager.default.copyItem(atPath: BuildProducts.plugin("Greeting"), toPath: f.plugins + "/libGreeting.so")
        await f.set.updateSettings(["vowels": ModuleSettings(configuration: ["events": .string(f.events)])])
        let changes = await f.set.reconcile()
        #expect(changes.added.sorted() == ["Greeting", "Vowels"], "\(changes)")
        await f.set.start()
        let worker = try #require(await f.worker("Vowels")?.pid)
        #expect(await f.worker("Greeting")?.pid != worker)
        await f.host.send(ModuleEvent.custom(name: "count", payload: ["text": "education"]), to: "vowels")
        #expect(await f.until { f.lines().contains("vowels education 5") }, "\(f.lines())")
        let isolated = try #require(await f.set.plugin(named: "Vowels")?.isolated)
        #expect(try await isolated.call("vowels_times_ten", texts: ["isolation"]) == .int32(50))
        #expect(await f.worker("Vowels")?.crashes == 0)

        // Replacing the dependency restarts the dependent against it, as often as wanted:
        // neither image is mapped in this process, so neither uses up a name (limit lowered to 2).
        await f.set.setNameGenerationLimit(2)
        let greeting = try PluginFactory.embeddedManifest(BuildProducts.plugin("Greeting"))
        let versions = PluginFactory(directory: f.root.directory("greeting-versions"))
        for cycle in 1...3 {
            let next = try versions.withManifest(BuildProducts.plugin("Greeting"),
                                                 greeting.replacing(#/"version"\s*:\s*"[0-9.]+"/#, with: #""version":"9.\#(cycle)""#),
                                                 as: "libGreeting-\(cycle).so")
            try FileManager.default.copyItem(atPath: next, toPath: f.plugins + "/.libGreeting.so.tmp")
            #expect(rename(f.plugins + "/.libGreeting.so.tmp", f.plugins + "/libGreeting.so") == 0)
            let replaced = await f.set.reconcile()
            #expect(replaced.replaced == ["Greeting"] && replaced.refused.isEmpty, "replace \(cycle): \(replaced)")
            #expect(await f.set.snapshot().plugins.first { $0.name == "Greeting" }?.version == "9.\(cycle)")
            #expect(await f.running(["Greeting", "Vowels"]))
            let now = try #require(await f.set.plugin(named: "Vowels")?.isolated)
            #expect(try await now.call("vowels_times_ten", texts: ["isolation"]) == .int32(50), "replace \(cycle)")
        }
        await f.set.shutdown()
    }

    /// A replace of an isolated plugin hands its module's state over: the new version's
    /// code runs in a new worker with the count the old one had, the old module got
    /// willUnload, and nothing of the old worker is left.
    @Test func anIsolatedReplaceHandsTheStateOverAndEndsTheOldWorker() async throws {
        let f = try Fixture()
        try await f.add("Tally", language: .swift, version: "1.0.0")
        await f.set.reconcile()
        await f.set.start()
        let old = try #require(await f.worker("Tally")?.pid)
        for _ in 0..<3 { await f.host.send(ModuleEvent.custom(name: "tick", payload: .null), to: "tally") }
        await f.host.send(ModuleEvent.custom(name: "report", payload: .null), to: "tally")
        #expect(await f.until { f.lines().contains("tally count 3 v1.0.0") }, "\(f.lines())")

        try await f.add("Tally", language: .swift, version: "2.0.0")
        let changes = await f.set.reconcile()
        #expect(changes.replaced == ["Tally"], "\(changes)")
        let plugin = try #require(await f.set.snapshot().plugins.first { $0.name == "Tally" })
        #expect(plugin.version == "2.0.0" && plugin.generation == 2, "\(plugin)")
        let new = try #require(plugin.worker?.pid)
        #expect(new != old)
        #expect(await f.until { Self.processes(inGroup: old).isEmpty }, "left: \(Self.processes(inGroup: old))")
        await f.host.send(ModuleEvent.custom(name: "tick", payload: .null), to: "tally")
        await f.host.send(ModuleEvent.custom(name: "report", payload: .null), to: "tally")
        #expect(await f.until { f.lines().contains("tally count 4 v2.0.0") }, "\(f.lines())")
        let tally = f.lines().filter { $0.hasPrefix("tally ") }.map { $0.split(separator: " ")[1] }
        #expect(tally.filter { $0 == "willUnload" }.count == 1 && tally.filter { $0 == "create" }.count == 2, "\(tally)")
        await f.set.shutdown()
    }

    /// A state for replacement larger than a worker may send (16 MiB) is not handed over:
    /// the new version starts without it, and the log says so, naming the module (it was
    /// lost without a word).
    @Test func anIsolatedStateTooLargeToHandOverIsSaidNotLost() async throws {
        let records = RecordingBackend(keeping: "isolation-test")
        LoggingSystem.bootstrap(records, level: .info)
        defer { LoggingSystem.bootstrap(StandardErrorBackend(), level: .info) }
        let f = try Fixture()
        try await f.add("Bulky", language: .swift, version: "1.0.0")
        await f.set.reconcile()
        await f.set.start()
        for name in ["tick", "tick", "bulk"] { await f.host.send(ModuleEvent.custom(name: name, payload: .null), to: "bulky") }
        try await f.add("Bulky", language: .swift, version: "2.0.0")
        let changes = await f.set.reconcile()
        #expect(changes.replaced == ["Bulky"], "\(changes)")
        await f.host.send(ModuleEvent.custom(name: "report", payload: .null), to: "bulky")
        #expect(await f.until { f.lines().contains("bulky count 0 v2.0.0") }, "\(f.lines())")
        let said = records.kept().first { $0.message.contains("state for replacement is not handed over") }
        #expect(said?.message.contains("module bulky") == true && said?.message.contains("16 MiB") == true,
                "\(records.kept().map(\.message))")
        await f.set.shutdown()
    }

    /// After `shutdown()`, `snapshot()` still lists every plugin (its image stays mapped),
    /// as PluginSet documents, and says what ended: an isolated plugin's worker is `stopped`
    /// with no pid, and no module runs (found from outside: read alone, the snapshot looked
    /// like a set still running).
    @Test func theSnapshotAfterShutdownSaysWhatEnded() async throws {
        let f = try Fixture(plugins: ["Near": PluginIsolationSettings(isolation: .inProcess)])
        try await f.add("Far")
        try await f.add("Near")
        await f.set.reconcile()
        await f.set.start()
        #expect(await f.worker("Far")?.phase == .running)
        await f.set.shutdown()
        let snapshot = await f.set.snapshot()
        #expect(snapshot.plugins.map(\.name) == ["Far", "Near"])
        let far = try #require(snapshot.plugins.first { $0.name == "Far" })
        #expect(far.worker?.phase == .stopped && far.worker?.pid == nil, "\(String(describing: far.worker))")
        #expect(f.host.runningModuleNames.isEmpty)
        #expect(f.set.isStopping)
    }

    /// The daemon watches its workers from one thread, however many run: it kept a reader
    /// and a reaper thread per worker, started and ended with each, and every thread that
    /// came and went left memory behind (its malloc arena, its cached stack, libdispatch's
    /// caches), which showed as daemon RSS and mappings per isolated replace.
    @Test func theDaemonKeepsNoThreadPerWorker() async throws {
        let f = try Fixture()
        try await f.add("Quiet0")
        await f.set.reconcile()
        await f.set.start()
        #expect(await f.running(["Quiet0"]))
        let more = 6
        let before = Self.count("Threads")
        for index in 1...more { try await f.add("Quiet\(index)") }
        #expect(await f.set.reconcile().added.count == more)
        #expect(await f.running((0...more).map { "Quiet\($0)" }))
        let after = Self.count("Threads")
        #expect(after - before < more, "\(more) more workers: threads \(before) -> \(after)")
        await f.set.shutdown()
    }

    /// A worker that stops in the middle of a frame holds up no other worker: the daemon
    /// reads every worker's control socket from one thread, and never waits there for the
    /// rest of a frame.
    @Test func aWorkerThatStopsInTheMiddleOfAFrameHoldsUpNoOther() async throws {
        // A far deadline: the stalled worker is not killed before the other answers.
        let f = try Fixture(deadline: .seconds(30))
        try await f.add("Faulty")
        try await f.add("Other")
        await f.set.reconcile()
        await f.set.start()
        #expect(await f.running(["Faulty", "Other"]))
        let stalled = try #require(await f.worker("Faulty")?.pid)
        Task { await f.host.send(ModuleEvent.custom(name: "halfframe", payload: .null), to: "faulty") }
        #expect(await f.until { f.lines().contains("faulty halfframe -") })
        let answer = Mutex<CallValue?>(nil)
        Task { if let value = try? await f.call("Other", 2, 3) { answer.withLock { $0 = value } } }
        #expect(await f.until { answer.withLock { $0 } == .int32(5) })
        // It answered while the stalled worker was still there, not after its end.
        #expect(await f.worker("Faulty")?.pid == stalled)
        kill(stalled, SIGKILL)
        await f.set.shutdown()
    }

    /// Replacing an isolated plugin again and again leaves no descriptor of its old workers
    /// (sockets, the pidfd the daemon watches each by) and no thread behind.
    @Test func replacingAnIsolatedPluginLeavesNoDescriptorOrThreadBehind() async throws {
        let f = try Fixture()
        try await f.add("Quiet")
        await f.set.reconcile()
        await f.set.start()
        let original = f.plugins + "/libQuiet.so"
        let versions = PluginFactory(directory: f.root.directory("versions"))
        let manifest = try PluginFactory.embeddedManifest(original)
        func replace(_ cycle: Int) async throws {
            let next = try versions.withManifest(original, manifest.replacingOccurrences(of: #""version":"1.0""#, with: #""version":"1.\#(cycle)""#),
                                                 as: "libQuiet-\(cycle).so")
            try FileManager.default.copyItem(atPath: next, toPath: f.plugins + "/.libQuiet.so.tmp")
            #expect(rename(f.plugins + "/.libQuiet.so.tmp", f.plugins + "/libQuiet.so") == 0)
            let old = await f.worker("Quiet")?.pid ?? 0
            #expect(await f.set.reconcile().replaced == ["Quiet"])
            #expect(await f.until { Self.processes(inGroup: old).isEmpty })
        }
        try await replace(1)
        let descriptors = Self.descriptorCount()
        let threads = Self.count("Threads")
        for cycle in 2...11 { try await replace(cycle) }
        #expect(await f.until { Self.descriptorCount() <= descriptors }, "descriptors \(descriptors) -> \(Self.descriptorCount())")
        #expect(await f.until { Self.count("Threads") <= threads + 2 }, "threads \(threads) -> \(Self.count("Threads"))")
        await f.set.shutdown()
    }

    /// An isolated plugin's image is mapped only in its worker, a process of its own, so it
    /// keeps its own names and can be replaced any number of times; only a plugin that runs
    /// in the daemon is limited by the names one process can tell apart (1,295 generations,
    /// lowered here to 3). Each isolated replace runs the new version in a new worker. (The
    /// names are this process's, whatever set loaded them: the in-process plugin's name is
    /// this test's own.)
    @Test func anIsolatedPluginCanBeReplacedPastTheLimitOfNamesInOneProcess() async throws {
        let f = try Fixture(plugins: ["Nearby": PluginIsolationSettings(isolation: .inProcess)])
        await f.set.setNameGenerationLimit(3)
        try await f.add("Quiet")
        try await f.add("Nearby")
        await f.set.reconcile()
        await f.set.start()
        let versions = PluginFactory(directory: f.root.directory("versions"))
        func replace(_ name: String, _ cycle: Int) async throws -> PluginChanges {
            let original = f.plugins + "/lib\(name).so"
            let manifest = try PluginFactory.embeddedManifest(original)
            let next = try versions.withManifest(original, manifest.replacing(#/"version":"[0-9.]+"/#, with: #""version":"1.\#(cycle)""#),
                                                 as: "lib\(name)-\(cycle).so")
            try FileManager.default.copyItem(atPath: next, toPath: f.plugins + "/.lib\(name).so.tmp")
            #expect(rename(f.plugins + "/.lib\(name).so.tmp", original) == 0)
            return await f.set.reconcile()
        }
        func plugin(_ name: String) async -> PluginSetSnapshot.Plugin? { await f.set.snapshot().plugins.first { $0.name == name } }
        for cycle in 1...5 {
            let old = await f.worker("Quiet")?.pid
            #expect(try await replace("Quiet", cycle).replaced == ["Quiet"], "replace \(cycle)")
            let now = await plugin("Quiet")
            #expect(now?.version == "1.\(cycle)" && now?.generation == cycle + 1 && now?.worker?.pid != old, "\(String(describing: now))")
            #expect(await f.running(["Quiet"]))
        }
        // In process: generations 2 and 3 load; a fourth name is refused and 1.2 keeps running.
        for cycle in 1...2 { #expect(try await replace("Nearby", cycle).replaced == ["Nearby"], "replace \(cycle)") }
        #expect(try await replace("Nearby", 3).refused.count == 1)
        let near = await plugin("Nearby")
        #expect(near?.version == "1.2", "\(String(describing: near))")
        #expect(near?.lastError?.problem == "plugin Nearby has been loaded 3 times in this process, the most it can tell apart",
                "\(String(describing: near?.lastError))")
        await f.set.shutdown()
    }

    /// A count from this process's /proc/self/status (e.g. "Threads").
    static func count(_ field: String) -> Int {
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix(field + ":") } ?? ""
        return Int(line.split(separator: "\t").last?.trimmingCharacters(in: .whitespaces) ?? "") ?? -1
    }

    /// This process's open descriptors.
    static func descriptorCount() -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
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
            // Below what a worker itself needs: it would stall, not fail.
            (#"{"plugins": {"Ledger": {"limits": {"openFiles": 6}}}}"#, #"limits.openFiles" is 6, not a whole number from 16"#),
            (#"{"plugins": {"Ledger": {"limits": {"addressSpaceBytes": 1000000}}}}"#, #"is 1000000, not a whole number from 134217728"#),
            (#"{"plugins": {"Ledger": {"limits": {"addressSpaceBytes": 1e16}}}}"#, #"to 9007199254740992"#),
            (#"{"plugins": {"Ledger": {"sandbox": true}}}"#, #"field "plugins.Ledger.sandbox" is unknown"#),
            (#"{"plugins": {"../x": {}}}"#, #"field "plugins" names"#),
            (#"{"plugins": {"Ledger": {"user": ""}}}"#, #"field "plugins.Ledger.user" is not a user or group name"#),
            // A typo of a known field is named, with the fix to rename it.
            (#"{"logLevle": "info"}"#, #"has an unknown field "logLevle" (did you mean "logLevel"?). Fix: rename "logLevle" to "logLevel""#),
            (#"{"plugins": {"Ledger": {"limtis": {}}}}"#, #"field "plugins.Ledger.limtis" is unknown (did you mean "limits"?)"#),
            (#"{"plugins": {"Ledger": {"limits": {"openfiles": 64}}}}"#, #"(did you mean "openFiles"?). Fix: rename "openfiles" to "openFiles""#),
            (#"{"modules": {"m": {"enabeld": true}}}"#, #"field "modules.m.enabeld" is unknown (did you mean "enabled"?)"#),
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
    /// An awaited handler still running at the event deadline is cancelled and its module
    /// runs on with its state, isolated as in process (the worker's own deadline ends it
    /// first, so its answer reaches the daemon in time); the overrun is counted.
    @Test(arguments: [Isolation.inProcess, Isolation.process])
    func anAwaitedHandlerPastItsDeadlineIsCancelledAndItsModuleRunsOn(isolation: Isolation) async throws {
        let f = try Fixture(isolation: isolation, deadline: .seconds(1))
        let name = isolation == .process ? "PatientIsolated" : "PatientInProcess"
        try await f.add(name, language: .swift)
        let module = name.lowercased()
        await f.set.reconcile()
        await f.set.start()
        await f.host.send(ModuleEvent.custom(name: "tick", payload: .null), to: module)
        let pid = await f.worker(name)?.pid
        await f.host.send(AsyncModuleEvent.custom(name: "slow", payload: .null), to: module)
        #expect(await f.until { f.lines().contains("\(module) slow cancelled") }, "\(f.lines())")
        await f.host.send(ModuleEvent.custom(name: "report", payload: .null), to: module)
        #expect(await f.until { f.lines().contains { $0.hasPrefix("\(module) count 1 ") } }, "\(f.lines())")
        let worker = await f.worker(name)
        #expect(worker?.pid == pid && (worker?.restarts ?? 0) == 0, "\(String(describing: worker))")
        // Counted once (by the worker's answer, isolated); a daemon too slow to read that
        // answer before its own deadline counts it as well.
        let overruns = f.host.metrics.snapshot().modules.first { $0.module == module }?.deadlineOverruns ?? 0
        #expect((1...2).contains(overruns), "\(overruns)")
        await f.set.shutdown()
    }

    @Test(arguments: [Isolation.inProcess, Isolation.process])
    func theSamePluginBehavesTheSameInProcessAndIsolated(isolation: Isolation) async throws {
        let f = try Fixture(isolation: isolation)
        // Plugin names differ per mode: this process binds an in-process plugin by SONAME.
        let name = isolation == .process ? "SameIsolated" : "SameInProcess"
        try await f.add(name)
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
        func call(_ texts: [String], _ function: String = "faulty_add") async -> String {
            do {
                if let isolated = loaded.isolated { return "\(try await isolated.call(function, texts: texts))" }
                return "\(try loaded.functions!.call(function, texts: texts))"
            } catch let error as PluginSetError {
                return "\(error.code.rawValue): \(error.message)"
            } catch let error as CallError {
                return "\(error.code): \(error)"
            } catch {
                return "\(error)"
            }
        }
        #expect(await call(["20", "22"]) == "i32:42")
        #expect(await call(["1"]) == "invalid_arguments: faulty_add: expected 2 arguments for i32(i32,i32), got 1")
        #expect(await call(["x", "1"]).hasPrefix("invalid_arguments: faulty_add: argument 1:"))
        // Every return type comes back as in process, and none ends the worker.
        let tick = await call([], "faulty_tick")
        #expect(tick == "void:", "\(tick)")
        let negativeZero = await call([], "faulty_negative_zero")
        #expect(negativeZero == "f64:-0.0", "\(negativeZero)")
        let worker = await f.worker(name)
        #expect(worker.map { $0.restarts == 0 && $0.crashes == 0 } ?? true, "\(String(describing: worker))")
        let nope: String
        do {
            if let isolated = loaded.isolated {
                _ = try await isolated.call("nope", texts: [])
            } else {
                _ = try loaded.functions!.call("nope", texts: [])
            }
            nope = "returned"
        } catch let error as PluginSetError {
            nope = error.code.rawValue
        } catch let error as CallError {
            nope = error.code
        }
        #expect(nope == "unknown_function")

        await f.set.shutdown()
        #expect(await f.until { f.lines().suffix(2) == ["\(module) deinit -", "\(module) destroy -"] }, "\(f.lines())")
    }

    /// One suite, two modes, for what a Swift module reports: its Info is asked when it is
    /// read (`modhostctl info`, `host.infos()`, another module reading `info`), not
    /// remembered from its creation, so a count that grows with each event shows isolated
    /// exactly as in process.
    @Test(arguments: [Isolation.inProcess, Isolation.process])
    func aModulesInfoIsTheOneItReportsNowInProcessAndIsolated(isolation: Isolation) async throws {
        let f = try Fixture(isolation: isolation)
        let name = isolation == .process ? "InfoIsolated" : "InfoInProcess"
        let module = name.lowercased()
        try await f.add(name, language: .swift)
        await f.set.reconcile()
        await f.set.start()
        func ticks() async -> [JSONValue?] {
            let listed = await f.host.infos().first { $0.name == module }?.metadata["ticks"]
            guard case .array(let entries) = await f.host.infoPayload()["modules"] ?? .null else { return [] }
            let printed = entries.first { $0["name"]?.stringValue == module }?["metadata"]?["ticks"]
            let seen = await f.host.perform { host in host.module(named: module)?.info.metadata["ticks"] }
            return [listed, printed, seen]
        }
        #expect(await ticks() == [0, 0, 0])
        for _ in 0..<3 { await f.host.send(ModuleEvent.custom(name: "tick", payload: .null), to: module) }
        #expect(await ticks() == [3, 3, 3])
        #expect(await f.host.infos().first { $0.name == module }?.version == "2.5")
        // A custom event a module sends with `host.send` in its worker reaches it there.
        await f.host.send(ModuleEvent.custom(name: "relay", payload: .null), to: module)
        let relayed = await f.until { await ticks() == [4, 4, 4] }
        let now = await ticks()
        #expect(relayed, "\(now)")
        await f.set.shutdown()
    }

    /// A module's log lines carry the label of the host's logger and the host's name whether
    /// the module runs in process or in a worker: an embedder's log does not show its
    /// isolated plugins under another program's name.
    @Test func anIsolatedModulesLogLinesCarryTheEmbeddersLabelAndHostName() async throws {
        let label = "embedder-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let records = RecordingBackend(keeping: label)
        LoggingSystem.bootstrap(records, level: .info)
        defer { LoggingSystem.bootstrap(StandardErrorBackend(), level: .info) }
        let f = try Fixture(hostName: "documents", label: label)
        try await f.add("Faulty")
        await f.set.reconcile()
        await f.set.start()
        #expect(await f.running(["Faulty"]))
        await f.host.send(ModuleEvent.custom(name: "greet", payload: .null), to: "faulty")
        #expect(await f.until { records.kept().contains { $0.message == "hello from the plugin" } },
                "\(records.kept().map(\.message))")
        let line = try #require(records.kept().first { $0.message == "hello from the plugin" })
        let pairs = Dictionary(line.metadata, uniquingKeysWith: { first, _ in first })
        #expect(pairs["instance"] == "documents" && pairs["plugin"] == "Faulty" && pairs["module"] == "faulty", "\(line.metadata)")
        await f.set.shutdown()
    }

    /// A log backend that writes every record to standard error and keeps those of one label.
    final class RecordingBackend: LogBackend {
        let label: String
        private let records = Mutex<[LogRecord]>([])
        init(keeping label: String) { self.label = label }
        func write(_ record: LogRecord) {
            StandardErrorBackend().write(record)
            if record.label == label { records.withLock { $0.append(record) } }
        }
        func kept() -> [LogRecord] { records.withLock { $0 } }
    }

    /// A notification a Swift module posts with `host.post` in a worker reaches every module
    /// that listens, as in process: the modules of its own plugin (the poster too, once),
    /// an in-process module, a C module in process and a C module in another worker;
    /// and a C module's `post_notification` in a worker reaches the daemon's modules. The
    /// other way, a notification posted in the daemon reaches the isolated Swift module.
    @Test func aNotificationPostedInAWorkerReachesTheModulesOfEveryProcess() async throws {
        let f = try await Fixture.acrossProcesses(swift: "Shouter")
        let shouter = await f.worker("Shouter")?.pid
        let other = await f.worker("Other")?.pid
        #expect(shouter != nil && other != nil && shouter != other)
        #expect(await f.worker("Near") == nil)
        let pings = Received()
        let pongs = Received()
        await f.host.add([
            ModuleFactory(name: "ping-listener", version: "1") { _, _ in PongListener(pings, name: "ping-listener", listensTo: "ping") },
            ModuleFactory(name: "pong-listener", version: "1") { _, _ in PongListener(pongs, name: "pong-listener") },
        ])

        await f.host.send(ModuleEvent.custom(name: "shout", payload: ["n": 1]), to: "shouter")
        #expect(await f.until { pings.values.withLock { $0 } == [["n": 1]] }, "\(pings.values.withLock { $0 })")
        #expect(await f.until { f.lines().contains("other ping {\"n\":1}") && f.lines().contains("near ping {\"n\":1}") }, "\(f.lines())")
        // Both C modules answer ping with pong: the isolated one's post reaches the daemon too.
        #expect(await f.until { pongs.values.withLock { $0 } == [["n": 1], ["n": 1]] }, "\(pongs.values.withLock { $0 })")
        // Once the daemon has delivered it everywhere, a report to the poster comes after any echo.
        await f.host.send(ModuleEvent.custom(name: "report", payload: .null), to: "shouter")
        #expect(await f.until { f.lines().contains("shouter count 0 v2.5") }, "\(f.lines())")
        let heard = f.lines().filter { $0.hasPrefix("shouter ping ") }
        #expect(heard == ["shouter ping {\"n\":1}"], "the poster heard its own notification \(heard.count) times: \(f.lines())")

        await f.host.post(notification: "ping", payload: ["n": 2])
        #expect(await f.until { f.lines().contains("shouter ping {\"n\":2}") && f.lines().contains("other ping {\"n\":2}") }, "\(f.lines())")
        #expect(pings.values.withLock { $0 } == [["n": 1], ["n": 2]])
        await f.set.shutdown()
    }

    /// A Swift cast cannot reach across the process boundary, and says so: a typed lookup
    /// (`module(named:as:)`) of a module in another process throws "isolated in another
    /// process", whichever side looks (an isolated module looking up a module of the daemon
    /// or of another worker; the daemon's side looking up an isolated module), unlike a
    /// module that runs nowhere ("not running") or one of another type ("not of the type
    /// asked for").
    @Test func aCastAcrossTheProcessBoundaryIsAClearErrorNotANil() async throws {
        let f = try await Fixture.acrossProcesses(swift: "Seeker")
        for name in ["near", "other", "nothing", "seeker"] {
            await f.host.send(ModuleEvent.custom(name: "lookup", payload: ["name": .string(name)]), to: "seeker")
        }
        // (Each event is noted first, as `seeker lookup {"name":...}`.)
        #expect(f.lines().filter { ($0.hasPrefix("seeker lookup ") && !$0.hasPrefix("seeker lookup {")) || $0.hasPrefix("seeker found ") } == [
            "seeker lookup near: isolated in another process", "seeker lookup other: isolated in another process",
            "seeker lookup nothing: not running", "seeker found seeker",
        ], "\(f.lines())")

        func lookUp(_ name: String, as type: (some Any).Type) async -> String {
            await f.host.perform { host in
                do throws(ModuleLookupError) {
                    _ = try host.moduleManager.module(named: name, as: type)
                    return "found"
                } catch {
                    return error.description
                }
            }
        }
        let isolated = await lookUp("seeker", as: (any Ledgers).self)
        #expect(isolated.hasPrefix("module \"seeker\" is isolated in another process (plugin Seeker's worker process ") &&
                isolated.hasSuffix("a Swift cast to Ledgers cannot reach it; use events, notifications or calls by name"), "\(isolated)")
        #expect(await lookUp("near", as: (any Ledgers).self) == "module \"near\" is not of type Ledgers")
        #expect(await lookUp("nothing", as: (any Ledgers).self) == "module \"nothing\" is not running")
        #expect(await lookUp("seeker", as: (any Module).self) == "found")
        await f.set.shutdown()
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

/// A protocol no module conforms to: what a cast to another plugin's protocol asks for.
protocol Ledgers: AnyObject {}

/// What a `PongListener` received.
final class Received: Sendable {
    let values = Mutex<[JSONValue]>([])
}

/// Listens to one notification (`pong` unless told) and keeps its payloads.
private final class PongListener: Module {
    let received: Received
    let moduleName: String
    let listensTo: String
    var info: ModuleInfo { ModuleInfo(name: moduleName, version: "1") }
    var notifications: Set<String> { [listensTo] }

    init(_ received: Received, name: String, listensTo: String = "pong") {
        self.received = received
        moduleName = name
        self.listensTo = listensTo
    }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        if case .notification(listensTo, let payload) = event { received.values.withLock { $0.append(payload) } }
    }
}

/// Isolated plugins in a real modhostd: configured with one line, listed with their worker,
/// crashing without taking the daemon or the other modules along, and never outliving the
/// daemon, even after `kill -9`.
@Suite(.timeLimit(.minutes(5)), .serialized)
struct IsolatedDaemonTests {
    typealias Harness = DaemonLifecycleTests.Harness

    /// An isolated plugin that depends on a plugin the daemon runs in process (loaded from
    /// a memory file, not a file on disk) maps that plugin's image in its worker too: its
    /// import resolves and the provider's code runs there.
    @Test func anIsolatedPluginMapsTheMemoryImageOfAProviderInProcess() async throws {
        let vowels = try IsolationTests.vowelsPlugin()
        let h = try Harness(["Greeting"], files: [vowels], config: #"{"plugins": {"Vowels": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let rows = try h.modules()
        #expect(rows["greeting"]?["isolation"] as? String == "in-process")
        #expect(rows["vowels"]?["isolation"] as? String == "process", "\(h.daemon.text)")
        let call = try h.ctl("call", "Vowels", "vowels_times_ten", "isolation")
        #expect(call.standardOutput == "50\n", "\(call.standardError) \(h.daemon.text)")
        #expect(await h.stop() == 0)
    }

    /// C plugins Ledger (module `ledger`, exports `ledger_balance() -> i32`, 42) and Bank
    /// (module `bank`, depends on Ledger and links to it, exports `bank_balance() -> i32`,
    /// Ledger's balance plus one).
    static func ledgerAndBank(in scratch: TemporaryDirectory) throws -> (ledger: String, bank: String) {
        func source(_ plugin: String, _ body: String) -> String {
            """
            #include <modulehost.h>
            \(body)
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) { (void)instance; (void)event; (void)payload; }
            static void destroy(void *instance) { (void)instance; }
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "\(plugin.lowercased())", "1.0",
                NULL, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(plugin)", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        }
        let ledger = try PluginFactory(directory: scratch.directory("ledger")).buildC(
            "Ledger", source: source("Ledger", "MODHOST_EXPORT int32_t ledger_balance(void) { return 42; }"),
            manifest: PluginFactory.manifest(plugin: "Ledger", modules: ["ledger"], exports: [("ledger_balance", "i32()")]))
        let bankDirectory = scratch.directory("bank")
        try FileManager.default.copyItem(atPath: ledger, toPath: bankDirectory + "/libLedger.so")
        let bank = try PluginFactory(directory: bankDirectory).buildC(
            "Bank", source: source("Bank", "extern int32_t ledger_balance(void);\nMODHOST_EXPORT int32_t bank_balance(void) { return ledger_balance() + 1; }"),
            manifest: PluginFactory.manifest(plugin: "Bank", modules: ["bank"], dependencies: ["Ledger"], exports: [("bank_balance", "i32()")]),
            flags: "-lLedger")
        return (ledger, bank)
    }

    /// Found from outside: a reload that moved a provider and its dependent into the daemon
    /// together refused the dependent, with the fix to run the provider in process (which the
    /// configuration already said), logged a failed replace without a reason and did it
    /// again at every reload; the reverse (the provider isolated, its dependent in process)
    /// was taken, although a start with it refuses the dependent. A reload is judged against
    /// the configuration as it will be, by the rule a start applies.
    @Test func aReloadThatChangesIsolationIsJudgedAsAWhole() async throws {
        let scratch = TemporaryDirectory("isolation-reload")
        let (ledger, bank) = try Self.ledgerAndBank(in: scratch)
        let h = try Harness([], files: [ledger, bank],
                            config: #"{"plugins": {"Ledger": {"isolation": "process"}, "Bank": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        func rows() throws -> [[String?]] {
            let rows = try h.modules()
            return ["ledger", "bank"].map { [rows[$0]?["isolation"] as? String, rows[$0]?["lastError"] as? String] }
        }
        func balance() throws -> String { try h.ctl("call", "Bank", "bank_balance").standardOutput }
        #expect(try rows() == [["process", nil], ["process", nil]])
        #expect(try balance() == "43\n")

        // Both into the daemon, in one reload.
        _ = try h.root.write("modhostd.json", text: "{}")
        h.daemon.send(SIGHUP)
        #expect(await h.waitFor("replaced plugin Ledger"), "\(h.daemon.text)")
        var moved = false
        for _ in 0..<300 where !moved {
            moved = try rows() == [["in-process", nil], ["in-process", nil]]
            if !moved { try await Task.sleep(for: .milliseconds(50)) }
        }
        #expect(moved, "\(h.daemon.text)")
        #expect(!h.daemon.text.contains("failed"), "\(h.daemon.text)")
        #expect(try balance() == "43\n")

        // The provider isolated, its dependent in process: refused, as a start refuses it.
        let split = #"{"plugins": {"Ledger": {"isolation": "process"}}}"#
        _ = try h.root.write("modhostd.json", text: split)
        h.daemon.send(SIGHUP)
        #expect(await h.waitFor("replacing plugin Ledger failed"), "\(h.daemon.text)")
        let refusal = "plugin Bank runs in process and depends on Ledger, which runs in a worker process"
        let failed = h.daemon.text.split(separator: "\n").first { $0.contains("replacing plugin Ledger failed") } ?? ""
        #expect(failed.contains(refusal), "\(failed)")
        let after = try rows()
        #expect(after[0][0] == "in-process" && after[1] == ["in-process", nil], "\(after)")
        #expect(after[0][1]?.contains(refusal) == true, "\(after)")
        #expect(try balance() == "43\n")
        #expect(await h.stop() == 0)

        let fresh = try Harness([], files: [ledger, bank], config: split)
        #expect(await fresh.waitFor("control socket ready"), "\(fresh.daemon.text)")
        #expect(fresh.daemon.text.contains(refusal), "\(fresh.daemon.text)")
        #expect(await fresh.stop() == 0)
    }

    @Test(arguments: IsolationTests.Language.allCases)
    func aCrashingIsolatedPluginIsRestartedWhileTheDaemonAnswers(language: IsolationTests.Language) async throws {
        let scratch = TemporaryDirectory("isolated-daemon")
        let events = scratch.file("events.log")
        let faulty = language == .c ? try IsolationTests.faultyPlugin("Faulty", in: scratch.directory("faulty"), events: events)
                                    : try IsolationTests.swiftFaultyPlugin("Faulty")
        let calm = try IsolationTests.faultyPlugin("Calm", in: scratch.directory("calm"), events: events)
        let h = try Harness([], files: [faulty, calm], arguments: ["--event-deadline", "1"],
                            config: #"{"plugins": {"Faulty": {"isolation": "process"}}, "modules": {"faulty": {"configuration": {"events": "\#(events)"}}}}"#)
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

        // Disabled and enabled again, the isolated module runs again and gets events.
        _ = try await StuckModuleTests.listUntil(h.socket) { rows in rows["faulty"]?["state"] as? String == "running" }
        #expect(try h.ctl("disable", "faulty").status == 0)
        #expect(try h.ctl("enable", "faulty").status == 0)
        #expect(try h.ctl("send", "back", "--to", "faulty").status == 0)
        let back = ((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").split(separator: "\n")
        #expect(back.contains("faulty back -"), "\(back)")

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

    /// A worker that stops reading (here: stopped) while calls, or awaited events, larger
    /// together than its socket's buffer are sent to it blocks no thread of the daemon:
    /// `list` answers within 100 ms throughout and every caller gets an error by its
    /// deadline. Awaited events: the worker is killed as unanswering, logged with the
    /// plugin's name, and restarted. Calls take turns (the worker runs one at a time): one
    /// is sent and overruns, the others are never sent (`plugin_busy`); once the worker
    /// runs again, it answers the one it has, and calls work again.
    @Test(arguments: ["call", "send"])
    func aWorkerThatStopsReadingBlocksNoThreadOfTheDaemon(request: String) async throws {
        let (h, pid) = try await Self.stoppedWorker(TemporaryDirectory("isolated-unread"), requestDeadline: "2")
        // Eight requests of 60 KB: more than the socket's buffer holds.
        let bulk = String(repeating: "7", count: 60_000)
        let arguments = request == "call" ? ["call", "Faulty", "faulty_add", bulk, "1"]
                                          : ["send", "--await", "--to", "faulty", "--payload", "\"\(bulk)\"", "bulk"]
        let callers = try (0..<8).map { _ in try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket] + arguments) }
        if request == "call" {
            let waited = try await StuckModuleTests.listUntil(h.socket) { _ in callers.allSatisfy { !$0.text.isEmpty } }
            #expect(waited.met && waited.fast, "list answers took \(waited.times) while calls waited: \(h.daemon.text)")
            var codes: [String] = []
            for caller in callers {
                #expect(await caller.wait(timeout: .seconds(60)) != 0, "\(caller.text)")
                codes.append(caller.text.contains("(deadline_exceeded)") ? "deadline_exceeded" : caller.text.contains("(plugin_busy)") ? "plugin_busy" : caller.text)
            }
            #expect(codes.filter { $0 == "deadline_exceeded" }.count == 1 && codes.filter { $0 == "plugin_busy" }.count == 7, "\(codes)")
            kill(pid, SIGCONT)
            var answer = ""
            for _ in 0..<600 where answer != "5\n" {
                answer = try h.ctl("call", "Faulty", "faulty_add", "2", "3").standardOutput
                if answer != "5\n" { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(answer == "5\n", "\(h.daemon.text)")
            #expect(try h.modules()["faulty"]?["workerPid"] as? Int == Int(pid))
            _ = await h.stop()
            return
        }
        let answers = try await StuckModuleTests.listUntil(h.socket) { rows in
            rows["faulty"]?["restarts"] as? Int == 1 && rows["faulty"]?["state"] as? String == "running"
        }
        #expect(answers.met, "the worker was not restarted: \(h.daemon.text)")
        #expect(answers.fast, "list answers took \(answers.times) while the worker read nothing")
        for caller in callers {
            #expect(await caller.wait(timeout: .seconds(60)) != 0, "\(caller.text)")
            // The first to overrun gets the worker killed; the events behind it end with it.
            #expect(caller.text.contains("deadline_exceeded") || caller.text.contains("worker_ended"),
                    "\(caller.text)")
        }
        #expect(h.daemon.text.contains("plugin Faulty's worker (pid \(pid)) was killed by signal 9 (Killed): killed because it did not answer bulk within 1 s"),
                "\(h.daemon.text)")
        #expect(try h.ctl("call", "Faulty", "faulty_add", "2", "3").standardOutput == "5\n")
        _ = await h.stop()
    }

    /// `send` to an isolated module whose worker does not answer the event within the event
    /// deadline (here: stopped) fails with deadline_exceeded, as for a module stuck in it in
    /// process, saying its worker was killed for it; it reported success.
    @Test(arguments: [false, true])
    func aSendTheWorkerDidNotAnswerFailsWithDeadlineExceeded(awaited: Bool) async throws {
        let (h, _) = try await Self.stoppedWorker(TemporaryDirectory("isolated-unanswered"), requestDeadline: "30")
        let sent = try run(BuildProducts.modhostctl, ["--socket", h.socket, "send"] + (awaited ? ["--await"] : []) + ["--to", "faulty", "unheard"])
        #expect(sent.status != 0, "\(sent.standardOutput)")
        #expect(sent.standardError.contains("deadline_exceeded") && sent.standardError.contains("its worker was killed for it"),
                "\(sent.standardError)")
        _ = try await StuckModuleTests.listUntil(h.socket) { rows in
            rows["faulty"]?["restarts"] as? Int == 1 && rows["faulty"]?["state"] as? String == "running"
        }
        #expect(try h.ctl("send", "--to", "faulty", "heard").status == 0)
        _ = await h.stop()
    }

    /// A daemon in `scratch` running the faulty C plugin isolated, with an event deadline of
    /// 1 s and the request deadline given, once its worker is stopped (SIGSTOP); its pid.
    static func stoppedWorker(_ scratch: TemporaryDirectory, requestDeadline: String) async throws -> (Harness, Int32) {
        let faulty = try IsolationTests.faultyPlugin("Faulty", in: scratch.directory("faulty"), events: scratch.file("events.log"))
        let h = try Harness([], files: [faulty], arguments: ["--event-deadline", "1", "--request-deadline", requestDeadline],
                            config: #"{"plugins": {"Faulty": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let pid = Int32(try await workerPid(h))
        kill(pid, SIGSTOP)
        for _ in 0..<1200 where !IsolationTests.isStopped(pid) { try await Task.sleep(for: .milliseconds(50)) }
        return (h, pid)
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
