#if canImport(Glibc)
import Glibc
#endif
import CForkGuard
import Dispatch
import Synchronization

/// Who is on the other end of a Unix socket, as the kernel reports it (`SO_PEERCRED`):
/// the credentials of the process at the time it connected.
public struct PeerCredentials: Sendable, Hashable, CustomStringConvertible {
    /// The peer's process id.
    public var pid: Int32
    /// The peer's effective user id.
    public var uid: UInt32
    /// The peer's effective group id.
    public var gid: UInt32

    /// Creates credentials from explicit values.
    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }

    /// Reads `SO_PEERCRED` of a connected Unix socket.
    public init(socket fd: Int32) throws(SystemError) {
        // struct ucred { pid_t pid; uid_t uid; gid_t gid; } (not imported without _GNU_SOURCE)
        var raw: (Int32, UInt32, UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
        try valueOrErrno("getsockopt", subject: "SO_PEERCRED") {
            getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &raw, &length)
        }
        self.init(pid: raw.0, uid: raw.1, gid: raw.2)
    }

    /// `pid=N uid=N gid=N`.
    public var description: String { "pid=\(pid) uid=\(uid) gid=\(gid)" }
}

/// Why the control server answered with an error line on its own, without the handler.
public enum ControlRejection: Sendable, Hashable, CustomStringConvertible {
    /// The peer's uid is neither ours nor root (or `authorize` said no); the connection is
    /// closed after the reply.
    case peerNotPermitted(PeerCredentials)
    /// A request line exceeded the limit (bytes, without the newline); the connection is
    /// closed after the reply.
    case lineTooLong(limit: Int)
    /// A request line was not valid UTF-8 (`line`: its bytes, without the newline, for the
    /// reply to point at the first bad one); the connection stays open.
    case invalidUTF8(line: [UInt8])
    /// A request line was started but not finished within the request timeout; the
    /// connection is closed after the reply.
    case timedOut
    /// The server already serves its maximum number of connections; closed after the reply.
    case tooManyConnections(limit: Int)
    /// The peer's process already has the most connections one process may have open;
    /// closed after the reply.
    case tooManyConnectionsFromProcess(limit: Int)

    /// A human-readable sentence for the error line's message.
    public var description: String {
        switch self {
        case .peerNotPermitted(let peer):
            geteuid() == 0
                ? "peer uid \(peer.uid) is not permitted: only uid 0 (root) may use this socket"
                : "peer uid \(peer.uid) is not permitted: only uid \(geteuid()) (the daemon's user) and uid 0 (root) may use this socket"
        case .lineTooLong(let limit): "request line longer than \(limit) bytes"
        case .invalidUTF8: "request line is not valid UTF-8"
        case .timedOut: "request not completed in time"
        case .tooManyConnections(let limit): "more than \(limit) connections"
        case .tooManyConnectionsFromProcess(let limit):
            "this process has \(limit) connections open, the most one process may have; use fewer, or close those it no longer reads"
        }
    }
}

/// Errors of `ControlServer` and `ControlClient`.
public enum ControlSocketError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A system call failed.
    case system(SystemError)
    /// Another process is accepting connections on the socket path (a second daemon).
    case alreadyRunning(path: String)
    /// Something other than a socket exists at the socket path; it is left alone.
    case notASocket(path: String)
    /// The operation did not finish within its timeout.
    case timedOut(operation: String)
    /// The other side closed the connection before a whole line arrived.
    case connectionClosed
    /// A reply line exceeded the client's limit.
    case lineTooLong(limit: Int)
    /// The process listening on the socket runs as a user the client does not trust (by
    /// default: neither root nor the client's own uid); nothing was sent to it.
    case untrustedPeer(path: String, peer: PeerCredentials)

    /// A human-readable sentence, suitable for `modhostctl`'s `Error: ...` line.
    public var description: String {
        switch self {
        case .system(let error): "\(error)"
        case .alreadyRunning(let path): "another process is listening on \(path)"
        case .notASocket(let path): "\(path) exists and is not a socket"
        case .timedOut(let operation): "\(operation) timed out"
        case .connectionClosed: "connection closed by peer"
        case .lineTooLong(let limit): "reply line longer than \(limit) bytes"
        case .untrustedPeer(let path, let peer):
            "the process listening on \(path) runs as uid \(peer.uid) (pid \(peer.pid)); only a modhostd running as uid \(geteuid() == 0 ? "0 (root)" : "\(geteuid()) (your user), uid 0 (root)") or as the \(ControlServer.serviceUserName) service account is trusted"
        }
    }
}

