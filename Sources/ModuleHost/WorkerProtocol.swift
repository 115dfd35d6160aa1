import Glibc
import ModuleKit
import Synchronization

/// The wire format between `modhostd` and a `modhost-worker` (docs/isolation.md): over
/// each of three UNIX stream sockets (socketpairs; descriptors 3, 4 and 5 in the worker), a
/// sequence of frames, each a 4-byte big-endian length N (1 ≤ N ≤ `maximumSize`) followed
/// by N bytes of one JSON object (ModuleKit's strict parser). What a frame says is in docs/isolation.md;
/// this file only moves frames.
enum WorkerFrame {
    /// The largest frame body, in bytes (16 MiB): a payload, a state or a call result
    /// larger than this is refused, not read.
    static let maximumSize = 16 << 20

    /// The frame carrying `message`, nil when its text is longer than `maximumSize`.
    static func encode(_ message: JSONValue) -> [UInt8]? {
        let body = Array(message.jsonText.utf8)
        guard !body.isEmpty, body.count <= maximumSize else { return nil }
        let count = UInt32(body.count)
        return [UInt8(count >> 24), UInt8((count >> 16) & 0xff), UInt8((count >> 8) & 0xff), UInt8(count & 0xff)] + body
    }

    /// Waits until `fd` is ready for `events` (or has hung up) or `deadline` has passed;
    /// false when the deadline passed first.
    static func wait(_ fd: Int32, for events: Int16, until deadline: ContinuousClock.Instant) -> Bool {
        while true {
            let left = deadline - ContinuousClock.now
            guard left > .zero else { return false }
            // Whole milliseconds, rounded up: never earlier than the deadline.
            let (seconds, attoseconds) = left.components
            let milliseconds = seconds >= Int64(Int32.max / 1000) ? Int32.max : Int32(seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
            var entry = pollfd(fd: fd, events: events, revents: 0)
            let n = poll(&entry, 1, milliseconds)
            if n > 0 { return true }
            if n < 0 && errno != EINTR { return true }  // the read or write that follows says why
        }
    }
}

/// One end of a worker socket: `send` from any thread (one frame at a time, whole);
/// `FrameReader` on the one thread that reads.
final class WorkerChannel: Sendable {
    let fd: Int32
    private let writing = Mutex(())

    init(fd: Int32) { self.fd = fd }

    /// Writes `message` as one frame; false when the other end is gone or the message is
    /// too large.
    @discardableResult
    func send(_ message: JSONValue) -> Bool {
        send(message, until: nil) == .sent
    }

    /// What became of a frame `send(_:until:)` was given.
    enum Sent: Equatable {
        case sent
        /// The other end is gone (or the message is larger than a frame).
        case gone
        /// The deadline passed with part of the frame unwritten: the stream is now out of
        /// step, the connection unusable.
        case timedOut
    }

    /// Writes `message` as one frame, waiting for room in the socket no later than
    /// `deadline` (nil: as long as it takes).
    func send(_ message: JSONValue, until deadline: ContinuousClock.Instant?) -> Sent {
        guard let frame = WorkerFrame.encode(message) else { return .gone }
        return writing.withLock { _ in
            frame.withUnsafeBytes { bytes in
                var done = 0
                while done < bytes.count {
                    let flags = Int32(MSG_NOSIGNAL) | (deadline == nil ? 0 : Int32(MSG_DONTWAIT))
                    let n = Glibc.send(fd, bytes.baseAddress! + done, bytes.count - done, flags)
                    if n < 0 && errno == EINTR { continue }
                    if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), let deadline {
                        guard WorkerFrame.wait(fd, for: Int16(POLLOUT), until: deadline) else { return .timedOut }
                        continue
                    }
                    guard n > 0 else { return .gone }
                    done += n
                }
                return .sent
            }
        }
    }

    /// Ends both directions: a reader on either side sees the end of the stream.
    func shutDown() { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }

    deinit { close(fd) }
}

/// Reads frames from a worker socket, buffered; used by one thread only.
struct FrameReader {
    let fd: Int32
    /// Bytes read and not yet taken are `buffer[start..<end]`; it grows to the largest
    /// frame read (at most `WorkerFrame.maximumSize`) and never shrinks. Most frames are a
    /// few hundred bytes.
    private var buffer = [UInt8](repeating: 0, count: 4096)
    private var start = 0
    private var end = 0

