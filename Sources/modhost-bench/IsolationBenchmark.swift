import Foundation
import DaemonKit
import Glibc
import ModuleHost
import ModuleKit
import PluginCall
import TestSupport

/// Isolated plugins (docs/isolation.md): a synchronous event and a call by name to a module
/// in its worker process, each against a bare socketpair echo between two processes in the
/// same run; how long a crashed worker takes to run again; and what 1,000 replaces of an
/// isolated plugin leave in the daemon.
struct IsolationBenchmark {
    let sdk: String
    let work: String
    /// The generated trivial C plugins of the load benchmark (work/load/src).
    let plugins: String

    func run() async throws -> [BenchRow] {
        let root = try freshDirectory(work + "/set")
        let plugin = try PluginFactory(directory: try freshDirectory(root + "/build"), sdk: sdk).buildC(
            "Echo", source: Self.source,
            manifest: PluginFactory.manifest(plugin: "Echo", modules: ["echo"], exports: [("echo_add", "i32(i32,i32)")]))
        let directory = try freshDirectory(root + "/plugins")
        try FileManager.default.copyItem(atPath: plugin, toPath: directory + "/libEcho.so")
        let state = try freshDirectory(root + "/state")
        let images = try freshDirectory(root + "/state/images")
        chmod(state, 0o700)
        chmod(images, 0o700)
        let host = HostInstance(name: "bench-isolation", eventDeadline: .seconds(10))
        // A window of 1 ms: every crash measured is a first crash, restarted at once.
        let set = PluginSet(host: host, directories: [directory], imagesDirectory: images, crashGuard: try CrashGuard(directory: state),
                            trialLoader: nil,
                            isolation: IsolationPolicy(defaultIsolation: .process, workerExecutable: sdk + "/bin/modhost-worker",
                                                       window: .milliseconds(1)))
        await set.reconcile()
        await set.start()
        guard let isolated = await set.plugin(named: "Echo")?.isolated else { throw failure("Echo did not load isolated") }

        guard let worker = isolated.status.pid else { throw failure("Echo's worker does not run") }
        let echo = try EchoProcess()
        defer { echo.stop() }
        let round = RoundTrips(echo: echo, host: host, plugin: isolated)
        let measured = try await round.measure(processes: (daemon: getpid(), worker: worker, echo: echo.pid))
        var rows: [BenchRow] = []
        let conditions = "all on one CPU (the bench, the echo process and the worker confined to it while measured), \(RoundTrips.samples) samples of \(RoundTrips.rounds) round trips each, the three kinds interleaved sample by sample; medians"
        let bare = "a bare round trip between two processes: a 64-byte write over a socketpair, then poll and read of the reply, to a second process that polls, reads and writes it back (2 thread wake-ups per round trip, the least two processes can do)"
        rows.append(BenchRow(
            name: "isolation.sync_event.round_trip", value: measured.events.median, unit: "us", baseline: measured.bare.median,
            baselineDescription: "\(bare); value: host.send of a custom event to one isolated C module (delivered in its worker, answered); \(conditions)",
            target: 2))
        rows.append(BenchRow(
            name: "isolation.call.round_trip", value: measured.calls.median, unit: "us", baseline: measured.bare.median,
            baselineDescription: "the same bare round trip; value: a call by name of echo_add(i32, i32) in the isolated plugin's worker; \(conditions)",
            target: 2))
        rows.append(BenchRow(
            name: "isolation.sync_event.switches_per_round_trip", value: measured.events.switches, unit: "n", baseline: measured.bare.switches,
            baselineDescription: "context switches (a thread put on the CPU: woken, or preempting) per bare round trip, in both processes; value: the same for the isolated sync event, in the daemon and the worker; the same samples as isolation.sync_event.round_trip",
            target: nil))
        rows.append(BenchRow(
            name: "isolation.call.switches_per_round_trip", value: measured.calls.switches, unit: "n", baseline: measured.bare.switches,
            baselineDescription: "context switches per bare round trip, as isolation.sync_event.switches_per_round_trip; value: the same for the isolated call by name",
            target: nil))

        var restarts: [Double] = []
        for _ in 0..<20 {
            guard let pid = isolated.status.pid else { throw failure("no worker runs") }
            let start = monotonicNanoseconds()
            kill(pid, SIGSEGV)
            while true {
                let status = isolated.status
                if status.phase == .running, let now = status.pid, now != pid { break }
                if monotonicNanoseconds() - start > 30_000_000_000 { throw failure("the worker was not restarted: \(status)") }
                usleep(100)
            }
            restarts.append(Double(monotonicNanoseconds() - start) / 1e6)
        }
        rows.append(BenchRow(
            name: "isolation.crash_to_running.p50", value: percentile(restarts, 0.5), unit: "ms", baseline: 50,
            baselineDescription: "the issue's target, 50 ms; value: p50 of 20 × SIGSEGV to the worker of an isolated C plugin until a new worker runs its module again (created, initialized, started; the first restart of each crash)",
            target: 1))
        await set.shutdown()

        rows += try await ReplaceBenchmark(sdk: sdk, work: work + "/replace", plugins: plugins, cycles: 1000)
            .leftovers(plugin: "P00200", file: plugins + "/libP00200.so", label: "isolated_c",
                       configuration: #"{"isolation": "process"}"#, warmUp: 1000)
        return rows
    }

    static let source = """
        #include <modulehost.h>
        #include <stdint.h>
        static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
        static void handle(void *instance, const char *event, const char *payload) { (void)instance; (void)event; (void)payload; }
        static void destroy(void *instance) { (void)instance; }
        __attribute__((visibility("default"))) int32_t echo_add(int32_t a, int32_t b) { return a + b; }
        static const modhost_module modules[] = {{
            .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "echo", .version = "1.0",
            .create = create, .handle_event = handle, .destroy = destroy,
        }};
        static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Echo", modules);
        MODHOST_PLUGIN_ENTRY { return &plugin; }
        """
}

/// The round trips of the isolation.sync_event and isolation.call rows and their bare
/// baseline, measured under the same conditions.
///
/// On a virtual machine, where a thread runs decides a round trip's cost more than the code:
/// a wake-up of a thread whose CPU is idle goes through the hypervisor (the idle virtual CPU
/// has halted), tens to hundreds of microseconds, while two threads taking turns on one CPU
/// cost a few microseconds per switch. Left to the scheduler, each pair of processes (the
/// bench and the echo process, the daemon and the worker) lands on one CPU or on two
/// depending on the load of the moment, each on its own: the same code measured 15, 56 or
/// 112 us per bare round trip from run to run. So every thread of the three processes is
/// confined to one CPU while they are measured, and the three kinds of round trip take turns
/// sample by sample, so that whatever else the machine does hits all three alike.
struct RoundTrips {
    static let samples = 61
    static let rounds = 500
    let echo: EchoProcess
    let host: HostInstance
    let plugin: IsolatedPlugin

