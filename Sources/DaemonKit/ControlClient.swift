#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// A connection to a `ControlServer`: send a line, read the reply line, with a timeout.
///
/// - `init` connects (retrying while the server's backlog is full, up to `timeout`) and
///   checks who listens (`SO_PEERCRED`): unless `trust` accepts the listener (by default
///   root, our own effective uid or the `modhostd` service account), it throws `.untrustedPeer` before anything is sent,
///   so a socket another user bound first at a shared path is never talked to.
/// - `request(_:)` sends one line and returns the next reply line without its newline.
///   Concurrent calls on one client are serialized (each gets its own reply, in order);
///   use several clients for parallel requests.
/// - Every blocking step is bounded by `timeout`, measured per request. After a timeout or
///   error the connection is closed and further requests throw `.connectionClosed`.
/// - The descriptor is close-on-exec, writes never raise SIGPIPE, and it is closed by
///   `close()` or deinit.
/// - Calls block the calling thread (this is for `modhostctl` and tests); from async code
///   in a server, run them on a thread of their own rather than the cooperative pool.
public final class ControlClient: Sendable {
    private struct Connection {
        var fd: Int32
        var buffer: [UInt8] = []
    }

    /// The socket path this client is connected to.
    public let socketPath: String
    /// Upper bound for connecting and for each request.
    public let timeout: Duration
    /// Longest reply line accepted, in bytes. Default 16 MiB.
    public let maximumLineLength: Int
    private let connection: Mutex<Connection>

    /// Connects to the server at `socketPath` (a path or `@abstract` name). Throws
    /// `.system` (e.g. `ENOENT`: no daemon; `ECONNREFUSED`: stale socket), `.timedOut`, or
    /// `.untrustedPeer` when `trust` refuses the listener's credentials.
    /// The longest reply line a client reads by default, in bytes (16 MiB): a server of
    /// this protocol never sends a longer one (`ControlService` replaces it with an error).
    public static let maximumReplyLength = 16 << 20

    public init(socketPath: String, timeout: Duration = .seconds(5), maximumLineLength: Int = ControlClient.maximumReplyLength,
                trust: @Sendable (PeerCredentials) -> Bool = ControlServer.trustedDaemon)
        throws(ControlSocketError)
    {
        self.socketPath = socketPath
        self.timeout = timeout
        self.maximumLineLength = maximumLineLength
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while true {
            switch connectUnix(socketPath) {
            case .success(let fd):
                let peer: PeerCredentials
                do throws(SystemError) {
                    peer = try PeerCredentials(socket: fd)
                } catch {
                    closeDescriptor(fd)
                    throw .system(error)
                }
                guard trust(peer) else {
                    closeDescriptor(fd)
                    throw .untrustedPeer(path: socketPath, peer: peer)
                }
                connection = Mutex(Connection(fd: fd))
                return
            case .failure(let error) where error.code == EAGAIN && ContinuousClock.now < deadline:
                usleep(5_000)  // backlog full: the server is busy accepting
            case .failure(let error) where error.code == EAGAIN:
                throw .timedOut(operation: "connect(\(socketPath))")
            case .failure(let error):
                throw .system(error)
            }
        }
    }

    /// Sends `line` (line breaks inside it become spaces) and returns the reply line.
    public func request(_ line: String) throws(ControlSocketError) -> String {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        let limit = maximumLineLength
        let path = socketPath
        let result: Result<String, ControlSocketError> = connection.withLock { connection in
            guard connection.fd >= 0 else { return .failure(.connectionClosed) }
            let outcome = Self.exchange(&connection, line: line, deadline: deadline, limit: limit, path: path)
            if case .failure = outcome {
                closeDescriptor(connection.fd)
                connection.fd = -1
            }
            return outcome
        }
        return try result.get()
    }

    /// Closes the connection; later requests throw `.connectionClosed`. Idempotent.
    public func close() {
        connection.withLock { connection in
            closeDescriptor(connection.fd)
            connection.fd = -1
        }
    }

    deinit { close() }

    /// Connects, sends one request, reads the reply and closes: what a CLI command needs.
    public static func request(_ line: String, socketPath: String, timeout: Duration = .seconds(5))
        throws(ControlSocketError) -> String
    {
        let client = try ControlClient(socketPath: socketPath, timeout: timeout)
        defer { client.close() }
        return try client.request(line)
    }

    private static func exchange(
        _ connection: inout Connection, line: String, deadline: ContinuousClock.Instant, limit: Int, path: String
    ) -> Result<String, ControlSocketError> {
        let flat = line.utf8.contains(where: { $0 == 10 || $0 == 13 })
            ? String(line.map { $0 == "\n" || $0 == "\r" || $0 == "\r\n" ? " " : $0 }) : line
        if !writeAll(connection.fd, Array(flat.utf8) + [UInt8(ascii: "\n")], deadline: deadline),
           ContinuousClock.now >= deadline
        {
            return .failure(.timedOut(operation: "sending to \(path)"))
        }
        // Even if the write failed (the server hung up), a line it sent before closing, such
        // as "peer not permitted", is still readable: read on, EOF ends in .connectionClosed.
        var scanned = 0
        while true {
            if let newline = connection.buffer[scanned...].firstIndex(of: UInt8(ascii: "\n")) {
                var reply = connection.buffer[..<newline]
                if reply.last == UInt8(ascii: "\r") { reply = reply.dropLast() }
                // Also when the whole line came in one read.
                if reply.count > limit { return .failure(.lineTooLong(limit: limit)) }
                let text = String(decoding: reply, as: UTF8.self)
                connection.buffer.removeSubrange(...newline)
                return .success(text)
            }
            scanned = connection.buffer.count
            if connection.buffer.count > limit { return .failure(.lineTooLong(limit: limit)) }
            var fds = [pollfd(fd: connection.fd, events: Int16(POLLIN), revents: 0)]
            let ready: Int32
            do throws(SystemError) {
                ready = try pollDescriptors(&fds, timeout: pollTimeout(until: deadline))
            } catch {
                return .failure(.system(error))
            }
            if ready == 0 { return .failure(.timedOut(operation: "waiting for a reply from \(path)")) }
            var chunk = [UInt8](repeating: 0, count: 64 * 1024)
            let count = chunk.withUnsafeMutableBytes { recv(connection.fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                connection.buffer.append(contentsOf: chunk[..<count])
            } else if count == 0 {
                return .failure(.connectionClosed)
            } else {
                let code = Glibc.errno
                if code == EAGAIN || code == EWOULDBLOCK || code == EINTR { continue }
                if code == ECONNRESET { return .failure(.connectionClosed) }
                return .failure(.system(SystemError("recv", code: code, subject: path)))
            }
        }
    }
}
