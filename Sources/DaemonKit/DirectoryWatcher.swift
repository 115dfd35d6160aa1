#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// One change a `DirectoryWatcher` reports.
public struct DirectoryChange: Hashable, Sendable, CustomStringConvertible {
    /// What happened.
    public enum Kind: Hashable, Sendable {
        /// A file is complete at `path`: it was closed after writing (`IN_CLOSE_WRITE`) or
        /// renamed into the directory (`IN_MOVED_TO`). Never sent for a file that is still
        /// being written (no `IN_CREATE`).
        case ready
        /// The file at `path` is gone: deleted (`IN_DELETE`) or renamed away
        /// (`IN_MOVED_FROM`, also when renamed to an ignored name).
        case removed
        /// The watched directory itself is gone (deleted, moved away or unmounted:
        /// `IN_DELETE_SELF`, `IN_MOVE_SELF`, `IN_IGNORED`), or, for a directory passed to
        /// `follow(_:)` whose path ends in a symbolic link, that link was removed, renamed
        /// away or replaced (its path no longer leads to the directory watched). `path` is
        /// the directory. The watcher no longer watches it; call `watch(_:)` again once it
        /// exists. A directory passed to `follow(_:)` is watched again by itself (see
        /// `.directoryAppeared`: a replaced link reports it at once, with its new target).
        case directoryRemoved
        /// A directory passed to `follow(_:)` that was missing (never there, or removed)
        /// exists again and is watched from now on. `path` is the directory. Files put into it
        /// before the watch was in place are not reported: scan it.
        case directoryAppeared
        /// The mode, owner or other attributes of the file at `path` changed (`IN_ATTRIB`,
        /// e.g. `chmod`, `chown`, `touch`), or, with `path` equal to `directory`, those of
        /// the watched directory itself. Also sent while a file is being written (`install`
        /// sets the mode before it closes the file): whoever acts on it checks the file.
        case attributesChanged
        /// The kernel's event queue overflowed (`IN_Q_OVERFLOW`); events were lost. `path` and
        /// `directory` are empty. Rescan every directory.
        case overflow
    }

    /// What happened.
    public var kind: Kind
    /// `directory + "/" + name` for file changes; the directory for `.directoryRemoved`.
    public var path: String
    /// The watched directory, exactly as passed to `watch(_:)` (trailing slashes removed).
    public var directory: String

    /// Creates a change; the watcher is the usual source of these.
    public init(kind: Kind, path: String, directory: String) {
        self.kind = kind
        self.path = path
        self.directory = directory
    }

    /// The last path component (the file name).
    public var name: String {
        guard let slash = path.lastIndex(of: "/") else { return path }
        return String(path[path.index(after: slash)...])
    }

    /// `kind path`, e.g. `ready /plugins/a.so`.
    public var description: String { "\(kind) \(path)" }
}