    /// One kind of round trip: microseconds per round trip (median of the samples) and the
    /// context switches per round trip in the two processes involved (all samples together).
    struct Figures {
        var samples: [Double] = []
        var switches = 0.0
        var median: Double { percentile(samples, 0.5) }
    }

    func measure(processes: (daemon: pid_t, worker: pid_t, echo: pid_t)) async throws -> (bare: Figures, events: Figures, calls: Figures) {
        // Warm up each path (first-use allocations, lazily started threads) before timing.
        _ = try echo.roundTrips(200)
        await events(200)
        try await calls(200)
        let confinement = try OneCPU(processes: [processes.daemon, processes.worker, processes.echo])
        defer { confinement.restore() }
        var bare = Figures(), events = Figures(), calls = Figures()
        func timed(_ figures: inout Figures, _ pair: [pid_t], _ body: () async throws -> Void) async rethrows {
            let before = ContextSwitches.count(pair)
            let start = monotonicNanoseconds()
            try await body()
            figures.samples.append(Double(monotonicNanoseconds() - start) / Double(Self.rounds) / 1000)
            figures.switches += Double(ContextSwitches.count(pair) - before) / Double(Self.rounds * Self.samples)
        }
        for _ in 0..<Self.samples {
            try await timed(&bare, [processes.daemon, processes.echo]) { _ = try echo.roundTrips(Self.rounds) }
            await timed(&events, [processes.daemon, processes.worker]) { await self.events(Self.rounds) }
            try await timed(&calls, [processes.daemon, processes.worker]) { try await self.calls(Self.rounds) }
        }
        return (bare, events, calls)
    }

    /// `count` synchronous custom events to the isolated module, each answered.
    private func events(_ count: Int) async {
        await host.perform { host in
            for _ in 0..<count { host.send(ModuleEvent.custom(name: "tick", payload: .null), to: "echo") }
        }
    }