    init(fd: Int32) { self.fd = fd }

    /// Why reading stopped.
    enum End: Error, CustomStringConvertible {
        case closed
        case failed(Int32)
        case invalid(String)
        /// The deadline `next(until:)` was given passed first.
        case timedOut

        var description: String {
            switch self {
            case .closed: "the other end closed the connection"
            case .timedOut: "no frame arrived in time"
            case .failed(let code): "read failed: \(String(cString: strerror(code)))"
            case .invalid(let reason): "invalid frame: \(reason)"
            }
        }
    }

    /// The next message, blocking until it has arrived whole, or (`deadline`) until then.
    mutating func next(until deadline: ContinuousClock.Instant? = nil) throws(End) -> JSONValue {
        let length = try Self.length(of: try take(4, until: deadline))
        return try Self.message(try take(length, until: deadline))
    }

    /// The next message if it is whole in the buffer, nil when more must be read first
    /// (`receiveAvailable`); never reads.
    mutating func buffered() throws(End) -> JSONValue? {
        guard end - start >= 4 else { return nil }
        let length = try Self.length(of: buffer[start..<(start + 4)])
        guard end - start - 4 >= length else { return nil }
        let body = Array(buffer[(start + 4)..<(start + 4 + length)])
        start += 4 + length
        return try Self.message(body)
    }

    /// Reads what the socket holds now into the buffer, without waiting (for a thread that
    /// polls many sockets); false when it held nothing. Take every `buffered()` message
    /// first: the buffer grows only to hold the frame being read.
    mutating func receiveAvailable() throws(End) -> Bool {
        if start > 0 { compact() }
        var wanted = 4096
        if end >= 4 { wanted = max(wanted, 4 + (try Self.length(of: buffer[0..<4]))) }
        if buffer.count < wanted { buffer.append(contentsOf: repeatElement(0, count: wanted - buffer.count)) }
        let room = buffer.count - end
        guard room > 0 else { return false }
        while true {
            let got = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + end, room, Int32(MSG_DONTWAIT)) }
            if got < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { return false }
                throw .failed(errno)
            }
            if got == 0 { throw .closed }
            end += got
            return true
        }
    }

    private static func length(of header: some Collection<UInt8>) throws(End) -> Int {
        let length = header.reduce(0) { $0 << 8 | Int($1) }
        guard length >= 1, length <= WorkerFrame.maximumSize else {
            throw .invalid("length \(length) is outside 1...\(WorkerFrame.maximumSize)")
        }
        return length
    }

    private static func message(_ body: [UInt8]) throws(End) -> JSONValue {
        let value: JSONValue
        do {
            value = try JSONValue.parse(body)
        } catch {
            throw .invalid("\(error)")
        }
        guard case .object = value else { throw .invalid("the frame holds \(value.kind), expected an object") }
        return value
    }

    /// Moves what is left of the last read to the front of the buffer.
    private mutating func compact() {
        buffer.withUnsafeMutableBytes { bytes in
            let base = bytes.baseAddress!
            _ = memmove(base, base + start, end - start)
        }
        end -= start
        start = 0
    }

    private mutating func take(_ count: Int, until deadline: ContinuousClock.Instant?) throws(End) -> [UInt8] {
        while end - start < count {
            if let deadline, !WorkerFrame.wait(fd, for: Int16(POLLIN), until: deadline) { throw .timedOut }
            // What is left of the last read moves to the front (usually nothing).
            if start > 0 { compact() }
            if buffer.count < count { buffer.append(contentsOf: repeatElement(0, count: count - buffer.count)) }
            let room = buffer.count - end
            let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + end, room) }
            if got < 0 {
                if errno == EINTR { continue }
                throw .failed(errno)
            }
            if got == 0 { throw .closed }
            end += got
        }
        let bytes = Array(buffer[start..<(start + count)])
        start += count
        return bytes
    }
}

extension JSONValue {
    /// Member `key` as an integer (a whole number that fits an Int), nil otherwise.
    func integer(_ key: String) -> Int? {
        guard let number = self[key]?.numberValue, number == number.rounded(), abs(number) < 9.0e15 else { return nil }
        return Int(number)
    }

    /// Member `key` as text, nil otherwise.
    func text(_ key: String) -> String? { self[key]?.stringValue }
}