/// Watches directories with inotify and reports complete files, removals and vanished
/// directories, in coalesced batches.
///
/// Guarantees:
/// - A file is reported `.ready` only on `IN_CLOSE_WRITE` or `IN_MOVED_TO`, never on
///   `IN_CREATE`, so a half-copied file is never reported (a copy is written after its
///   `IN_CREATE`). A symbolic link is complete when created, so its `IN_CREATE` reports
///   it `.ready`.
/// - A directory given to `follow(_:)` stays followed: while it is missing, its nearest
///   existing ancestor is watched for it to appear (as a path is recreated one level at a
///   time, or as a symlink to a directory), and it is watched again as soon as it exists
///   (`.directoryAppeared`). When its path ends in a symlink, the directory holding the
///   link is watched too: removing, renaming or replacing the link reports the directory
///   `.directoryRemoved` (and `.directoryAppeared` where the path leads to a directory
///   again), although the directory the link led to did not change. Symlinks earlier in
///   the path are not watched.
/// - Names for which `Configuration.isIgnored` is true (by default dotfiles, `*.tmp`, `*~`,
///   `*.part`; see `isIgnoredName(_:)`) and subdirectories are never reported, except
///   that renaming a file to an ignored name reports its old name `.removed`.
/// - The first change after a quiet time (no batch emitted for `settle`) is emitted at once,
///   with whatever arrived with it: a file renamed into a quiet directory is reported
///   without waiting. Later changes of a burst are coalesced: a batch is emitted once no
///   event arrived for `settle`, or at the latest `maximumDelay` after the first event of
///   the batch. Within a batch each path appears once with the kind of its last event;
///   changes are ordered by their last event.
/// - `changes` is single-consumer, unbounded, and finishes after `stop()` (or deinit).
/// - The inotify descriptor is read on a dedicated thread, never on the cooperative pool.
///
/// Not reported: the state before `watch(_:)`; callers scan the directory after watching
/// it (watch first, then scan, so nothing falls between the two).
public final class DirectoryWatcher: Sendable {
    /// Tuning for a watcher.
    public struct Configuration: Sendable {
        /// Quiet time after the last event before a batch of a burst is emitted, and how
        /// long after a batch the next change counts as a burst's. Default 10 ms: the events
        /// trusted here already mean "complete", so the window only has to merge a burst
        /// (`cp *.so`, `rsync`); the first change after a quiet time does not wait for it.
        public var settle: Duration
        /// Upper bound on how long an event waits in a batch while events keep coming.
        /// Default 250 ms. Never less than `settle`.
        public var maximumDelay: Duration
        /// Names (last path component) never reported. Default `isIgnoredName(_:)`.
        public var isIgnored: @Sendable (String) -> Bool

        /// Creates a configuration; see the properties for the defaults.
        public init(
            settle: Duration = .milliseconds(10), maximumDelay: Duration = .milliseconds(250),
            isIgnored: @escaping @Sendable (String) -> Bool = DirectoryWatcher.isIgnoredName
        ) {
            self.settle = settle
            self.maximumDelay = max(maximumDelay, settle)
            self.isIgnored = isIgnored
        }
    }

    /// The batches of changes, in the order they happened. Iterate from one task.
    public let changes: AsyncStream<[DirectoryChange]>
    private let core: WatcherCore

    /// Creates a watcher with no directories and starts its reader thread.
    public init(configuration: Configuration = Configuration()) throws(SystemError) {
        let (stream, continuation) = AsyncStream.makeStream(of: [DirectoryChange].self)
        changes = stream
        core = try WatcherCore(configuration: configuration, continuation: continuation)
        let core = self.core
        do throws(SystemError) {
            try startThread(name: "dk-inotify") { core.run() }
        } catch {
            core.close()
            throw error
        }
    }

    /// Creates a watcher and watches each of `directories`; throws (and watches nothing)
    /// if one of them cannot be watched.
    public convenience init(directories: [String], configuration: Configuration = Configuration())
        throws(SystemError)
    {
        try self.init(configuration: configuration)
        do throws(SystemError) {
            for directory in directories { try watch(directory) }
        } catch {
            stop()
            throw error
        }
    }

    /// Starts watching `directory` (following a symlink to it). Watching a directory twice
    /// is harmless. Throws `SystemError` (`inotify_add_watch`, e.g. `ENOENT`, `ENOTDIR`).
    /// Events from it are reported from the moment this returns.
    public func watch(_ directory: String) throws(SystemError) {
        try core.watch(Self.normalize(directory))
    }

    /// Watches `directory` and keeps watching it: if it does not exist yet, or is deleted or
    /// moved away later, the watcher waits for it to exist again (watching its nearest
    /// existing ancestor) and then reports `.directoryAppeared` and its events. Throws only
    /// when neither it nor any ancestor can be watched (e.g. `EACCES`).
    public func follow(_ directory: String) throws(SystemError) {
        try core.follow(Self.normalize(directory))
    }

