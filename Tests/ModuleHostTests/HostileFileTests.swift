import Foundation
import Glibc
import Testing
import TestSupport

/// What an operator sees for hostile plugin files: garbled offsets near 2^64 and files far
/// larger than any plugin are refused with one line, by `modhostctl` and by the daemon,
/// which keeps running; nothing traps and memory stays small.
@Suite(.timeLimit(.minutes(5)), .serialized) struct HostileFileTests {
    static let dir = TemporaryDirectory("hostile-files")
    static let good: String = {
        try! PluginFactory(directory: dir.path).buildC(
            "Hostile", source: PluginFactory.cSource(plugin: "Hostile", modules: ["hostile"]),
            manifest: PluginFactory.manifest(plugin: "Hostile", modules: ["hostile"]))
    }()

    static func refusalLines(_ result: ProcessResult) -> [String] {
        result.standardOutput.split(separator: "\n").map(String.init).filter { $0.hasPrefix("refused ") }
    }

    @Test(arguments: ELFMutation.all.filter(\.refused))
    func inspectAndVerifyRefuseAHostileFileWithOneLine(mutation: ELFMutation) throws {
        let path = try mutation.apply(to: Self.good, writingTo: Self.dir.file(mutation.fileName))
        let inspect = try run(BuildProducts.modhostctl, ["inspect", path])
        #expect(!inspect.signalled, "\(mutation): modhostctl inspect died with signal \(inspect.status)")
        #expect(inspect.status == 1, "\(mutation): \(inspect.standardOutput)\(inspect.standardError)")
        #expect(inspect.standardOutput.contains("verdict:      refused by the"), "\(inspect.standardOutput)")
        let verify = try run(BuildProducts.modhostctl, ["verify", path])
        #expect(!verify.signalled, "\(mutation): modhostctl verify died with signal \(verify.status)")
        #expect(verify.status == 1)
        let lines = Self.refusalLines(verify)
        #expect(lines.count == 1, "\(verify.standardOutput)")
        #expect(lines.first?.contains("\(path): ") == true && lines.first?.contains(". Fix: ") == true, "\(lines)")
    }

    /// A sparse file past the maximum plugin size, run under an address-space limit far below
    /// its size: refused by its size, without reading it.
    @Test(arguments: [Int64(2) << 30, Int64(8) << 30])
    func verifyRefusesAMultiGigabyteFileBySizeWithBoundedMemory(size: Int64) throws {
        let path = try Self.dir.copy(Self.good, as: "sparse\(size >> 30)g.so")
        try extendSparse(path, to: size)
        let verify = try run("/bin/bash", ["-c", "ulimit -v 1500000 && exec '\(BuildProducts.modhostctl)' verify '\(path)'"])
        #expect(!verify.signalled, "modhostctl verify died with signal \(verify.status): \(verify.standardError)")
        let lines = Self.refusalLines(verify)
        #expect(lines.count == 1, "\(verify.standardOutput)\(verify.standardError)")
        #expect(lines.first?.contains("file size check failed") == true, "\(lines)")
        #expect(lines.first?.contains("\(size) bytes") == true && lines.first?.contains("\(256 << 20) bytes") == true, "\(lines)")
    }

    @Test func verifyRefusesAHundredMegabyteManifestBySize() throws {
        let size: UInt64 = 100 << 20
        let path = try CraftedELF.withHugeManifest(Self.good, size: size, writingTo: Self.dir.file("bigmanifest.so"))
        let verify = try run("/bin/bash", ["-c", "ulimit -v 1500000 && exec '\(BuildProducts.modhostctl)' verify '\(path)'"])
        let lines = Self.refusalLines(verify)
        #expect(lines.count == 1, "\(verify.standardOutput)\(verify.standardError)")
        #expect(lines.first?.contains("manifest size check failed") == true, "\(lines)")
        #expect(lines.first?.contains("\(size) bytes") == true && lines.first?.contains("65536 bytes") == true, "\(lines)")
    }

    /// The daemon finds hostile files in its directory, refuses each with one line, keeps
    /// running, stays small and still loads the next good plugin.
    @Test func theDaemonRefusesHostileFilesAndKeepsRunning() async throws {
        let h = try DaemonLifecycleTests.Harness([])
        #expect(await h.waitFor("control socket ready"))
        var names: [String] = []
        for (index, mutation) in ELFMutation.all.filter(\.refused).enumerated() {
            let name = "libHostile\(index).so"
            try mutation.apply(to: Self.good, writingTo: Self.dir.file(name))
            try h.drop(Self.dir.file(name), as: name)
            names.append(name)
        }
        let sparse = try Self.dir.copy(Self.good, as: "libSparse.so")
        try extendSparse(sparse, to: 8 << 30)
        #expect(rename(sparse, h.plugins + "/libSparse.so") == 0)
        for name in names + ["libSparse.so"] {
            #expect(await h.waitFor("refused \(h.plugins)/\(name): "), "\(name) not refused:\n\(h.daemon.text)")
        }
        #expect(h.daemon.text.contains("\(h.plugins)/libSparse.so: file size check failed"))
        // Still alive and answering, and the next good file loads.
        try h.drop(Self.good, as: "libHostile.so")
        #expect(await h.waitFor("loaded plugin Hostile"))
        #expect(try h.ctl("list").status == 0)
        let peak = try String(contentsOfFile: "/proc/\(h.daemon.pid)/status", encoding: .utf8)
            .split(separator: "\n").first { $0.hasPrefix("VmHWM:") }
            .flatMap { Int($0.split(separator: " ")[1]) } ?? .max
        #expect(peak < 200_000, "the daemon's peak resident size is \(peak) kB")
        #expect(await h.stop() == 0)
    }

    /// The same hostile files found when the daemon starts, which loads without a trial:
    /// each is refused by the checks before dlopen, and the daemon starts. (A dynamic
    /// segment pointing outside the image crashed ld.so, and the daemon, once.)
    @Test func aDaemonStartingWithHostileFilesRefusesEachAndStarts() async throws {
        let scratch = TemporaryDirectory("hostile-start")
        let plugins = scratch.directory("plugins")
        try scratch.copy(BuildProducts.plugin("Counter"), as: "plugins/libCounter.so")
        let mutations = ELFMutation.all.filter(\.refused)
        for (index, mutation) in mutations.enumerated() {
            try mutation.apply(to: Self.good, writingTo: plugins + "/libHostile\(index).so")
        }
        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", plugins, "--state-dir", scratch.file("state"),
                                                                 "--socket", scratch.file("sock")])
        #expect(await daemon.waitFor("started 1 module: counter"), "\(daemon.text)")
        for index in mutations.indices {
            #expect(daemon.text.contains("refused \(plugins)/libHostile\(index).so: "), "\(mutations[index]) not refused:\n\(daemon.text)")
        }
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0)
    }
}
