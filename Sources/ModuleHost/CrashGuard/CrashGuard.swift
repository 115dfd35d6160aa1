import DaemonKit
import Glibc
import ModuleKit
import PluginFormat
import Synchronization

/// Keeps one bad plugin from crash-looping the host process (modhostd, or a service that
/// embeds a `PluginSet`).
///
/// From the first read of a candidate file to the return of its modules' start, the
/// host keeps a record of which file it is working on, and in what phase, in
/// `inflight.json` in the state directory (validation and hashing, the private copy and
/// the trial load, the entry point, init, start). A fatal signal raised in a loaded
/// plugin's code at any later time (a thread it started, a timer, an event handler) is
/// attributed to that plugin by `FatalSignalRecorder` and written to `fatal.json`, and a
/// call of `exit()` from plugin code by `ExitGuard`. The next start reads what the
/// previous run left (the signal or exit record first, else the in-flight one), records
/// the file (by content hash, or by path and identity when it died before the hash was
/// known) in `crashed.json`, logs why, and refuses that exact file until a different file
/// is deployed.
public final class CrashGuard: Sendable {
    /// One plugin that crashed the host process.
    public struct Crash: Codable, Sendable, Equatable {
        public var file: String
        /// The plugin's name; "" when it died before the file was read far enough to know.
        public var plugin: String
        /// The file's content hash; "" when it died before the file was hashed.
        public var hash: String
        /// "validation", "copy", "entry" (dlopen and the entry point), "init", "start", or
        /// "run" (after start); "trial" for a file that crashed or hung a trial load (in a
        /// child process: the host lived on).
        public var phase: String
        /// When the host was about to run it, or died (ISO 8601).
        public var time: String
        /// What ended the process when known: a signal name ("SIGSEGV") or "exit(STATUS)";
        /// for phase "trial", how the trial ended ("signal 11 (Segmentation fault)", "timeout").
        public var cause: String?
        /// The file's identity (device, inode, size, modification time) when `hash` is "".
        public var identity: String?

        /// What the file did, e.g. "crashed the host process during init", "crashed the host
        /// process with SIGSEGV in its code", "ended the host process by calling exit(0)".
        public var what: String {
            if phase == "trial" {
                return cause == "timeout" ? "hung a trial load in a child process" : "crashed a trial load in a child process (\(cause ?? "a signal"))"
            }
            switch cause {
            case let cause? where cause.hasPrefix("exit("): return "ended the host process by calling \(cause)"
            case let cause?: return "crashed the host process with \(cause) in its code"
            case nil: return "crashed the host process during \(phase)"
            }
        }

        /// "plugin NAME", or "file PATH" when the plugin's name was not known yet.
        public var subject: String { plugin.isEmpty ? "file \(file)" : "plugin \(plugin)" }

        var key: String { hash.isEmpty ? "\(file)@\(identity ?? "")" : hash }

        public init(file: String, plugin: String, hash: String, phase: String, time: String, cause: String? = nil,
                    identity: String? = nil) {
            self.file = file
            self.plugin = plugin
            self.hash = hash
            self.phase = phase
            self.time = time
            self.cause = cause
            self.identity = identity
        }