    /// Stops watching (or following) `directory`; no `.directoryRemoved` is reported for it.
    /// Events from it already in the current batch are still delivered.
    public func unwatch(_ directory: String) {
        core.unwatch(Self.normalize(directory))
    }

    /// The directories currently watched, sorted.
    public var directories: [String] { core.watchedDirectories }

    /// Stops the reader thread, emits the pending batch (if any), finishes `changes` and
    /// closes the inotify descriptor. Idempotent; does not block.
    public func stop() { core.wake.signal() }

    deinit { core.wake.signal() }

    /// The default ignore rule: dotfiles (`.*`, which covers editors' and `rsync`'s
    /// temporaries), `*.tmp`, `*~` and `*.part`. Also used by callers' full rescans so both
    /// paths agree.
    public static func isIgnoredName(_ name: String) -> Bool {
        name.isEmpty || name.hasPrefix(".") || name.hasSuffix(".tmp") || name.hasSuffix("~")
            || name.hasSuffix(".part")
    }

    /// `directory` without trailing slashes, as the watcher reports it.
    public static func normalize(_ directory: String) -> String {
        var result = directory
        while result.count > 1 && result.hasSuffix("/") { result.removeLast() }
        return result
    }
}

/// The state shared by a watcher and its reader thread.
private final class WatcherCore: Sendable {
    private struct Watches {
        /// -1 once the reader thread has closed it.
        var fd: Int32
        var directoryByDescriptor: [Int32: String] = [:]
        var descriptorByDirectory: [String: Int32] = [:]
        /// Directories passed to `follow`, watched again whenever they come back.
        var followed: Set<String> = []
        /// Followed directories that are missing, by the watch on their nearest existing
        /// ancestor.
        var waiting: [Int32: Set<String>] = [:]
        /// The path of each ancestor watch `waiting` uses, as it was armed (read only while
        /// directories wait on it).
        var waitedPath: [Int32: String] = [:]
        /// Followed directories whose path ends in a symlink, by the watch on the directory
        /// that holds the link: the link can go or change with no event on its target.
        var links: [Int32: Set<String>] = [:]
    }

    let wake: WakeEvent
    private let configuration: DirectoryWatcher.Configuration
    private let continuation: AsyncStream<[DirectoryChange]>.Continuation
    private let watches: Mutex<Watches>
    private let inotifyFD: Int32