    /// `count` calls of echo_add(2, 3) in the isolated plugin's worker.
    private func calls(_ count: Int) async throws {
        for _ in 0..<count {
            guard try await plugin.call("echo_add", json: [2, 3]) == .int32(5) else { throw failure("echo_add(2, 3) is not 5") }
        }
    }
}

/// Context switches of processes: how many times one of their threads was put on a CPU
/// (woken from a wait, or back after being preempted), from /proc/PID/task/TID/schedstat.
enum ContextSwitches {
    static func count(_ processes: [pid_t]) -> Int {
        var total = 0
        for pid in processes {
            for tid in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? [] {
                // "time on CPU, time waiting to run, times run": the third field.
                guard let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/schedstat", encoding: .utf8) else { continue }
                let fields = text.split(separator: " ")
                if fields.count >= 3, let runs = Int(fields[2].trimmingCharacters(in: .whitespacesAndNewlines)) { total += runs }
            }
        }
        return total
    }
}

/// Every thread of some processes confined to one CPU (the first the bench may use) until
/// `restore`, which gives each thread of them, new ones included, the bench's CPUs back.
struct OneCPU {
    /// sched_getaffinity and sched_setaffinity: glibc declares them only under _GNU_SOURCE,
    /// so the Glibc module does not import them.
    private typealias Affinity = @convention(c) (pid_t, Int, UnsafeMutableRawPointer?) -> Int32
    private static let getAffinity: Affinity = unsafeBitCast(dlsym(nil, "sched_getaffinity"), to: Affinity.self)
    private static let setAffinity: Affinity = unsafeBitCast(dlsym(nil, "sched_setaffinity"), to: Affinity.self)

    let processes: [pid_t]
    private let allowed: cpu_set_t

    init(processes: [pid_t]) throws {
        self.processes = processes
        var allowed = cpu_set_t()
        guard Self.getAffinity(0, MemoryLayout<cpu_set_t>.size, &allowed) == 0 else { throw failure("sched_getaffinity: \(SystemError.describe(errno))") }
        self.allowed = allowed
        var one = cpu_set_t()
        withUnsafeBytes(of: allowed) { mask in
            withUnsafeMutableBytes(of: &one) { chosen in
                // The lowest CPU in the mask: bit N of the set is bit N % 8 of byte N / 8.
                guard let byte = mask.firstIndex(where: { $0 != 0 }) else { return }
                chosen[byte] = mask[byte] & (~mask[byte] &+ 1)
            }
        }
        try apply(one)
    }

    func restore() { try? apply(allowed) }

    private func apply(_ mask: cpu_set_t) throws {
        var mask = mask
        for pid in processes {
            for tid in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? [] {
                guard let tid = pid_t(tid) else { continue }
                // A thread that ended meanwhile (ESRCH) needs no CPU.
                if Self.setAffinity(tid, MemoryLayout<cpu_set_t>.size, &mask) != 0 && errno != ESRCH {
                    throw failure("sched_setaffinity of thread \(tid) of process \(pid): \(SystemError.describe(errno))")
                }
            }
        }
    }
}

/// This executable started again as `--echo`: it writes back whatever it reads on
/// descriptor 3, the least two processes can do for a round trip over a socketpair. Both
/// sides wait in `poll` before they read: a thread blocked in `read` on a stream socket is
/// also woken each time the other side reads what it wrote (the socket has room again), an
/// extra wake-up a thread in `poll` for input does not get. So a round trip wakes two
/// threads, one in each process.
final class EchoProcess {
    let fd: Int32
    let pid: pid_t

    init() throws {
        var ends: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0 else {
            throw failure("socketpair failed")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, ends[1], 3)
        let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let argv: [UnsafeMutablePointer<CChar>?] = [strdup(executable), strdup("--echo"), nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let code = posix_spawn(&pid, executable, &actions, nil, argv, environ)
        close(ends[1])
        guard code == 0 else { throw failure("cannot start the echo process: \(SystemError.describe(code))") }
        self.pid = pid
        fd = ends[0]
    }

    /// Microseconds per round trip of a 64-byte message, over `count` of them.
    func roundTrips(_ count: Int) throws -> Double {
        var message = [UInt8](repeating: 7, count: 64)
        let start = monotonicNanoseconds()
        for _ in 0..<count {
            guard write(fd, message, 64) == 64 else { throw failure("echo write failed") }
            var got = 0
            while got < 64 {
                Self.waitForInput(fd)
                let n = message.withUnsafeMutableBytes { read(fd, $0.baseAddress! + got, 64 - got) }
                guard n > 0 else { throw failure("echo read failed") }
                got += n
            }
        }
        return Double(monotonicNanoseconds() - start) / Double(count) / 1000
    }

    func stop() {
        close(fd)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }

    /// Returns once `fd` has something to read (or has ended).
    static func waitForInput(_ fd: Int32) {
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        while poll(&entry, 1, -1) < 0 && errno == EINTR {}
    }

    /// The child's side; never returns.
    static func serve() -> Never {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            waitForInput(3)
            let n = buffer.withUnsafeMutableBytes { read(3, $0.baseAddress!, 4096) }
            if n <= 0 { exit(0) }
            var done = 0
            while done < n {
                let written = buffer.withUnsafeBytes { write(3, $0.baseAddress! + done, n - done) }
                if written <= 0 { exit(0) }
                done += written
            }
        }
    }
}