/// A Unix-domain stream socket server that moves request and reply lines between clients
/// and an async handler. It knows nothing of the protocol inside the lines.
///
/// Guarantees:
/// - `init` creates the socket file with `Configuration.socketMode` (default 0600), replacing
///   a stale socket only if nothing accepts on it; it throws `.alreadyRunning` if another
///   process listens there and `.notASocket` if a non-socket file is in the way.
/// - Every peer is checked with `SO_PEERCRED` before anything is read: by default only our
///   effective uid and root are served; others get one error line and are disconnected.
/// - Requests are newline-terminated lines (a trailing `\r` is dropped, blank lines are
///   skipped). Each is passed to `handler` with the peer's credentials; its reply is sent
///   as one line (newlines inside it are turned into spaces). Requests on one connection
///   are handled strictly in order, one at a time; connections are independent.
/// - Oversized, non-UTF-8 and slow requests get an error line (`rejectionReply`, which
///   writes it in the protocol's own form)
///   and, except for invalid UTF-8, the connection is closed. Idle connections are closed
///   after `idleTimeout`. When `maximumConnections` are open and another arrives, the one
///   that has waited longest for its next request to arrive whole (idle, or sending it
///   slowly) or for its client to read a reply, for at least `evictionGrace`, is closed to
///   make room. A client that does not read its replies is dropped after `writeTimeout`.
///   One client process has at most `maximumConnectionsPerProcess` open. No client can
///   block another or the accept loop.
/// - Each connection is served by its own OS thread with non-blocking I/O and `poll`
///   deadlines; the handler runs as a Swift task. All descriptors are close-on-exec, and
///   each is closed exactly once by the thread that owns it.
/// - `stop()` stops accepting, closes the listener, unlinks the socket file (only if it is
///   still the one this server created), closes idle connections, lets requests already in
///   the handler finish and reply, and returns when every connection is closed.
public final class ControlServer: Sendable {
    /// The handler: request line (without newline) and peer in, reply line out.
    public typealias Handler = @Sendable (String, PeerCredentials) async -> String
    /// The error line (without newline) for a request the server refuses on its own.
    public typealias RejectionReply = @Sendable (ControlRejection) -> String
    /// The reply line to a request that can be answered at once on the connection's own
    /// thread (without Swift concurrency), or nil to give it to the `Handler`.
    public typealias Immediate = @Sendable (String, PeerCredentials) -> String?

    /// Limits and policies of a server.
    public struct Configuration: Sendable {
        /// Longest accepted request line in bytes, without the newline. Default 64 KiB.
        public var maximumLineLength: Int = 64 * 1024
        /// How long a started request line may take to arrive completely. Default 5 s.
        public var requestTimeout: Duration = .seconds(5)
        /// How long a connection may stay silent between requests. Default 60 s.
        public var idleTimeout: Duration = .seconds(60)
        /// How long writing one reply may take. Default 5 s.
        public var writeTimeout: Duration = .seconds(5)
        /// Connections served at once. One more closes the connection that has waited
        /// longest for a request to arrive whole (idle, or with part of a line sent) or for
        /// its client to read a reply, if that has been at least `evictionGrace`, and takes
        /// its place; otherwise (every connection has a request in the handler, or has just
        /// connected) it gets an error line. Default 128.
        public var maximumConnections: Int = 128
        /// Connections one client process (the pid `SO_PEERCRED` gives) may have open at
        /// once; one more gets an error line. Default 64, half of `maximumConnections`: a
        /// client that leaks connections leaves the other half to the others.
        public var maximumConnectionsPerProcess: Int = 64
        /// How long a connection waits for a request before another may take its place
        /// (`maximumConnections`): time for a client that has just connected to send it.
        /// Default 0.25 s.
        public var evictionGrace: Duration = .milliseconds(250)
        /// Permission bits of the socket file. Default 0600.
        public var socketMode: mode_t = 0o600
        /// Which peers are served. Default `ControlServer.sameUserOrRoot`.
        public var authorize: @Sendable (PeerCredentials) -> Bool = ControlServer.sameUserOrRoot

        /// The defaults listed on each property.
        public init() {}
    }

    /// The path (or `@abstract` name) the server listens on.
    public let socketPath: String
    private let core: ServerCore