    /// Events watched on each directory (the same mask for a watched directory and for an
    /// ancestor a missing one waits on, since a second `inotify_add_watch` on one inode
    /// replaces the mask). `IN_CREATE` only reports symlinks and directories; `IN_MODIFY`
    /// deliberately absent.
    private static let mask: UInt32 =
        UInt32(IN_CLOSE_WRITE) | UInt32(IN_MOVED_TO) | UInt32(IN_DELETE) | UInt32(IN_MOVED_FROM) | UInt32(IN_CREATE)
        | UInt32(IN_ATTRIB) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF) | UInt32(IN_ONLYDIR) | UInt32(IN_EXCL_UNLINK)

    init(configuration: DirectoryWatcher.Configuration,
         continuation: AsyncStream<[DirectoryChange]>.Continuation) throws(SystemError)
    {
        self.configuration = configuration
        self.continuation = continuation
        wake = try WakeEvent()
        inotifyFD = try valueOrErrno("inotify_init1") { inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK)) }
        watches = Mutex(Watches(fd: inotifyFD))
    }

    func watch(_ directory: String) throws(SystemError) {
        let result: Result<Void, SystemError> = watches.withLock { watches in
            guard watches.fd >= 0 else { return .failure(SystemError("inotify_add_watch", code: EBADF, subject: directory)) }
            let wd = inotify_add_watch(watches.fd, directory, Self.mask)
            if wd < 0 { return .failure(.current("inotify_add_watch", subject: directory)) }
            if let old = watches.directoryByDescriptor[wd], old != directory {
                // Two names for one directory share a watch; keep reporting under the first.
                return .success(())
            }
            watches.directoryByDescriptor[wd] = directory
            watches.descriptorByDirectory[directory] = wd
            return .success(())
        }
        try result.get()
    }

    func unwatch(_ directory: String) {
        watches.withLock { watches in
            watches.followed.remove(directory)
            for (wd, var waiters) in watches.waiting where waiters.contains(directory) {
                waiters.remove(directory)
                watches.waiting[wd] = waiters.isEmpty ? nil : waiters
                Self.dropIfUnused(wd, &watches)
            }
            for (wd, var linked) in watches.links where linked.contains(directory) {
                linked.remove(directory)
                watches.links[wd] = linked.isEmpty ? nil : linked
                Self.dropIfUnused(wd, &watches)
            }
            guard let wd = watches.descriptorByDirectory.removeValue(forKey: directory) else { return }
            watches.directoryByDescriptor[wd] = nil
            if watches.fd >= 0 { _ = inotify_rm_watch(watches.fd, wd) }
        }
    }

    func follow(_ directory: String) throws(SystemError) {
        let result: Result<Void, SystemError> = watches.withLock { watches in
            guard watches.fd >= 0 else { return .failure(SystemError("inotify_add_watch", code: EBADF, subject: directory)) }
            watches.followed.insert(directory)
            switch Self.arm(directory, &watches) {
            case .failure(let error):
                watches.followed.remove(directory)
                return .failure(error)
            case .success:
                return .success(())
            }
        }
        try result.get()
    }

    /// Watches `directory` if it exists (true), else its nearest existing ancestor, to be
    /// told when it appears (false). Retries while the path is being created under it.
    /// A `directory` that is a symlink has the directory holding the link watched first
    /// (`links`), so that the link cannot change unseen after its target is watched.
    private static func arm(_ directory: String, _ watches: inout Watches) -> Result<Bool, SystemError> {
        for _ in 0..<64 {
            var holder: Int32 = -1
            var link = stat()
            if lstat(directory, &link) == 0, link.st_mode & S_IFMT == S_IFLNK {
                // Without it (e.g. EACCES), the directory is watched as before: through the link.
                holder = inotify_add_watch(watches.fd, PathText.parent(of: directory), mask)
            }
            let wd = inotify_add_watch(watches.fd, directory, mask)
            if wd >= 0 {
                if holder >= 0 { watches.links[holder, default: []].insert(directory) }
                watches.directoryByDescriptor[wd] = watches.directoryByDescriptor[wd] ?? directory
                watches.descriptorByDirectory[directory] = wd
                return .success(true)
            }
            // A link that leads nowhere: the directory waits (on its ancestor) as any missing one.
            defer { if holder >= 0 { dropIfUnused(holder, &watches) } }
            let error = SystemError.current("inotify_add_watch", subject: directory)
            guard error.code == ENOENT || error.code == ENOTDIR else { return .failure(error) }
            // The nearest ancestor that exists, and the component below it we wait for.
            var child = directory
            var ancestor = PathText.parent(of: directory)
            while true {
                let wd = inotify_add_watch(watches.fd, ancestor, mask)
                if wd >= 0 {
                    watches.waiting[wd, default: []].insert(directory)
                    watches.waitedPath[wd] = ancestor
                    break
                }
                let code = Glibc.errno
                guard code == ENOENT || code == ENOTDIR, ancestor != child else { return .failure(error) }
                child = ancestor
                ancestor = PathText.parent(of: ancestor)
            }
            // Created between our two calls? Then go round again; else its event will come.
            var info = stat()
            if lstat(child, &info) != 0 { return .success(false) }
        }
        return .success(false)
    }

    /// Removes a watch that serves neither a watched directory, nor a waiting one, nor a
    /// followed symlink.
    private static func dropIfUnused(_ wd: Int32, _ watches: inout Watches) {
        guard watches.directoryByDescriptor[wd] == nil, watches.waiting[wd] == nil, watches.links[wd] == nil, watches.fd >= 0
        else { return }
        _ = inotify_rm_watch(watches.fd, wd)
    }

    /// The followed directories whose link, in the directory of watch `wd`, is `name` (all
    /// of them when `name` is nil: that directory itself went away), taken from `links`;
    /// those watched until now are returned, no longer watched: their path may lead
    /// elsewhere now, or nowhere. (One whose target went away already waits to appear.)
    private func unlinked(named name: String?, in wd: Int32) -> Set<String> {
        watches.withLock { watches -> Set<String> in
            guard let linked = watches.links[wd] else { return [] }
            let gone = name.map { name in linked.filter { PathText.lastComponent(of: $0) == name } } ?? linked
            guard !gone.isEmpty else { return [] }
            let left = linked.subtracting(gone)
            watches.links[wd] = left.isEmpty ? nil : left
            var watched: Set<String> = []
            for directory in gone {
                guard let target = watches.descriptorByDirectory.removeValue(forKey: directory) else { continue }
                watched.insert(directory)
                guard watches.directoryByDescriptor[target] == directory else { continue }
                // Another name for the same directory keeps its watch, reported under that name.
                if let other = watches.descriptorByDirectory.first(where: { $0.value == target })?.key {
                    watches.directoryByDescriptor[target] = other
                } else {
                    watches.directoryByDescriptor[target] = nil
                    Self.dropIfUnused(target, &watches)
                }
            }
            if name != nil { Self.dropIfUnused(wd, &watches) }
            return watched
        }
    }

    /// The followed directories waiting on watch `wd` (an ancestor of theirs), taken from it,
    /// when its entry `name` is now a symlink; nil otherwise (they keep waiting).
    private func waitersForLink(named name: String, in wd: Int32) -> Set<String>? {
        watches.withLock { watches -> Set<String>? in
            guard let waiters = watches.waiting[wd], !waiters.isEmpty, let ancestor = watches.waitedPath[wd] else { return nil }
            var info = stat()
            let path = ancestor == "/" ? "/" + name : ancestor + "/" + name
            guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFLNK else { return nil }
            watches.waiting[wd] = nil
            return waiters
        }
    }

    /// Reports followed `directory` removed: its symlink went or changed. Under a key of its
    /// own: the link's `.removed`, when the directory holding it is watched too, has the
    /// directory's path as its key.
    private func reportUnlinked(_ directory: String, into pending: inout Pending) {
        pending.add(DirectoryChange(kind: .directoryRemoved, path: directory, directory: directory), key: "\0unlinked " + directory)
    }

    /// Arms the followed `directories` again (their watch or their ancestor's went away, or
    /// something appeared under their ancestor); reports those now watched.
    private func rearm(_ directories: Set<String>, into pending: inout Pending) {
        let appeared: [String] = watches.withLock { watches in
            directories.sorted().filter { directory in
                guard watches.followed.contains(directory), watches.descriptorByDirectory[directory] == nil else { return false }
                return (try? Self.arm(directory, &watches).get()) == true
            }
        }
        for directory in appeared {
            // Its own key: a removal just before stays in the batch too.
            pending.add(DirectoryChange(kind: .directoryAppeared, path: directory, directory: directory), key: "\0appeared " + directory)
        }
    }

    var watchedDirectories: [String] {
        watches.withLock { Array($0.descriptorByDirectory.keys) }.sorted()
    }

    // MARK: Reader thread

    private struct Pending {
        var changes: [String: (change: DirectoryChange, sequence: Int)] = [:]
        var sequence = 0
        var firstEvent: ContinuousClock.Instant?
        var lastEvent: ContinuousClock.Instant?
        /// When the last batch was taken; nil before the first.
        var lastTaken: ContinuousClock.Instant?

        mutating func add(_ change: DirectoryChange, key: String) {
            let now = ContinuousClock.now
            if firstEvent == nil { firstEvent = now }
            lastEvent = now
            sequence += 1
            changes[key] = (change, sequence)
        }

        func deadline(settle: Duration, maximumDelay: Duration) -> ContinuousClock.Instant? {
            guard let firstEvent, let lastEvent else { return nil }
            // Quiet since the last batch (or none yet): the first change goes out at once.
            if lastTaken.map({ firstEvent >= $0.advanced(by: settle) }) ?? true { return firstEvent }
            return min(lastEvent.advanced(by: settle), firstEvent.advanced(by: maximumDelay))
        }

        mutating func take() -> [DirectoryChange] {
            let batch = changes.values.sorted { $0.sequence < $1.sequence }.map(\.change)
            self = Pending(sequence: sequence, lastTaken: .now)
            return batch
        }
    }

    func run() {
        var pending = Pending()
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var fds = [pollfd(fd: inotifyFD, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: wake.fd, events: Int16(POLLIN), revents: 0)]
        loop: while true {
            let deadline = pending.deadline(settle: configuration.settle, maximumDelay: configuration.maximumDelay)
            fds[0].revents = 0
            fds[1].revents = 0
            do throws(SystemError) {
                _ = try pollDescriptors(&fds, timeout: pollTimeout(until: deadline))
            } catch {
                break loop  // poll only fails for programming errors (EFAULT, EINVAL)
            }
            if fds[1].revents != 0 { break loop }
            if fds[0].revents != 0 { drain(into: &pending, buffer: &buffer) }
            if let deadline = pending.deadline(settle: configuration.settle, maximumDelay: configuration.maximumDelay),
               ContinuousClock.now >= deadline
            {
                let batch = pending.take()
                if !batch.isEmpty { continuation.yield(batch) }
            }
        }
        close(lastBatch: pending.take())
    }

    /// Closes the inotify descriptor, yields `lastBatch` (unless empty) and finishes
    /// `changes`: the end of `run`, or of a watcher whose reading thread could not start.
    func close(lastBatch: [DirectoryChange] = []) {
        watches.withLock { watches in
            closeDescriptor(watches.fd)
            watches.fd = -1
            watches.directoryByDescriptor = [:]
            watches.descriptorByDirectory = [:]
            watches.waiting = [:]
            watches.links = [:]
        }
        if !lastBatch.isEmpty { continuation.yield(lastBatch) }
        continuation.finish()
    }

    /// Reads every queued inotify event and merges it into `pending`.
    private func drain(into pending: inout Pending, buffer: inout [UInt8]) {
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(inotifyFD, $0.baseAddress, $0.count) }
            if count < 0 {
                if Glibc.errno == EINTR { continue }
                return  // EAGAIN: queue empty
            }
            if count == 0 { return }
            buffer.withUnsafeBytes { raw in
                var offset = 0
                // struct inotify_event { int wd; uint32_t mask, cookie, len; char name[]; }
                while offset + 16 <= count {
                    let wd = raw.loadUnaligned(fromByteOffset: offset, as: Int32.self)
                    let mask = raw.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self)
                    let length = Int(raw.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
                    let nameBytes = raw[(offset + 16)..<min(offset + 16 + length, count)]
                    let name = String(decoding: nameBytes.prefix { $0 != 0 }, as: UTF8.self)
                    handle(wd: wd, mask: mask, name: name, into: &pending)
                    offset += 16 + length
                }
            }
        }
    }

    private func handle(wd: Int32, mask: UInt32, name: String, into pending: inout Pending) {
        func has(_ flag: Int32) -> Bool { mask & UInt32(flag) != 0 }
        if has(IN_Q_OVERFLOW) {
            pending.add(DirectoryChange(kind: .overflow, path: "", directory: ""), key: "\0overflow")
            return
        }
        let selfGone = has(IN_DELETE_SELF) || has(IN_MOVE_SELF) || has(IN_IGNORED) || has(IN_UNMOUNT)
        if selfGone {
            // The symlinks of followed directories in it went with it.
            let unlinked = unlinked(named: nil, in: wd)
            // Forget the watch first so a later IN_IGNORED for it is not reported twice.
            let (directory, waiters): (String?, Set<String>) = watches.withLock { watches in
                let waiters = watches.waiting.removeValue(forKey: wd) ?? []
                let directory = watches.directoryByDescriptor.removeValue(forKey: wd)
                if let directory { watches.descriptorByDirectory[directory] = nil }
                // A moved directory keeps its watch; drop it since its path is no longer ours.
                if has(IN_MOVE_SELF), watches.fd >= 0 { _ = inotify_rm_watch(watches.fd, wd) }
                return (directory, waiters)
            }
            if let directory {
                pending.add(DirectoryChange(kind: .directoryRemoved, path: directory, directory: directory),
                            key: directory)
            }
            for gone in unlinked.sorted() { reportUnlinked(gone, into: &pending) }
            // A followed directory (or an ancestor others wait on) went away: wait again.
            rearm(waiters.union(unlinked).union(directory.map { [$0] } ?? []), into: &pending)
            return
        }
        if has(IN_DELETE) || has(IN_MOVED_FROM) || has(IN_MOVED_TO) {
            // The symlink of a followed directory was removed, renamed away or replaced: the
            // path leads to another directory, or to none, while the one watched is unchanged.
            let unlinked = unlinked(named: name, in: wd)
            if !unlinked.isEmpty {
                for gone in unlinked.sorted() { reportUnlinked(gone, into: &pending) }
                rearm(unlinked, into: &pending)
            }
        }
        if has(IN_ATTRIB) && name.isEmpty {
            // The watched directory's own mode or owner (an ancestor waited on is not reported).
            if let directory = watches.withLock({ $0.directoryByDescriptor[wd] }) {
                pending.add(DirectoryChange(kind: .attributesChanged, path: directory, directory: directory), key: "\0attributes " + directory)
            }
            return
        }
        if has(IN_ISDIR) {
            // A directory appeared where followed ones wait: maybe one of them, or a step
            // on the way to one.
            if has(IN_CREATE) || has(IN_MOVED_TO) {
                let waiters = watches.withLock { watches in watches.waiting.removeValue(forKey: wd) ?? [] }
                if !waiters.isEmpty {
                    rearm(waiters, into: &pending)
                    watches.withLock { Self.dropIfUnused(wd, &$0) }
                }
            }
            return
        }
        if has(IN_CREATE) || has(IN_MOVED_TO), let waiters = waitersForLink(named: name, in: wd) {
            // A symlink appeared where followed directories wait: it may lead to one of them
            // (or be a step on the way), as a directory made there would.
            rearm(waiters, into: &pending)
            watches.withLock { Self.dropIfUnused(wd, &$0) }
        }
        if configuration.isIgnored(name) { return }
        guard let directory = watches.withLock({ $0.directoryByDescriptor[wd] }) else { return }
        let path = directory == "/" ? "/" + name : directory + "/" + name
        if has(IN_CREATE) {
            // Only a symlink is complete when created; a file being written is not.
            var info = stat()
            if lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFLNK {
                pending.add(DirectoryChange(kind: .ready, path: path, directory: directory), key: path)
            }
            return
        }
        if has(IN_CLOSE_WRITE) || has(IN_MOVED_TO) {
            pending.add(DirectoryChange(kind: .ready, path: path, directory: directory), key: path)
        } else if has(IN_DELETE) || has(IN_MOVED_FROM) {
            pending.add(DirectoryChange(kind: .removed, path: path, directory: directory), key: path)
        } else if has(IN_ATTRIB) {
            // Reported besides a `.ready` or `.removed` of the same file in the batch.
            pending.add(DirectoryChange(kind: .attributesChanged, path: path, directory: directory), key: "\0attributes " + path)
        }
    }
}
