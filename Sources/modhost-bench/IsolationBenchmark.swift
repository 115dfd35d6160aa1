import Foundation
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

        let echo = try EchoProcess()
        defer { echo.stop() }
        var rows: [BenchRow] = []
        let rounds = 5000
        let bare = try await median(of: 7) { try echo.roundTrips(rounds) }
        let events = await median(of: 7) {
            await host.perform { host in
                let start = monotonicNanoseconds()
                for _ in 0..<rounds { host.send(ModuleEvent.custom(name: "tick", payload: .null), to: "echo") }
                return Double(monotonicNanoseconds() - start) / Double(rounds) / 1000
            }
        }
        rows.append(BenchRow(
            name: "isolation.sync_event.round_trip", value: events, unit: "us", baseline: bare,
            baselineDescription: "a 64-byte write and read back over a socketpair to another process that echoes it, median of 7 × \(rounds); value: host.send of a custom event to one isolated C module (delivered in its worker, answered), same counts",
            target: 2))
        let calls = try await median(of: 7) { () async throws -> Double in
            let start = monotonicNanoseconds()
            for _ in 0..<rounds {
                guard try await isolated.call("echo_add", json: [2, 3]) == .int32(5) else { throw failure("echo_add(2, 3) is not 5") }
            }
            return Double(monotonicNanoseconds() - start) / Double(rounds) / 1000
        }
        rows.append(BenchRow(
            name: "isolation.call.round_trip", value: calls, unit: "us", baseline: bare,
            baselineDescription: "the same bare echo; value: a call by name of echo_add(i32, i32) in the isolated plugin's worker, median of 7 × \(rounds)",
            target: 2))

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
                       configuration: #"{"isolation": "process"}"#)
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

    func median(of count: Int, _ body: () async throws -> Double) async rethrows -> Double {
        var values: [Double] = []
        for _ in 0..<count { values.append(try await body()) }
        return percentile(values, 0.5)
    }
}

/// This executable started again as `--echo`: it writes back whatever it reads on
/// descriptor 3, the least two processes can do for a round trip over a socketpair.
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
        guard code == 0 else { throw failure("cannot start the echo process: \(String(cString: strerror(code)))") }
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

    /// The child's side; never returns.
    static func serve() -> Never {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
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