    /// Creates the socket at `socketPath`, starts listening and accepting on a thread of its
    /// own, and returns. Requests go to `handler`; what the server refuses on its own gets
    /// the line `rejectionReply` writes (the protocol's error form: the server knows no
    /// protocol). Throws `ControlSocketError`.
    ///
    /// `listener`: a socket already listening on `socketPath`, which the server takes (the
    /// one a process that executed this program kept open: `stopKeepingListener`), so
    /// that clients that connected meanwhile are served; it must be a listening UNIX
    /// stream socket bound to `socketPath`, or the server closes it and makes its own.
    public init(socketPath: String, listener: Int32? = nil, configuration: Configuration = Configuration(),
                rejectionReply: @escaping RejectionReply, immediate: Immediate? = nil, handler: @escaping Handler)
        throws(ControlSocketError)
    {
        self.socketPath = socketPath
        core = try ServerCore(socketPath: socketPath, listener: listener, configuration: configuration,
                              rejectionReply: rejectionReply, immediate: immediate, handler: handler)
        let core = self.core
        do throws(SystemError) {
            try startThread(name: "dk-ctl-accept") { core.acceptLoop() }
        } catch {
            core.closeListener()
            throw .system(error)
        }
    }

    /// The number of connections currently open (being served or idle).
    public var connectionCount: Int { core.connectionCount }

    /// Stops the server (see the type's guarantees) and returns once every connection is
    /// closed. Safe to call more than once and from several tasks.
    public func stop() async {
        core.requestStop()
        await core.waitUntilStopped()
    }

    /// Stops the server as `stop()` does, but leaves the listening socket open and its file
    /// in place, and returns its descriptor (close-on-exec), or nil when the server had
    /// stopped already: for the program this process executes next, which takes it
    /// (`init(socketPath:listener:...)`). Clients that connect meanwhile wait in its
    /// backlog.
    public func stopKeepingListener() async -> Int32? {
        guard core.keepListener() else { return nil }
        core.requestStop()
        await core.waitUntilStopped()
        return core.listenFD
    }

    deinit { core.requestStop() }

    /// The default policy: the peer runs as our effective uid or as root.
    public static func sameUserOrRoot(_ peer: PeerCredentials) -> Bool {
        peer.uid == 0 || peer.uid == geteuid()
    }

    /// The name of the system account the packaged modhostd runs as (the Debian package
    /// creates it; the systemd unit runs the daemon under it with no capabilities).
    public static let serviceUserName = "modhostd"

    /// The uid of `serviceUserName` in the user database, nil when there is no such account.
    public static func serviceUserID() -> uid_t? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 4096)
        let status = getpwnam_r(serviceUserName, &entry, &buffer, buffer.count, &result)
        return status == 0 && result != nil ? entry.pw_uid : nil
    }

    /// The client's default trust in the process listening on a socket: root, our own
    /// effective uid, or the service account (`serviceUserName`, whose uid is `serviceUID`),
    /// so that root's `modhostctl` talks to the daemon the systemd unit runs.
    public static func trustedDaemon(_ peer: PeerCredentials, serviceUID: uid_t?) -> Bool {
        sameUserOrRoot(peer) || (serviceUID != nil && peer.uid == serviceUID)
    }

    /// `trustedDaemon(_:serviceUID:)` with the service account's uid looked up now.
    public static func trustedDaemon(_ peer: PeerCredentials) -> Bool {
        trustedDaemon(peer, serviceUID: serviceUserID())
    }
}

/// The state shared by the server object, its accept thread and its connection threads.
private final class ServerCore: Sendable {
    private struct State {
        var connections = 0
        /// Open connections by the pid of their client's process.
        var perProcess: [pid_t: Int] = [:]
        /// The connections waiting for their next request to arrive whole, or for their
        /// client to read a reply, by number: their descriptor and since when (`admit`
        /// closes the longest waiting to make room).
        var waiting: [Int: WaitingConnection] = [:]
        var lastConnection = 0
        var acceptorRunning = true
        var stopRequested = false
        /// Whether the acceptor leaves the listener open when it stops (`keepListener`).
        var keepingListener = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private struct WaitingConnection {
        let fd: Int32
        let since: ContinuousClock.Instant
        /// For its client to read a reply (else for a request).
        var writing = false
    }

