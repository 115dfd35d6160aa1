import DaemonKit
import Foundation
import Glibc
import ModuleKit
import TestSupport

/// Hot replace as operators see it, on a release modhostd: a Swift plugin replaced under a
/// running dependent against a fresh add of the same plugin, and what 1,000 replaces of one
/// plugin leave behind in the daemon (memory, mappings, files in the state directory).
struct ReplaceBenchmark {
    let sdk: String
    let work: String
    /// The generated trivial C plugins of the load benchmark (work/load/src).
    let plugins: String
    /// Replace cycles for the leftover rows.
    var cycles = 1000

    func run() async throws -> [BenchRow] {
        var rows = try await swiftReplaceUnderDependent()
        rows += try await leftovers(plugin: "P00200", file: plugins + "/libP00200.so", label: "c")
        rows += try await leftovers(plugin: "Greeting", file: sdk + "/plugins/libGreeting.so", label: "swift")
        return rows
    }

    // MARK: replace under a dependent

    /// 20 fresh adds of Greeting (each removed again), then Welcome on top of it and 20
    /// replaces of Greeting by a new version: drop to the log line that the new version
    /// runs, which the daemon writes once the dependent has been restarted too.
    func swiftReplaceUnderDependent() async throws -> [BenchRow] {
        let root = try fresh("swift-replace")
        let daemon = try DaemonProcess(sdk: sdk, root: root, pluginDirectory: root + "/plugins")
        defer { daemon.stop() }
        guard await daemon.waitForLine(containing: "control socket ready", after: 0) != nil else { throw failure("daemon did not start") }
        let greeting = sdk + "/plugins/libGreeting.so"
        let target = root + "/plugins/libGreeting.so"

        var adds: [Double] = []
        for _ in 0..<20 {
            let start = try drop(greeting, as: target)
            guard let seen = await daemon.waitForLine(containing: "loaded plugin Greeting ", after: start) else {
                throw failure("Greeting was not loaded:\n\(daemon.tail)")
            }
            adds.append(Double(seen - start) / 1e6)
            let removal = monotonicNanoseconds()
            unlink(target)
            guard await daemon.waitForLine(containing: "removed plugin Greeting", after: removal) != nil else {
                throw failure("Greeting was not removed:\n\(daemon.tail)")
            }
        }

        var start = try drop(greeting, as: target)
        _ = try drop(sdk + "/plugins/libWelcome.so", as: root + "/plugins/libWelcome.so")
        guard await daemon.waitForLine(containing: "loaded plugin Welcome ", after: start) != nil else {
            throw failure("Welcome was not loaded:\n\(daemon.tail)")
        }
        var replaces: [Double] = []
        for minor in 1...20 {
            let version = "1.\(minor).0"
            let next = try withVersion(greeting, version, in: root)
            start = try drop(next, as: target)
            guard let seen = await daemon.waitForLine(containing: "replaced plugin Greeting ", after: start),
                  await daemon.waitForLine(containing: "by \(version) ", after: start) == seen else {
                throw failure("replacement by \(version) not seen:\n\(daemon.tail)")
            }
            replaces.append(Double(seen - start) / 1e6)
        }
        let what = "drop of a new Greeting (Swift) under its running dependent Welcome to the log line that the new version runs (Welcome restarted against it)"
        return [
            BenchRow(name: "replace.swift_with_dependent.p50", value: percentile(replaces, 0.5), unit: "ms",
                     baseline: percentile(adds, 0.5),
                     baselineDescription: "p50 of 20 fresh adds of the same plugin in the same daemon; value: p50 of 20 × " + what,
                     target: 1.5),
            BenchRow(name: "replace.swift_with_dependent.p99", value: percentile(replaces, 0.99), unit: "ms",
                     baseline: percentile(adds, 0.99),
                     baselineDescription: "p99 of the same 20 fresh adds; value: p99 of the same 20 replaces", target: 1.5),
        ]
    }

    // MARK: what replaces leave behind

