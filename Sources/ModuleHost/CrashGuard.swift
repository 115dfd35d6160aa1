import Foundation
import Glibc
import ModuleKit
import PluginFormat
import Synchronization

/// Keeps one bad plugin from crash-looping the daemon.
///
/// Before the daemon runs a plugin's code for the first time (its entry point, its
/// modules' init), it writes what it is about to do to `inflight.json` in the state
/// directory and removes it afterwards. If the daemon dies in between,
/// the next start finds the file, records the plugin (by content hash) in `crashed.json`
/// and refuses that exact file, saying why, until a different file is deployed.
public final class CrashGuard: Sendable {
    /// One plugin that crashed the daemon.
    public struct Crash: Codable, Sendable, Equatable {
        public var file: String
        public var plugin: String
        public var hash: String
        /// "entry" or "init".
        public var phase: String
        /// When the daemon was about to run it (ISO 8601).
        public var time: String
    }

    public let directory: String
    private var inflightPath: String { directory + "/inflight.json" }
    private var crashedPath: String { directory + "/crashed.json" }
    private let crashes: Mutex<[String: Crash]>

    /// Opens the guard in `directory` (created if needed). A crash recorded by the previous
    /// run is returned by `recovered` and remembered from then on.
    public init(directory: String) throws(DaemonError) {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw DaemonError(code: "state_directory", message: "cannot create the state directory \(directory): \(error.localizedDescription). Fix: create it or pass --state-dir")
        }
        var known: [String: Crash] = [:]
        if let data = FileManager.default.contents(atPath: directory + "/crashed.json"),
           let list = try? JSONDecoder().decode([Crash].self, from: data) {
            for crash in list { known[crash.hash] = crash }
        }
        crashes = Mutex(known)
    }

    /// Reads the in-flight record a crashed run left, records it as a crash and returns it.
    public func recoverFromPreviousRun() -> Crash? {
        guard let data = FileManager.default.contents(atPath: inflightPath),
              let crash = try? JSONDecoder().decode(Crash.self, from: data) else { return nil }
        crashes.withLock { $0[crash.hash] = crash }
        persist()
        unlink(inflightPath)
        return crash
    }

    /// The recorded crash of a file with this content hash, if any.
    public func crash(forHash hash: String) -> Crash? { crashes.withLock { $0[hash] } }

    public var count: Int { crashes.withLock { $0.count } }

    /// Records on disk that the daemon is about to run `plugin`'s code in
    /// `phase`. Call `end()` when that code has returned; only a process death leaves the
    /// record behind.
    public func begin(file: String, plugin: String, hash: String, phase: String) {
        let record: JSONValue = ["file": .string(file), "plugin": .string(plugin), "hash": .string(hash),
                                 "phase": .string(phase), "time": .string(utcTimestamp())]
        write(Data(record.jsonText.utf8), to: inflightPath)
    }

    /// Clears the record `begin` wrote.
    public func end() { unlink(inflightPath) }

    private func persist() {
        let list = crashes.withLock { Array($0.values) }.sorted { $0.time < $1.time }
        write(try? JSONEncoder().encode(list), to: crashedPath)
    }

    /// Writes `data` whole: a temporary file, then a rename. No fsync: the guard protects
    /// against the daemon process dying, and what it wrote survives that in the page
    /// cache (an fsync per plugin made starting 100 plugins 10 times slower).
    private func write(_ data: Data?, to path: String) {
        guard let data else { return }
        let temporary = path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        _ = data.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
        rename(temporary, path)
    }
}

/// A short content fingerprint of a file's bytes (FNV-1a, 64 bits, hex), read in bounded
/// chunks from the open file.
func contentHash(of file: ReadOnlyFile) throws(ELFError) -> String {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    try file.forEachChunk { chunk in
        for byte in chunk {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01b3
        }
    }
    let hex = String(hash, radix: 16)
    return String(repeating: "0", count: 16 - hex.count) + hex
}

/// Now as ISO 8601 in UTC, e.g. "2026-11-29T19:08:11Z" (without Foundation's formatter,
/// which costs more than loading a plugin).
func utcTimestamp() -> String {
    var now = time(nil)
    var parts = tm()
    gmtime_r(&now, &parts)
    func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
    return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))Z"
}
