import DaemonKit
import Foundation
import Glibc
import Synchronization

/// The daemon as operators see it, run as a real process (the release modhostd):
/// drop-to-started and replace latency, control round trips. (Start to READY=1 is the peer
/// group's, against libpeas.)
struct DaemonBenchmark {
    let sdk: String
    let work: String
    /// The generated trivial C plugins of the load benchmark (work/load/src).
    let plugins: String

    func run() async throws -> [BenchRow] {
        var rows: [BenchRow] = []
        rows += try await dropAndReplace()
        rows += try await control()
        rows += try await replaceForever()
        return rows
    }

    // MARK: replacing for ever

    /// 10,000 replaces of one C plugin in a real modhostd with its default
    /// `retiredImageLimit`, which executes itself again each time the limit is reached: its
    /// RSS and mappings after them, against after the first replace.
    func replaceForever(count: Int = 10_000) async throws -> [BenchRow] {
        let root = try fresh("forever")
        try FileManager.default.createDirectory(atPath: root + "/plugins", withIntermediateDirectories: true)
        // Two versions of one plugin, which the replaces alternate.
        var versions: [String] = []
        for version in [2, 3] {
            let manifest = root + "/manifest-\(version).json"
            try #"{"name":"P00200","version":"\#(version).0","description":"generated","abi":"1.0","language":"c","order":200,"modules":["p00200"]}"#
                .write(toFile: manifest, atomically: true, encoding: .utf8)
            let file = root + "/v\(version).so"
            try shell("objcopy --update-section .modhost.manifest='\(manifest)' '\(plugins)/libP00200.so' '\(file)'")
            versions.append(file)
        }
        try FileManager.default.copyItem(atPath: plugins + "/libP00200.so", toPath: root + "/plugins/libP00200.so")
        let daemon = try DaemonProcess(sdk: sdk, root: root, pluginDirectory: root + "/plugins")
        defer { daemon.stop() }
        guard await daemon.waitForLine(containing: "control socket ready", after: 0) != nil else { throw failure("daemon did not start") }
        let measure = ReplaceBenchmark(sdk: sdk, work: work, plugins: plugins, cycles: 0)
        let retiredImageLimit = 128  // modhostd's default
        var first: (rssKiB: Int, mappings: Int, threads: Int)?
        var renewals = 0
        for index in 0..<count {
            let temporary = root + "/plugins/.libP00200.so.tmp"
            try FileManager.default.copyItem(atPath: versions[index % 2], toPath: temporary)
            let start = monotonicNanoseconds()
            rename(temporary, root + "/plugins/libP00200.so")
            // Replaced; or, when it came while the daemon executed itself again, loaded by
            // the new program's first scan.
            guard let seen = await daemon.waitForLine(after: start, matching: {
                $0.contains("replaced plugin P00200 ") || $0.contains("loaded plugin P00200 ")
            }) else {
                throw failure("replace \(index + 1) not seen:\n\(daemon.tail)")
            }
            // Each replace retires one image: the one that reaches the limit is followed by
            // a renewal, and the next drop waits until the new program is ready.
            if (index + 1) % retiredImageLimit == 0 {
                guard let back = await daemon.waitForLine(containing: "took over from the daemon", after: seen),
                      await daemon.waitForLine(containing: "control socket ready", after: back) != nil else {
                    throw failure("the daemon did not execute itself again after replace \(index + 1):\n\(daemon.tail)")
                }
                renewals += 1
            }
            if index == 0 { first = try measure.memory(of: daemon.pid) }
        }
        guard let first else { return [] }
        let last = try measure.memory(of: daemon.pid)
        let what = "after the first replace, in the same daemon (\(count) replaces of a C plugin, \(renewals) renewals at retiredImageLimit \(retiredImageLimit))"
        // Between renewals up to `retiredImageLimit` images stay mapped, about 5 mappings
        // and 23 KB each: the bound, whatever the number of replaces.
        return [
            BenchRow(name: "replace.c.rss_after_10000", value: Double(last.rssKiB), unit: "KiB", baseline: Double(first.rssKiB),
                     baselineDescription: "RSS " + what, target: 1.5),
            BenchRow(name: "replace.c.mappings_after_10000", value: Double(last.mappings), unit: "n", baseline: Double(first.mappings),
                     baselineDescription: "mappings " + what + "; at most about 5 per retired image", target: 6),
        ]
    }