    let configuration: ControlServer.Configuration
    let rejectionReply: ControlServer.RejectionReply
    let immediate: ControlServer.Immediate?
    let handler: ControlServer.Handler
    let socketPath: String
    let listenFD: Int32
    /// Device and inode of the socket file we created, to unlink only our own.
    let identity: (dev: UInt64, ino: UInt64)?
    let wake: WakeEvent
    private let state = Mutex(State())

    init(socketPath: String, listener: Int32?, configuration: ControlServer.Configuration,
         rejectionReply: @escaping ControlServer.RejectionReply, immediate: ControlServer.Immediate?,
         handler: @escaping ControlServer.Handler)
        throws(ControlSocketError)
    {
        self.configuration = configuration
        self.rejectionReply = rejectionReply
        self.immediate = immediate
        self.handler = handler
        self.socketPath = socketPath
        let abstract = socketPath.hasPrefix("@")
        if let listener {
            if let identity = Self.listenerIdentity(listener, socketPath: socketPath), let wake = try? WakeEvent() {
                _ = fcntl(listener, F_SETFD, FD_CLOEXEC)
                _ = fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK)
                self.wake = wake
                self.identity = identity
                listenFD = listener
                _ = modhost_fork_guard_close(listener)
                return
            }
            closeDescriptor(listener)
        }
        do throws(SystemError) {
            wake = try WakeEvent()
            let (address, length) = try UnixSocketAddress.make(socketPath)
            if !abstract { try Self.removeStaleSocket(socketPath) }
            let fd = try valueOrErrno("socket") {
                socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            }
            do throws(SystemError) {
                // On Linux the socket inode's mode (minus umask) becomes the file's mode at
                // bind, so the file is never more open than socketMode, not even briefly.
                if !abstract { try valueOrErrno("fchmod", subject: socketPath) { fchmod(fd, configuration.socketMode) } }
                var address = address
                try valueOrErrno("bind", subject: socketPath) {
                    withUnsafePointer(to: &address) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
                    }
                }
                if abstract {
                    identity = nil
                } else {
                    try valueOrErrno("chmod", subject: socketPath) { chmod(socketPath, configuration.socketMode) }
                    var info = stat()
                    try valueOrErrno("stat", subject: socketPath) { stat(socketPath, &info) }
                    identity = (UInt64(info.st_dev), UInt64(info.st_ino))
                }
                try valueOrErrno("listen", subject: socketPath) { listen(fd, 128) }
            } catch {
                closeDescriptor(fd)
                throw error
            }
            listenFD = fd
            // A process forked from the daemon (by plugin code) does not keep the listener.
            _ = modhost_fork_guard_close(fd)
        } catch {
            if error.code == EADDRINUSE { throw .alreadyRunning(path: socketPath) }
            if error.code == ENOTSOCK && error.syscall == "lstat" { throw .notASocket(path: socketPath) }
            throw .system(error)
        }
    }

    /// The identity `init` records for `fd` when it is a listening UNIX stream socket bound
    /// to `socketPath` (nil for an abstract name); `.none` when it is not such a socket.
    private static func listenerIdentity(_ fd: Int32, socketPath: String) -> (dev: UInt64, ino: UInt64)?? {
        var accepting: Int32 = 0, type: Int32 = 0
        var size = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &size) == 0, accepting == 1 else { return .none }
        size = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &size) == 0, type == Int32(SOCK_STREAM.rawValue) else { return .none }
        guard case .success(let bound) = UnixSocketAddress.boundPath(of: fd), bound == socketPath else { return .none }
        if socketPath.hasPrefix("@") { return .some(nil) }
        var info = stat()
        guard stat(socketPath, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK else { return .none }
        return .some((UInt64(info.st_dev), UInt64(info.st_ino)))
    }

    /// Removes a socket file nobody accepts on; throws `EADDRINUSE` if someone does and
    /// `ENOTSOCK` if the path is not a socket. A missing file is fine.
    private static func removeStaleSocket(_ path: String) throws(SystemError) {
        var info = stat()
        if lstat(path, &info) != 0 {
            if Glibc.errno == ENOENT { return }
            throw .current("lstat", subject: path)
        }
        guard info.st_mode & S_IFMT == S_IFSOCK else { throw SystemError("lstat", code: ENOTSOCK, subject: path) }
        switch connectUnix(path) {
        case .success(let fd):
            closeDescriptor(fd)
            throw SystemError("connect", code: EADDRINUSE, subject: path)
        case .failure(let error) where error.code == ECONNREFUSED:
            if unlink(path) != 0 && Glibc.errno != ENOENT { throw .current("unlink", subject: path) }
        case .failure(let error) where error.code == ENOENT:
            return
        case .failure(let error):
            // EAGAIN: its backlog is full, so someone is listening.
            if error.code == EAGAIN { throw SystemError("connect", code: EADDRINUSE, subject: path) }
            throw error
        }
    }

    var connectionCount: Int { state.withLock { $0.connections } }

    /// Makes the acceptor leave the listener open when it stops; false when it has stopped
    /// already (and closed it).
    func keepListener() -> Bool {
        state.withLock { state in
            guard state.acceptorRunning, !state.stopRequested else { return false }
            state.keepingListener = true
            return true
        }
    }

    func requestStop() {
        state.withLock { $0.stopRequested = true }
        wake.signal()
    }

    var isStopping: Bool { state.withLock { $0.stopRequested } }

    func waitUntilStopped() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = state.withLock { state -> Bool in
                if !state.acceptorRunning && state.connections == 0 { return true }
                state.waiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }

    /// Called when the acceptor or a connection finishes; resumes `stop()` callers once all have.
    /// A connection of `process` has closed, or (nil) the acceptor has stopped.
    private func finished(connection process: pid_t?) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            if let process {
                state.connections -= 1
                state.perProcess[process, default: 1] -= 1
                if state.perProcess[process] == 0 { state.perProcess[process] = nil }
            } else {
                state.acceptorRunning = false
            }
            guard !state.acceptorRunning && state.connections == 0 else { return [] }
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    // MARK: Accepting

    func acceptLoop() {
        var fds = [pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: wake.fd, events: Int16(POLLIN), revents: 0)]
        while true {
            fds[0].revents = 0
            fds[1].revents = 0
            guard (try? pollDescriptors(&fds, timeout: -1)) != nil, fds[1].revents == 0 else { break }
            let fd = GNUCalls.accept4(listenFD, nil, nil, Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue))
            if fd < 0 {
                let code = Glibc.errno
                if code == EMFILE || code == ENFILE || code == ENOBUFS || code == ENOMEM {
                    usleep(50_000)  // out of descriptors: back off instead of spinning
                }
                continue  // EAGAIN, EINTR, ECONNABORTED, ...
            }
            admit(fd)
        }
        closeListener()
    }

    /// Closes the listening socket and removes its file (if it is still ours): the end of
    /// `acceptLoop`, or of a server whose accepting thread could not start.
    func closeListener() {
        if state.withLock({ $0.keepingListener }) {
            finished(connection: nil)
            return
        }
        modhost_fork_guard_keep(listenFD)
        closeDescriptor(listenFD)
        if let identity {
            var info = stat()
            if lstat(socketPath, &info) == 0, UInt64(info.st_dev) == identity.dev, UInt64(info.st_ino) == identity.ino {
                unlink(socketPath)
            }
        }
        finished(connection: nil)
    }

    private enum Admission {
        case admitted(Int)
        case refused(ControlRejection)
    }

    /// Checks a new connection and starts its thread, or rejects it.
    private func admit(_ fd: Int32) {
        let peer: PeerCredentials
        do throws(SystemError) {
            peer = try PeerCredentials(socket: fd)
        } catch {
            closeDescriptor(fd)
            return
        }
        let limit = configuration.maximumConnections, perProcess = configuration.maximumConnectionsPerProcess
        let admission = state.withLock { state -> Admission in
            if state.perProcess[peer.pid, default: 0] >= perProcess { return .refused(.tooManyConnectionsFromProcess(limit: perProcess)) }
            if state.connections >= limit {
                // Full: the connection that has waited longest for a request makes room, so
                // that a client leaking connections, idle or with requests it never
                // finishes, cannot lock the others out. Its thread reads the end of input,
                // closes it and counts itself out; the descriptor is still open (a thread
                // leaves `waiting` before it closes).
                guard let (oldest, waiting) = state.waiting.min(by: { $0.value.since < $1.value.since }),
                      ContinuousClock.now - waiting.since >= configuration.evictionGrace
                else { return .refused(.tooManyConnections(limit: limit)) }
                state.waiting[oldest] = nil
                // Ends its wait: a read sees the end of input (a request read just now is
                // still answered), a write fails.
                shutdown(waiting.fd, waiting.writing ? Int32(SHUT_RDWR) : Int32(SHUT_RD))
            }
            state.connections += 1
            state.perProcess[peer.pid, default: 0] += 1
            state.lastConnection += 1
            return .admitted(state.lastConnection)
        }
        let connection: Int
        switch admission {
        case .admitted(let number):
            connection = number
        case .refused(let rejection):
            // Best effort and brief: a fresh socket's send buffer takes a short line at once.
            _ = writeLine(fd, rejectionReply(rejection), deadline: .now.advanced(by: .milliseconds(100)))
            closeDescriptor(fd)
            return
        }
        do throws(SystemError) {
            try startThread(name: "dk-ctl-conn") { [self] in
                serve(fd, peer, number: connection)
                closeDescriptor(fd)
                finished(connection: peer.pid)
            }
        } catch {
            // No thread to serve it (a limit on threads was reached): the client sees its
            // connection closed, as when it is refused.
            closeDescriptor(fd)
            finished(connection: peer.pid)
        }
    }

    // MARK: One connection

    private enum ReadOutcome { case data, timedOut, closed, stopping }

    /// Marks connection `number` as waiting for a request to arrive whole or for its client
    /// to read a reply (it may then be closed to make room), from now if it was not
    /// already, or not.
    private func setWaiting(_ number: Int, fd: Int32, _ waiting: Bool) {
        state.withLock { state in
            if !waiting {
                state.waiting[number] = nil
            } else if state.waiting[number] == nil {
                state.waiting[number] = WaitingConnection(fd: fd, since: .now)
            }
        }
    }

    /// Marks connection `number` as waiting, from now, for its client to read more of a
    /// reply: a client that reads a long reply steadily is never the longest waiting.
    private func setWritingBlocked(_ number: Int, fd: Int32) {
        state.withLock { $0.waiting[number] = WaitingConnection(fd: fd, since: .now, writing: true) }
    }

    private func serve(_ fd: Int32, _ peer: PeerCredentials, number: Int) {
        defer { setWaiting(number, fd: fd, false) }
        guard configuration.authorize(peer) else {
            _ = writeLine(fd, rejectionReply(.peerNotPermitted(peer)),
                          deadline: .now.advanced(by: configuration.writeTimeout))
            return
        }
        let limit = configuration.maximumLineLength
        var buffer: [UInt8] = []
        var scanned = 0  // bytes of `buffer` known to hold no newline
        var lineStarted: ContinuousClock.Instant?
        while true {
            // Answer every complete line already buffered, in order.
            while let newline = buffer[scanned...].firstIndex(of: UInt8(ascii: "\n")) {
                var line = buffer[..<newline]
                buffer.removeSubrange(...newline)
                scanned = 0
                lineStarted = buffer.isEmpty ? nil : .now
                if line.last == UInt8(ascii: "\r") { line = line.dropLast() }
                if line.count > limit {
                    _ = writeLine(fd, rejectionReply(.lineTooLong(limit: limit)),
                                  deadline: .now.advanced(by: configuration.writeTimeout))
                    return
                }
                if line.isEmpty { continue }
                setWaiting(number, fd: fd, false)  // a request is in hand: not to be closed for room
                let reply: String
                if let request = String(validating: line, as: UTF8.self) {
                    reply = immediate?(request, peer) ?? callHandler(request, peer)
                } else {
                    reply = rejectionReply(.invalidUTF8(line: Array(line)))
                }
                // A client that does not read this reply may lose its place to a new one.
                guard writeLine(fd, reply, deadline: .now.advanced(by: configuration.writeTimeout),
                                whenBlocked: { self.setWritingBlocked(number, fd: fd) })
                else { return }
                setWaiting(number, fd: fd, false)
                if isStopping { return }
            }
            scanned = buffer.count
            if buffer.count > limit {
                _ = writeLine(fd, rejectionReply(.lineTooLong(limit: limit)),
                              deadline: .now.advanced(by: configuration.writeTimeout))
                return
            }
            let deadline = lineStarted.map { $0.advanced(by: configuration.requestTimeout) }
                ?? .now.advanced(by: configuration.idleTimeout)
            setWaiting(number, fd: fd, true)
            switch read(fd, into: &buffer, deadline: deadline) {
            case .data:
                if lineStarted == nil && !buffer.isEmpty { lineStarted = .now }
            case .timedOut:
                if lineStarted != nil {
                    _ = writeLine(fd, rejectionReply(.timedOut), deadline: .now.advanced(by: .milliseconds(100)))
                }
                return
            case .closed, .stopping:
                return
            }
        }
    }

    /// Waits for data until `deadline` (or stop) and appends what one `read` returns.
    private func read(_ fd: Int32, into buffer: inout [UInt8], deadline: ContinuousClock.Instant) -> ReadOutcome {
        var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: wake.fd, events: Int16(POLLIN), revents: 0)]
        while true {
            fds[0].revents = 0
            fds[1].revents = 0
            guard let ready = try? pollDescriptors(&fds, timeout: pollTimeout(until: deadline)) else { return .closed }
            if fds[1].revents != 0 { return .stopping }
            if ready == 0 { return .timedOut }
            var chunk = [UInt8](repeating: 0, count: 16 * 1024)
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                buffer.append(contentsOf: chunk[..<count])
                return .data
            }
            if count == 0 { return .closed }
            let code = Glibc.errno
            if code == EAGAIN || code == EWOULDBLOCK || code == EINTR { continue }
            return .closed
        }
    }

    /// Runs the async handler from this connection thread and waits for its reply. The
    /// thread is ours (not the cooperative pool), so blocking it is fine.
    private func callHandler(_ request: String, _ peer: PeerCredentials) -> String {
        let box = ReplyBox()
        let handler = self.handler
        Task {
            let reply = await handler(request, peer)
            box.put(reply)
        }
        return box.take()
    }

    private func writeLine(_ fd: Int32, _ text: String, deadline: ContinuousClock.Instant, whenBlocked: (() -> Void)? = nil) -> Bool {
        writeAll(fd, Array(Self.oneLine(text).utf8) + [UInt8(ascii: "\n")], deadline: deadline, whenBlocked: whenBlocked)
    }

    /// `text` with line breaks turned into spaces, so it stays one protocol line.
    static func oneLine(_ text: String) -> String {
        guard text.utf8.contains(where: { $0 == 10 || $0 == 13 }) else { return text }
        return String(text.map { $0 == "\n" || $0 == "\r" || $0 == "\r\n" ? " " : $0 })
    }
}