    /// `cycles` replaces of one plugin, alone in a daemon: RSS and mappings per cycle
    /// (reported against one fresh daemon's figure), and files left in the state directory.
    /// `configuration`: the daemon's configuration file, if any. `warmUp` replaces (of the
    /// same versions) go first, and the RSS they add is a row of its own: what the daemon
    /// grows by before it reaches its working size (caches that fill up to a bound) is not a
    /// residue of each replace, and the per-replace rows count from there.
    func leftovers(plugin: String, file: String, label: String, configuration: String? = nil, warmUp: Int = 0) async throws -> [BenchRow] {
        let root = try fresh("leftovers-" + label)
        // What each replace leaves is measured over more replaces than retiredImageLimit's
        // default: the daemon must not execute itself again meanwhile (replace.c.rss_after_10000
        // measures that).
        let configuration = configuration ?? #"{"retiredImageLimit": 100000}"#
        try configuration.write(toFile: root + "/modhostd.json", atomically: true, encoding: .utf8)
        let arguments = ["--config", root + "/modhostd.json"]
        let versions = root + "/versions"
        try FileManager.default.createDirectory(atPath: versions, withIntermediateDirectories: true)
        var variants: [(version: String, path: String)] = []
        for cycle in 1...cycles {
            let version = "1.\(cycle).0"
            variants.append((version, try withVersion(file, version, in: versions)))
        }
        let daemon = try DaemonProcess(sdk: sdk, root: root, pluginDirectory: root + "/plugins", arguments: arguments)
        defer { daemon.stop() }
        guard await daemon.waitForLine(containing: "control socket ready", after: 0) != nil else { throw failure("daemon did not start") }
        let target = root + "/plugins/" + PathText.lastComponent(of: file)
        var start = try drop(file, as: target)
        guard await daemon.waitForLine(containing: "loaded plugin \(plugin) ", after: start) != nil else {
            throw failure("\(plugin) was not loaded:\n\(daemon.tail)")
        }
        let loaded = try memory(of: daemon.pid)
        for index in 0..<warmUp {
            let variant = variants[index % variants.count]
            start = try drop(variant.path, as: target)
            guard await daemon.waitForLine(containing: "by \(variant.version) (generation", after: start) != nil else {
                throw failure("warm-up replacement by \(variant.version) not seen:\n\(daemon.tail)")
            }
        }
        let before = try memory(of: daemon.pid)
        // Sampled every tenth of the run: growth that stops (the allocator and caches
        // reaching their working size) and growth that goes on (a residue per replace)
        // look alike over the whole run, and differ over its second half.
        // With the daemon's thread count: a thread libdispatch adds under load brings its
        // own caches and malloc arena, a step in RSS (and mappings) that is not a replace's.
        var samples: [(cycle: Int, rssKiB: Int, threads: Int)] = [(0, before.rssKiB, before.threads)]
        let every = max(1, cycles / 10)
        for (index, variant) in variants.enumerated() {
            start = try drop(variant.path, as: target)
            guard await daemon.waitForLine(containing: "by \(variant.version) (generation", after: start) != nil else {
                throw failure("replacement by \(variant.version) not seen:\n\(daemon.tail)")
            }
            if (index + 1) % every == 0 { let now = try memory(of: daemon.pid); samples.append((index + 1, now.rssKiB, now.threads)) }
        }
        let after = try memory(of: daemon.pid)
        let half = samples.first { $0.cycle >= cycles / 2 } ?? samples[0]
        let secondHalf = Double(max(1, cycles - half.cycle))
        let trace = samples.map { "\($0.cycle): \($0.rssKiB)" }.joined(separator: ", ")
            + "; daemon threads " + samples.map { String($0.threads) }.joined(separator: ",")
        let images = (try? FileManager.default.contentsOfDirectory(atPath: root + "/state/images")) ?? []
        let perCycle = Double(cycles)
        let warmUpRows = warmUp == 0 ? [] : [
            BenchRow(name: "replace.\(label).rss_warm_up", value: Double(before.rssKiB - loaded.rssKiB), unit: "KiB",
                     baseline: Double(loaded.rssKiB),
                     baselineDescription: "RSS of the daemon with the plugin loaded once; value: RSS added by the first \(warmUp) replaces, before the rows per replace start counting, and \(before.mappings - loaded.mappings) mappings (report only; libdispatch's per-thread caches of work items fill up to their bound, 1,024 items of 64 bytes a thread)",
                     target: nil),
        ]
        let counted = warmUp == 0 ? "" : " and replaced \(warmUp) times (warm-up)"
        return warmUpRows + [
            BenchRow(name: "replace.\(label).rss_per_cycle", value: Double(after.rssKiB - before.rssKiB) / perCycle, unit: "KB",
                     baseline: Double(before.rssKiB),
                     baselineDescription: "RSS of the daemon with the plugin loaded once\(counted); value: RSS growth per replace over \(cycles) replaces (report only)",
                     target: nil),
            BenchRow(name: "replace.\(label).rss_per_cycle.second_half", value: Double(after.rssKiB - half.rssKiB) / secondHalf, unit: "KB",
                     baseline: Double(half.rssKiB),
                     baselineDescription: "RSS after \(half.cycle) replaces; value: RSS growth per replace over the last \(cycles - half.cycle) (report only; RSS in KiB after n replaces: \(trace))",
                     target: nil),
            BenchRow(name: "replace.\(label).mappings_per_cycle", value: Double(after.mappings - before.mappings) / perCycle, unit: "n",
                     baseline: Double(before.mappings),
                     baselineDescription: "mappings of the daemon with the plugin loaded once\(counted); value: new mappings per replace over \(cycles) replaces (report only)",
                     target: nil),
            BenchRow(name: "replace.\(label).state_files_left", value: Double(images.count), unit: "n", baseline: 1,
                     baselineDescription: "plugins loaded; value: files in state/images after \(cycles) replaces (target: the loaded plugin's own copy, none per replace)",
                     target: 1),
        ]
    }

