import Foundation
import Glibc
import ModuleHost
import ModuleKit
import Synchronization
import TestSupport

/// Discover + validate + load + register per plugin, for N generated trivial C plugins,
/// against a plain loop of dlopen + dlsym over a copy of the same files in the same run.
///
/// Two copies of every file: glibc returns an already-loaded image for a path (and for the
/// same file) it has seen, so each side must open files nobody opened before.
/// `internal.` rows: they time a `PluginSet`'s first reconcile, modhostd's start without
/// the daemon around it (peer.start_to_ready times the daemon's own start).
struct LoadBenchmark {
    let sdk: String
    let work: String
    let sizes = [10, 100, 1000]

    /// Each measurement runs in a fresh child process (this executable with `--child`),
    /// so that neither side pays for images the other loaded: glibc compares every new
    /// path with every image already loaded. Host and baseline alternate, seven times
    /// each; the fastest run of each counts (the least disturbed by other processes on
    /// the machine).
    func run() throws -> [BenchRow] {
        let total = sizes.reduce(0, +)
        try generate(count: total)
        var rows: [BenchRow] = []
        var perPlugin: [Int: Double] = [:]
        var offset = 0
        for size in sizes {
            let dir = work + "/set-\(size)"
            try? FileManager.default.removeItem(atPath: dir)
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            chmod(dir, 0o755)
            for index in offset..<offset + size {
                let name = String(format: "libP%05d.so", index)
                try FileManager.default.copyItem(atPath: work + "/src/" + name, toPath: dir + "/" + name)
            }
            offset += size
            try shell("cat '\(dir)'/*.so > /dev/null")  // page cache warm
            var host: [Double] = [], baseline: [Double] = []
            for _ in 0..<7 {
                baseline.append(try child("baseline", dir))
                host.append(try child("host", dir))
            }
            let hostMicros = host.min()! / Double(size) * 1e6, baseMicros = baseline.min()! / Double(size) * 1e6
            perPlugin[size] = hostMicros
            rows.append(BenchRow(
                name: "internal.load.per_plugin.n\(size)", value: hostMicros, unit: "us", baseline: baseMicros,
                baselineDescription: "dlopen(RTLD_NOW)+dlsym per plugin over the same files, fresh process each, best of 7; value: a PluginSet's first reconcile without trial loads (checks, private copy, dlopen, entry point, registry, module create and init), as modhostd starts (report only: the work a start must do against modhostd's full start is peer.start_to_ready_vs_floor)",
                target: nil))
        }
        rows.append(BenchRow(
            name: "internal.load.per_plugin.flatness_n1000_vs_n100", value: perPlugin[1000]!, unit: "us", baseline: perPlugin[100]!,
            baselineDescription: "the host's own per-plugin cost at N=100", target: 1.3))
        return rows
    }

    /// Runs one side in a child process and returns the seconds it reports.
    func child(_ side: String, _ dir: String) throws -> Double {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
        process.arguments = ["--child", "load-\(side)", dir]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0, let value = Double(output.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw NSError(domain: "bench", code: 3, userInfo: [NSLocalizedDescriptionKey: "child \(side) failed: \(output)"])
        }
        return value
    }

    /// The child's side of `child`: load every plugin of `dir` and print the seconds taken.
    static func measure(_ side: String, _ dir: String) async throws -> Double {
        switch side {
        case "load-baseline":
            return try plainLoop(dir)
        case "load-baseline-busy":
            // Diagnosis only: the baseline while another thread of this process runs (spins,
            // with no system call); a thread that sleeps, or a busy other process, costs the
            // loop nothing. Why the plugin set checks files before it opens plugins rather
            // than beside.
            let spinner = Spinner()
            Thread.detachNewThread { spinner.spin() }
            defer { spinner.stop() }
            return try plainLoop(dir)
        case "load-host":
            // The host reads its own directory listing: discovery is part of its cost.
            return try await startupLoad(dir)
        case "load-phases":
            // Diagnosis only: where the time of the checks, dlopen and registry goes, printed
            // to stderr (a plugin set also copies each file and creates its modules).
            let loader = PluginLoader()
            let registry = ModuleRegistry()
            var plan = PluginPlan(directories: [], validator: Validator())
            let planning = seconds { plan = PluginPlan(directories: [dir], validator: Validator()) }
            var opening = 0.0, registering = 0.0
            for file in plan.ordered {
                let start = monotonicNanoseconds()
                let plugin = try loader.open(file)
                let mid = monotonicNanoseconds()
                try registry.register(plugin)
                let end = monotonicNanoseconds()
                opening += Double(mid - start) / 1e9
                registering += Double(end - mid) / 1e9
            }
            let n = Double(plan.ordered.count)
            StandardError.write(String(format: "plan (checks and order) %.1f us, open (dlopen, entry, descriptor) %.1f us, register %.1f us per plugin\n",
                                       planning / n * 1e6, opening / n * 1e6, registering / n * 1e6))
            return planning + opening + registering
        case "load-warm":
            // Diagnosis only: `WARM:DIR` first does WARM (untimed), then times the load of DIR,
            // so that the difference with load-host on DIR is what a process pays the first
            // time it loads anything. WARM is a plugin directory (loaded), `validate=DIR`
            // (only validated) or `spin` (3 ms of busy waiting: the CPU alone warmed up).
            // MODHOST_BENCH_WARM_SIDE=load-phases times DIR by phase instead.
            let parts = dir.split(separator: ":").map(String.init)
            guard parts.count == 2 else {
                throw NSError(domain: "bench", code: 4, userInfo: [NSLocalizedDescriptionKey: "load-warm takes WARM:DIR"])
            }
            if parts[0] == "spin" {
                let end = monotonicNanoseconds() + 3_000_000
                while monotonicNanoseconds() < end {}
            } else if parts[0].hasPrefix("validate=") {
                _ = PluginPlan(directories: [String(parts[0].dropFirst("validate=".count))], validator: Validator())
            } else {
                _ = try await startupLoad(parts[0])
            }
            return try await measure(ProcessInfo.processInfo.environment["MODHOST_BENCH_WARM_SIDE"] ?? "load-host", parts[1])
        case "load-validate":
            // Diagnosis only: the checks before dlopen, without loading.
            return seconds { _ = PluginPlan(directories: [dir], validator: Validator()) }
        default:
            throw NSError(domain: "bench", code: 4, userInfo: [NSLocalizedDescriptionKey: "unknown child \(side)"])
        }
    }