        /// The fatal-signal recorder, which cannot format a date in a signal handler, writes
        /// `"epoch": SECONDS` instead of `"time"`; it is formatted here, by `UTCTimestamp`.
        private enum RecorderKeys: String, CodingKey { case epoch }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            file = try container.decode(String.self, forKey: .file)
            plugin = try container.decode(String.self, forKey: .plugin)
            hash = try container.decode(String.self, forKey: .hash)
            phase = try container.decode(String.self, forKey: .phase)
            cause = try container.decodeIfPresent(String.self, forKey: .cause)
            identity = try container.decodeIfPresent(String.self, forKey: .identity)
            if let text = try container.decodeIfPresent(String.self, forKey: .time) {
                time = text
            } else if let seconds = try decoder.container(keyedBy: RecorderKeys.self).decodeIfPresent(Int.self, forKey: .epoch) {
                time = UTCTimestamp.format(seconds: seconds)
            } else {
                time = ""
            }
        }
    }

    public let directory: String
    /// The largest record file read back (crashed.json lists one record, a few hundred
    /// bytes, per plugin file that crashed the host process).
    static let maximumRecordFileSize = 4 << 20
    /// Where a crash record that cannot be written is reported.
    let logger = Logger(label: "crash-guard")
    private var inflightPath: String { directory + "/inflight.json" }
    private var crashedPath: String { directory + "/crashed.json" }
    var fatalPath: String { directory + "/fatal.json" }
    private let crashes: Mutex<[String: Crash]>
    /// Room written (as spaces) into `inflight.json` and `fatal.json` when they are opened,
    /// so that a record written later over it needs no new disk space: on a full disk a
    /// crash is still recorded. A record longer than the room grows the file.
    static let reservedRecordLength = 8 << 10
    /// `fatal.json`, opened by `openFatalRecord` for the fatal-signal recorder (which keeps
    /// the descriptor for the life of the process: it is never closed), and its room.
    private let fatal = Mutex((fd: Int32(-1), room: 0))
    /// `crashed.json` when it could not be read, with what that costs: moved aside and said
    /// by `recoverFromPreviousRun` (once this process owns the directory).
    private let unreadableCrashes = Mutex<(problem: Problem, consequence: String)?>(nil)

    /// The open in-flight file, whether it holds a record, and its length.
    ///
    /// The file is never truncated while the host runs (on ext4 a truncation costs ten
    /// times a write): a record is written over the previous contents, padded with spaces
    /// to the file's length, and cleared by writing spaces over it. A file of spaces holds
    /// no record.
    private struct InFlight {
        var fd: Int32 = -1
        var holdsRecord = false
        var length = 0
        var current: Crash?
        /// The host is exiting by its own decision (`exiting()`): no record is written.
        var exiting = false
        /// The file could not be opened, and that was logged (once: it is tried again at
        /// every record).
        var openFailureLogged = false
    }
    private let inflight = Mutex(InFlight())

    /// Opens the guard in `directory` (created if needed). A crash recorded by the previous
    /// run is returned by `recovered` and remembered from then on.
    public init(directory: String) throws(PluginSetError) {
        self.directory = directory
        do throws(SystemError) {
            try FileSystem.createDirectory(directory, parents: true)
        } catch {
            throw PluginSetError(.stateDirectory, "cannot create the state directory \(directory): \(error). Fix: create it or use another state directory")
        }
        var known: [String: Crash] = [:]
        var unreadable: (problem: Problem, consequence: String)?
        switch Self.readRecord(directory + "/crashed.json", as: [Crash].self) {
        case .success(let list?):
            for crash in list { known[crash.key] = crash }
        case .success(nil):
            break
        case .failure(let problem):
            unreadable = (problem, "the files it quarantined are loaded again (until one crashes the host again)")
        }
        crashes = Mutex(known)
        unreadableCrashes.withLock { $0 = unreadable }
    }

    /// The record in the file at `path`: nil when there is none (no file, or only spaces:
    /// a cleared in-flight record), or why it cannot be read or decoded.
    private static func readRecord<T: Decodable>(_ path: String, as type: T.Type) -> Result<T?, Problem> {
        let data: [UInt8]
        do {
            data = try BoundedFile.read(path, limit: maximumRecordFileSize)
        } catch .system(let error) where error.code == ENOENT {
            return .success(nil)
        } catch {
            return .failure(Problem(path: path, reason: "\(error)"))
        }
        guard data.contains(where: { $0 != UInt8(ascii: " ") }) else { return .success(nil) }
        do {
            return .success(try JSONValue.parse(data).decode(T.self))
        } catch {
            return .failure(Problem(path: path, reason: "\(error)"))
        }
    }

    /// A record file that could not be read.
    private struct Problem: Error {
        let path: String
        let reason: String

        /// Moves the file to `PATH.unreadable` (for the operator to look at; it replaces an
        /// earlier one) and says why and where it went.
        func movedAside() -> String {
            let aside = path + ".unreadable"
            let moved = rename(path, aside) == 0
            return "the crash guard's record \(path) cannot be read (\(reason))" + (moved ? "; it was moved to \(aside)" : "")
        }
    }

    deinit {
        inflight.withLock { if $0.fd >= 0 { close($0.fd) } }
    }

    /// Reads what a crashed run left (the fatal-signal or exit record first: it names the
    /// code that failed; else the in-flight record), records it as a crash and returns it.
    /// A record that cannot be read is moved aside and logged (error level) on this guard's
    /// logger.
    public func recoverFromPreviousRun() -> Crash? { recover(logging: logger) }

    /// `recoverFromPreviousRun()`, logging on `logger`, also the crash found (error level).
    package func recoverFromPreviousRun(logging logger: Logger) {
        if let crash = recover(logging: logger) {
            // The file may hold another build by now (a replace under way when it died): what
            // is refused is that content, or that very file when it was not hashed yet.
            let refused = crash.hash.isEmpty ? "that file is refused until it changes"
                : "a file with that content (hash \(crash.hash)) is refused; a changed file is tried again"
            logger.error("\(crash.subject) \(crash.what) at \(crash.time) (file \(crash.file)); \(refused)",
                         [("plugin", crash.plugin), ("file", crash.file)])
        }
    }

    /// The recorded crash of a file with this content hash, if any.
    public func crash(forHash hash: String) -> Crash? { crashes.withLock { $0[hash] } }

    /// The recorded crash of the file at `path` with this identity, for a file that
    /// crashed the host process before it was hashed.
    func crash(forFile path: String, identity: String) -> Crash? {
        crashes.withLock { $0["\(path)@\(identity)"] }
    }

    public var count: Int { crashes.withLock { $0.count } }

    /// What the host is working on now, if anything.
    var current: Crash? { inflight.withLock { $0.current } }

    /// Records on disk that the host is about to work on `file` (`plugin`'s code, or the
    /// file's bytes) in `phase`. Call `end()` when that is over; only a process death
    /// leaves the record behind. One write on a file kept open here, one in `end`; a
    /// `begin` without `end` in between replaces the record with that one write.
    public func begin(file: String, plugin: String, hash: String, phase: String, identity: String? = nil) {
        let crash = Crash(file: file, plugin: plugin, hash: hash, phase: phase, time: UTCTimestamp.now(), identity: identity)
        var fields: [String: JSONValue] = ["file": .string(file), "plugin": .string(plugin), "hash": .string(hash),
                                           "phase": .string(phase), "time": .string(crash.time)]
        if let identity { fields["identity"] = .string(identity) }
        let text = JSONValue.object(fields).jsonText
        var bytes = Array(text.utf8)
        inflight.withLock { state in
            guard !state.exiting else { return }
            if state.fd < 0 {
                state.fd = open(inflightPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
                guard state.fd >= 0 else {
                    let problem = SystemError.current("open").message
                    if !state.openFailureLogged {
                        logger.error("cannot open \(inflightPath): \(problem); a plugin that crashes the host while it is loaded or started will not be quarantined at the next start",
                                     [("file", inflightPath)])
                    }
                    state.openFailureLogged = true
                    return
                }
                reserveRoom(state.fd, inflightPath)
            }
            // Over a longer previous record, the rest is blanked in the same write.
            if bytes.count < state.length { bytes += repeatElement(UInt8(ascii: " "), count: state.length - bytes.count) }
            _ = bytes.withUnsafeBytes { pwrite(state.fd, $0.baseAddress, $0.count, 0) }
            state.length = bytes.count
            state.holdsRecord = true
            state.current = crash
        }
    }

    /// Runs `body` between `begin` and `end`.
    func during<T, E: Error>(file: String, plugin: String, hash: String, phase: String, identity: String? = nil,
                             _ body: () throws(E) -> T) throws(E) -> T {
        begin(file: file, plugin: plugin, hash: hash, phase: phase, identity: identity)
        defer { end() }
        return try body()
    }

    /// Clears the record `begin` wrote (spaces over it).
    public func end() {
        inflight.withLock { Self.clear(&$0) }
    }

    private static func clear(_ state: inout InFlight) {
        if state.holdsRecord {
            let blank = [UInt8](repeating: UInt8(ascii: " "), count: state.length)
            _ = blank.withUnsafeBytes { pwrite(state.fd, $0.baseAddress, $0.count, 0) }
        }
        state.holdsRecord = false
        state.current = nil
    }

    /// The host is ending itself (a shutdown, also one whose budget ran out with plugin code
    /// still running): clears the in-flight record and writes none from now on, so the next
    /// start does not take the exit for a crash of the plugin that was being worked on.
    func exiting() {
        inflight.withLock { state in
            state.exiting = true
            Self.clear(&state)
        }
    }

    /// Records that `file` (with content `hash`) crashed or hung a trial load (`ending`), in
    /// `crashed.json`: a start loads without a trial, and must refuse it as well.
    func recordTrialFailure(file: String, plugin: String, hash: String, ending: String) {
        let crash = Crash(file: file, plugin: plugin, hash: hash, phase: "trial", time: UTCTimestamp.now(), cause: ending)
        crashes.withLock { $0[crash.key] = crash }
        persist()
    }

    /// `recoverFromPreviousRun()`, logging each record that could not be read on `logger`.
    private func recover(logging logger: Logger) -> Crash? {
        var unreadable: [(problem: Problem, consequence: String)] = []
        if let crashes = unreadableCrashes.withLock({ state in defer { state = nil }; return state }) { unreadable.append(crashes) }
        func read(_ path: String) -> Crash? {
            switch Self.readRecord(path, as: Crash.self) {
            case .success(let crash):
                return crash
            case .failure(let problem):
                unreadable.append((problem, "the crash it records, if any, is not pinned on a file"))
                return nil
            }
        }
        let found = read(fatalPath) ?? read(inflightPath)
        // Moved aside only now: this process owns the directory (a second daemon that will
        // exit as already running has read them, but changes nothing).
        for (problem, consequence) in unreadable {
            logger.error("\(problem.movedAside()): \(consequence). Fix: find what else writes in the state directory \(directory); only modhostd should")
        }
        unlink(fatalPath)
        unlink(inflightPath)
        guard let crash = found else { return nil }
        crashes.withLock { $0[crash.key] = crash }
        persist()
        return crash
    }

    /// Writes `crash` as the record the next start reads first (for an exit from plugin
    /// code; a fatal signal is written by `FatalSignalRecorder`'s handler): over the room
    /// of the open `fatal.json` when there is one, which needs no new disk space.
    func recordFatal(_ crash: Crash) {
        let fd = fatal.withLock { $0.fd }
        guard fd >= 0, let text = try? JSONValue(encoding: crash).jsonText else { return write(crash, to: fatalPath) }
        let bytes = Array((text + "\n").utf8)
        if bytes.withUnsafeBytes({ pwrite(fd, $0.baseAddress, $0.count, 0) }) != bytes.count {
            logger.error("cannot record a crash in \(fatalPath): \(SystemError.current("pwrite").message); the plugin will not be quarantined at the next start unless it crashes again",
                         [("file", fatalPath)])
        }
    }

    /// Opens `fatal.json` empty, with room for one record, for the fatal-signal recorder:
    /// its descriptor, kept open for the life of the process, or why it cannot.
    func openFatalRecord() -> Result<Int32, SystemError> {
        let fd = open(fatalPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { return .failure(.current("open", subject: fatalPath)) }
        let room = reserveRoom(fd, fatalPath)
        fatal.withLock { $0 = (fd, room) }
        return .success(fd)
    }

    /// Makes sure `fatal.json` has room for a record of `length` bytes (a plugin's record,
    /// and what the signal handler adds to it).
    func reserveFatalRecord(length: Int) {
        let (fd, room) = fatal.withLock { $0 }
        guard fd >= 0, length > room else { return }
        let grown = reserveRoom(fd, fatalPath, length: length)
        fatal.withLock { $0.room = max($0.room, grown) }
    }

    /// Writes `length` spaces at the start of `fd` (the file at `path`): the room later
    /// records are written over. Returns the room made; a failure is logged.
    @discardableResult
    private func reserveRoom(_ fd: Int32, _ path: String, length: Int = reservedRecordLength) -> Int {
        let spaces = [UInt8](repeating: UInt8(ascii: " "), count: length)
        if spaces.withUnsafeBytes({ pwrite(fd, $0.baseAddress, $0.count, 0) }) == length { return length }
        logger.error("cannot make room for the crash guard's record in \(path): \(SystemError.current("pwrite").message); a plugin that crashes the host may not be quarantined at the next start. Fix: free space in \(directory)",
                     [("file", path)])
        return 0
    }

    /// The most records `crashed.json` keeps for one path: a path whose contents keep
    /// crashing (a deploy loop, a fuzzer) keeps its newest, and the file stays far below
    /// what is read back (`maximumRecordFileSize`).
    static let recordsPerPath = 8
    /// The most records `crashed.json` keeps in all, the newest.
    static let recordsInAll = 1024

    /// Writes the records to `crashed.json`, oldest first, having forgotten the oldest past
    /// `recordsPerPath` for a path and `recordsInAll` in all: a file content forgotten is
    /// loaded again if it comes back, and quarantined again if it crashes again.
    private func persist() {
        let list = crashes.withLock { crashes -> [Crash] in
            var kept: [Crash] = []
            for (_, records) in Dictionary(grouping: crashes.values, by: \.file) {
                kept += records.sorted { $0.time > $1.time }.prefix(Self.recordsPerPath)
            }
            kept = Array(kept.sorted { $0.time > $1.time }.prefix(Self.recordsInAll))
            if kept.count < crashes.count {
                crashes = Dictionary(kept.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
            }
            return kept.reversed()
        }
        write(list, to: crashedPath)
    }

    /// Replaces the file at `path` with `value` as JSON (`AtomicFile`); a failure is
    /// logged, since a crash record that could not be kept means the plugin is not
    /// quarantined at the next start.
    private func write(_ value: some Encodable, to path: String) {
        do {
            let text = try JSONValue(encoding: value).jsonText
            try AtomicFile.write(Array(text.utf8), to: path, mode: 0o600)
        } catch {
            logger.error("cannot record a crash in \(path): \(error); the plugin will not be quarantined at the next start unless it crashes again",
                         [("file", path)])
        }
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