/// Hands one reply from a task to a waiting thread: `take` blocks until `put` has run,
/// once. The waiter is a connection thread of the server's own, not a task, so it cannot
/// await an actor or an `AsyncStream`; it blocks on a semaphore, which is fine on a thread
/// that serves one connection.
private final class ReplyBox: Sendable {
    private let value = Mutex<String?>(nil)
    private let ready = DispatchSemaphore(value: 0)

    func put(_ reply: String) {
        value.withLock { $0 = reply }
        ready.signal()
    }

    func take() -> String {
        ready.wait()
        return value.withLock { $0 ?? "" }
    }
}

// MARK: Shared socket helpers

/// Connects a non-blocking, close-on-exec stream socket to `path` (or `@abstract`).
func connectUnix(_ path: String) -> Result<Int32, SystemError> {
    do throws(SystemError) {
        var (address, length) = try UnixSocketAddress.make(path)
        let fd = try valueOrErrno("socket") {
            socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        }
        do throws(SystemError) {
            try valueOrErrno("connect", subject: path) {
                withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, length) }
                }
            }
        } catch {
            closeDescriptor(fd)
            throw error
        }
        return .success(fd)
    } catch {
        return .failure(error)
    }
}

/// Writes all of `bytes` to a non-blocking socket by `deadline`; false on timeout or error.
/// Uses `MSG_NOSIGNAL` so a vanished peer never raises SIGPIPE. `whenBlocked` runs each
/// time the socket has no room after bytes were written since the last time (or at all).
func writeAll(_ fd: Int32, _ bytes: [UInt8], deadline: ContinuousClock.Instant, whenBlocked: (() -> Void)? = nil) -> Bool {
    var offset = 0
    var blocked = false
    while offset < bytes.count {
        let count = bytes.withUnsafeBytes { raw in
            send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
        }
        if count > 0 {
            offset += count
            blocked = false
            continue
        }
        let code = Glibc.errno
        guard count < 0, code == EAGAIN || code == EWOULDBLOCK || code == EINTR else { return false }
        if !blocked, code != EINTR {
            blocked = true
            whenBlocked?()
        }
        var fds = [pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)]
        guard let ready = try? pollDescriptors(&fds, timeout: pollTimeout(until: deadline)), ready > 0 else { return false }
    }
    return true
}