    // MARK: drop and replace

    func dropAndReplace() async throws -> [BenchRow] {
        let root = try fresh("drop")
        let daemon = try DaemonProcess(sdk: sdk, root: root, pluginDirectory: root + "/plugins")
        defer { daemon.stop() }
        guard await daemon.waitForLine(containing: "control socket ready", after: 0) != nil else { throw failure("daemon did not start") }

        // 100 new plugins, each copied to a dotfile and renamed in, one at a time.
        var drops: [Double] = []
        for index in 0..<100 {
            let name = String(format: "libP%05d.so", 200 + index)
            let temporary = root + "/plugins/." + name + ".tmp"
            try FileManager.default.copyItem(atPath: plugins + "/" + name, toPath: temporary)
            let start = monotonicNanoseconds()
            rename(temporary, root + "/plugins/" + name)
            guard let seen = await daemon.waitForLine(containing: String(format: "loaded plugin P%05d ", 200 + index), after: start) else {
                throw failure("plugin \(name) was not loaded:\n\(daemon.tail)")
            }
            drops.append(Double(seen - start) / 1e6)
        }

        // 20 replacements of one plugin: the same code with a new manifest version.
        var replaces: [Double] = []
        let source = plugins + "/libP00200.so"
        for version in 2...21 {
            let manifest = root + "/manifest.json"
            try #"{"name":"P00200","version":"\#(version).0","description":"generated","abi":"1.0","language":"c","order":200,"modules":["p00200"]}"#
                .write(toFile: manifest, atomically: true, encoding: .utf8)
            let temporary = root + "/plugins/.libP00200.so.tmp"
            try shell("objcopy --update-section .modhost.manifest='\(manifest)' '\(source)' '\(temporary)'")
            let start = monotonicNanoseconds()
            rename(temporary, root + "/plugins/libP00200.so")
            guard let seen = await daemon.waitForLine(containing: "by \(version).0 (generation \(version))", after: start) else {
                throw failure("replacement \(version) not seen:\n\(daemon.tail)")
            }
            replaces.append(Double(seen - start) / 1e6)
        }
        let p50 = percentile(drops, 0.5), p99 = percentile(drops, 0.99)
        let poll = "a 2 s poll (OSGi FileInstall's interval): a constant, not measured"
        return [
            BenchRow(name: "daemon.drop_to_started.p50", value: p50, unit: "ms", baseline: 2000, baselineDescription: poll, target: 0.01),
            BenchRow(name: "daemon.drop_to_started.p99", value: p99, unit: "ms", baseline: 2000, baselineDescription: poll, target: 0.05),
            BenchRow(name: "daemon.replace.p50", value: percentile(replaces, 0.5), unit: "ms", baseline: p50,
                     baselineDescription: "drop-to-started p50 of a new plugin in the same run (20 replaces: trial load, private copy, willUnload, handover, init, start)",
                     target: 3),
        ]
    }

    // MARK: control socket

    func control() async throws -> [BenchRow] {
        let root = try fresh("control")
        let daemon = try DaemonProcess(sdk: sdk, root: root, pluginDirectory: root + "/plugins")
        defer { daemon.stop() }
        guard await daemon.waitForLine(containing: "control socket ready", after: 0) != nil else { throw failure("daemon did not start") }
        let echoPath = root + "/echo.sock"
        let echo = try ControlServer(socketPath: echoPath, rejectionReply: { "\($0)" }) { line, _ in line }
        defer { Task { await echo.stop() } }

        let request = #"{"v":1,"id":1,"cmd":"status"}"#
        @Sendable func roundTrips(_ path: String, count: Int) throws -> [Double] {
            let client = try ControlClient(socketPath: path)
            defer { client.close() }
            var times: [Double] = []
            for _ in 0..<count {
                let start = monotonicNanoseconds()
                _ = try client.request(request)
                times.append(Double(monotonicNanoseconds() - start) / 1e3)
            }
            return times
        }
        // The clients block on their sockets: they run on threads of their own, never on the
        // concurrency pool that runs the in-process echo server's handler.
        let daemonRTT = percentile(try await onThread { try roundTrips(daemon.socket, count: 2000) }, 0.5)
        let echoRTT = percentile(try await onThread { try roundTrips(echoPath, count: 2000) }, 0.5)

        func throughput(_ path: String) async throws -> Double {
            let perClient = 500
            let start = monotonicNanoseconds()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<8 {
                    group.addTask { _ = try await onThread { try roundTrips(path, count: perClient) } }
                }
                try await group.waitForAll()
            }
            return Double(monotonicNanoseconds() - start) / 1e3 / Double(8 * perClient)
        }
        let daemonCost = try await throughput(daemon.socket)
        let echoCost = try await throughput(echoPath)
        return [
            BenchRow(name: "control.round_trip.p50", value: daemonRTT, unit: "us", baseline: echoRTT,
                     baselineDescription: "the same request line echoed by a bare ControlServer in the bench process (socket, peer check, line framing only), p50 of 2000",
                     target: 5),
            BenchRow(name: "control.per_request.8_clients", value: daemonCost, unit: "us", baseline: echoCost,
                     baselineDescription: "8 clients x 500 status requests: wall time per request, against the echo server (daemon: \(Int(1e6 / daemonCost)) req/s, echo: \(Int(1e6 / echoCost)) req/s)",
                     target: 5),
        ]
    }

    // MARK: helpers

    func fresh(_ name: String) throws -> String { try freshDirectory(work + "/" + name) }
}