    // MARK: helpers

    /// Copies `source` next to `target` under a dot name, then renames it in, as an
    /// installer does; returns when the rename happened.
    func drop(_ source: String, as target: String) throws -> UInt64 {
        let temporary = PathText.parent(of: target) + "/." + PathText.lastComponent(of: target) + ".tmp"
        unlink(temporary)
        try FileManager.default.copyItem(atPath: source, toPath: temporary)
        let start = monotonicNanoseconds()
        guard rename(temporary, target) == 0 else { throw failure("rename to \(target) failed") }
        return start
    }

    /// A copy of plugin `file` whose embedded manifest says `version` (the same code).
    func withVersion(_ file: String, _ version: String, in directory: String) throws -> String {
        let manifest = try PluginFactory.embeddedManifest(file)
        guard case .object(var object) = try JSONValue.parse(Array(manifest.utf8)) else {
            throw failure("the manifest of \(file) is not an object")
        }
        object["version"] = .string(version)
        let manifestFile = directory + "/manifest-\(version).json"
        try JSONValue.object(object).jsonText.write(toFile: manifestFile, atomically: true, encoding: .utf8)
        let output = directory + "/" + version + "-" + PathText.lastComponent(of: file)
        try shell("objcopy --update-section .modhost.manifest='\(manifestFile)' '\(file)' '\(output)'")
        return output
    }

    /// Resident memory (`ProcessMemory`), mapping count and thread count of process `pid`.
    func memory(of pid: Int32) throws -> (rssKiB: Int, mappings: Int, threads: Int) {
        guard let bytes = ProcessMemory.residentBytes(pid: pid), let mappings = ProcessMemory.mappings(pid: pid) else {
            throw failure("cannot read the memory of pid \(pid) from /proc")
        }
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("Threads:") }),
              let threads = Int(line.dropFirst("Threads:".count).trimmingCharacters(in: .whitespaces)) else {
            throw failure("no Threads for pid \(pid)")
        }
        return (Int(bytes / 1024), mappings, threads)
    }

    func fresh(_ name: String) throws -> String { try freshDirectory(work + "/" + name) }
}
