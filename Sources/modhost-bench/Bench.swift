// modhost-bench: ModuleHost's benchmarks. Each row compares the host against a baseline
// measured in the same run, and reports the ratio; `make bench` writes the rows to
// build/bench/results.json. Not part of `make test`: timings are never asserted in tests.
import Foundation
import Glibc
import ModuleHost
import ModuleKit

@main
struct Bench {
    static func main() async {
        let arguments = Array(CommandLine.arguments.dropFirst())
        await runAsChild(arguments)
        func option(_ name: String) -> String? {
            guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
            return arguments[index + 1]
        }
        guard let sdk = option("--sdk"), let out = option("--out") else {
            StandardError.write("""
                usage: modhost-bench --sdk BUILD_DIR --out RESULTS.json [--peer-programs DIR --peer-sources DIR] [--only GROUP]
                groups: load events calls daemon replace isolation peer

                """)
            exit(64)
        }
        let only = option("--only")
        let work = URL(fileURLWithPath: out).deletingLastPathComponent().path + "/work"

        var rows: [BenchRow] = []
        func group(_ name: String, _ body: () async throws -> [BenchRow]) async {
            guard only == nil || only == name else { return }
            do {
                let produced = try await body()
                rows += produced
                for row in produced { print(row.line) }
                fflush(nil)
            } catch {
                StandardError.write("bench group \(name) failed: \(error)\n")
                exit(1)
            }
        }

        print(BenchRow.header)
        await group("load") { try LoadBenchmark(sdk: sdk, work: work + "/load").run() }
        await group("events") { try await EventBenchmark().run() }
        await group("calls") { try CallBenchmark(sdk: sdk).run() }
        await group("daemon") {
            // Uses the generated plugins of the load group (made once, kept in work/load/src).
            try LoadBenchmark(sdk: sdk, work: work + "/load").generate(count: 1110)
            return try await DaemonBenchmark(sdk: sdk, work: work + "/daemon", plugins: work + "/load/src").run()
        }
        await group("replace") {
            try LoadBenchmark(sdk: sdk, work: work + "/load").generate(count: 1110)
            return try await ReplaceBenchmark(sdk: sdk, work: work + "/replace", plugins: work + "/load/src").run()
        }
        await group("isolation") {
            try LoadBenchmark(sdk: sdk, work: work + "/load").generate(count: 1110)
            return try await IsolationBenchmark(sdk: sdk, work: work + "/isolation", plugins: work + "/load/src").run()
        }
        await group("peer") {
            let programs = option("--peer-programs"), sources = option("--peer-sources")
            if let reason = PeerBenchmark.unavailable(programs: programs, sources: sources) {
                print("peer rows skipped: \(reason)")
                return []
            }
            return try await PeerBenchmark(sdk: sdk, work: work + "/peer", programs: programs!, sources: sources!).run()
        }

        do {
            try (JSONValue(encoding: rows).prettyJSONText + "\n").write(toFile: out, atomically: true, encoding: .utf8)
        } catch {
            StandardError.write("cannot write \(out): \(error)\n")
            exit(1)
        }
        print("wrote \(rows.count) rows to \(out)")
    }

    /// The roles this executable plays as a child of a benchmark (`--echo`, `--peer-dispatch`,
    /// `--child`): each runs and exits. Returns for any other command line.
    static func runAsChild(_ arguments: [String]) async {
        if arguments.first == "--echo" { EchoProcess.serve() }
        if arguments.first == "--peer-dispatch", arguments.count == 4, let rounds = Int(arguments[3]) {
            do {
                print(try await PeerBenchmark.dispatchInProcess(directory: arguments[1], state: arguments[2], rounds: rounds))
                exit(0)
            } catch {
                StandardError.write("\(error)\n")
                exit(1)
            }
        }
        if arguments.first == "--child", arguments.count == 3 {
            do {
                print(try await LoadBenchmark.measure(arguments[1], arguments[2]))
                exit(0)
            } catch {
                print("\(error)")
                exit(1)
            }
        }
    }
}