/// An empty directory at `path` with an empty `plugins` directory (0755) in it.
func freshDirectory(_ path: String) throws -> String {
    try? FileManager.default.removeItem(atPath: path)
    try FileManager.default.createDirectory(atPath: path + "/plugins", withIntermediateDirectories: true)
    chmod(path + "/plugins", 0o755)
    return path
}

/// The error a benchmark throws when the daemon does not do what it measures.
func failure(_ message: String) -> NSError { NSError(domain: "bench", code: 5, userInfo: [NSLocalizedDescriptionKey: message]) }

/// Runs blocking work on a thread of its own and returns its result.
func onThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}

func percentile(_ values: [Double], _ fraction: Double) -> Double {
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int((Double(sorted.count) * fraction).rounded(.up)) - 1)]
}

/// A release modhostd with its log lines time-stamped as they arrive.
final class DaemonProcess: Sendable {
    let socket: String
    private let process: Process
    var pid: Int32 { process.processIdentifier }
    private let lines = Mutex<[(UInt64, String)]>([])

    init(sdk: String, root: String, pluginDirectory: String, state: String = "state", environment: [String: String] = [:],
         arguments: [String] = []) throws {
        socket = root + "/" + state + ".sock"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: sdk + "/bin/modhostd")
        process.arguments = ["--plugins", pluginDirectory, "--state-dir", root + "/" + state, "--socket", socket, "--log-level", "info"] + arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = FileHandle.nullDevice
        self.process = process
        let handle = pipe.fileHandleForReading
        let reader = Thread { [self] in
            var pending = ""
            while true {
                let data = handle.availableData
                if data.isEmpty { break }
                let now = monotonicNanoseconds()
                pending += String(decoding: data, as: UTF8.self)
                while let newline = pending.firstIndex(of: "\n") {
                    let line = String(pending[..<newline])
                    pending = String(pending[pending.index(after: newline)...])
                    lines.withLock { $0.append((now, line)) }
                }
            }
        }
        try process.run()
        reader.start()
    }

    /// When the first line containing `text` that arrived after `time` arrived.
    func waitForLine(containing text: String, after time: UInt64, timeout: Duration = .seconds(30)) async -> UInt64? {
        await waitForLine(after: time, timeout: timeout) { $0.contains(text) }
    }

    /// When the first line that `matches` and arrived after `time` arrived.
    func waitForLine(after time: UInt64, timeout: Duration = .seconds(30), matching matches: (String) -> Bool) async -> UInt64? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let found = lines.withLock({ lines in lines[Self.firstIndex(of: lines, after: time)...].first { matches($0.1) } }) {
                return found.0
            }
            try? await Task.sleep(for: .microseconds(200))
        }
        return nil
    }

    /// The index of the first of `lines` (in the order they arrived) that arrived after
    /// `time`: found from the end, so a wait costs the lines since `time`, not all of them.
    private static func firstIndex(of lines: [(UInt64, String)], after time: UInt64) -> Int {
        var index = lines.count
        while index > 0, lines[index - 1].0 >= time { index -= 1 }
        return index
    }

    var tail: String { lines.withLock { $0.suffix(10).map(\.1).joined(separator: "\n") } }

    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
    }
}