    /// Loads every plugin of `dir` as modhostd's start does (a `PluginSet`'s first
    /// `reconcile`, without trial loads, on a fresh state directory) and returns the seconds
    /// the reconcile took; the set is shut down afterwards, untimed. Throws when a file is
    /// refused.
    static func startupLoad(_ dir: String) async throws -> Double {
        // Warnings and errors only: an info line per plugin would time the terminal.
        LoggingSystem.setLevel(.warning)
        let state = TemporaryDirectory("bench-load-state")
        let set = try PluginSet(host: HostInstance(name: "bench-load"), directories: [dir], stateDirectory: state.file("state"),
                                trialLoader: nil)
        let start = monotonicNanoseconds()
        let changes = await set.reconcile(trial: false)
        let elapsed = Double(monotonicNanoseconds() - start) / 1e9
        let refused = await set.snapshot().files.first
        await set.shutdown()
        if let refused {
            throw NSError(domain: "bench", code: 2, userInfo: [NSLocalizedDescriptionKey: "\(refused.failure)"])
        }
        guard !changes.added.isEmpty else {
            throw NSError(domain: "bench", code: 2, userInfo: [NSLocalizedDescriptionKey: "no plugin loaded from \(dir)"])
        }
        return elapsed
    }

    /// The baseline: dlopen(RTLD_NOW) + dlsym of every `.so` of `dir`, in name order.
    static func plainLoop(_ dir: String) throws -> Double {
        let names = try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".so") }.sorted()
        return try seconds {
            for name in names {
                guard let handle = dlopen(dir + "/" + name, RTLD_NOW | RTLD_LOCAL),
                      dlsym(handle, "modhost_plugin_entry_v1") != nil
                else { throw NSError(domain: "bench", code: 1, userInfo: [NSLocalizedDescriptionKey: String(cString: dlerror())]) }
            }
        }
    }

    /// A thread that busy-waits until stopped (for `load-baseline-busy`).
    final class Spinner: Sendable {
        private let stopped = Atomic<Bool>(false)
        func spin() { while !stopped.load(ordering: .relaxed) {} }
        func stop() { stopped.store(true, ordering: .relaxed) }
    }

    /// Compiles `count` trivial C plugins (one module each, manifest embedded) into
    /// work/src, two at a time, unless they are already there.
    func generate(count: Int) throws {
        let src = work + "/src"
        let marker = src + "/.complete-\(count)"
        if FileManager.default.fileExists(atPath: marker) { return }
        try? FileManager.default.removeItem(atPath: src)
        try FileManager.default.createDirectory(atPath: src, withIntermediateDirectories: true)
        var makefile = "all:"
        for index in 0..<count { makefile += String(format: " libP%05d.so", index) }
        makefile += "\n\n"
        for index in 0..<count {
            let name = String(format: "P%05d", index)
            let module = name.lowercased()
            let source = """
                #include <modulehost.h>
                static void *create(const modhost_host_api *h, const char *c) { (void)c; return (void *)h; }
                static void handle(void *i, const char *e, const char *p) { (void)i; (void)e; (void)p; }
                static void destroy(void *i) { (void)i; }
                static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "\(module)", "1.0",
                    0, create, handle, destroy, 0 }};
                static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(name)", modules);
                MODHOST_PLUGIN_ENTRY { return &plugin; }
                """
            try source.write(toFile: src + "/\(name).c", atomically: false, encoding: .utf8)
            let manifest = """
                {"name":"\(name)","version":"1.0","description":"generated","abi":"1.0","language":"c","order":\(index),"modules":["\(module)"]}
                """
            try manifest.write(toFile: src + "/\(name).json", atomically: false, encoding: .utf8)
            makefile += "lib\(name).so: \(name).c \(name).json\n"
            makefile += "\tcc -O2 -fPIC -shared -fvisibility=hidden -I\(sdk)/include -Wl,-soname,lib\(name).so -Wl,-z,nodelete \(name).c -o \(name).tmp.so"
            makefile += " && objcopy --add-section .modhost.manifest=\(name).json --set-section-flags .modhost.manifest=readonly \(name).tmp.so $@ && rm \(name).tmp.so\n"
        }
        try makefile.write(toFile: src + "/Makefile", atomically: false, encoding: .utf8)
        try shell("make -s -j2 -C '\(src)'")
        _ = FileManager.default.createFile(atPath: marker, contents: nil)
    }
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
}
