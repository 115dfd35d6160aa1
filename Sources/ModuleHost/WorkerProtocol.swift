import Glibc
import ModuleKit
import Synchronization

/// The wire format between `modhostd` and a `modhost-worker` (docs/isolation.md): over one
/// UNIX stream socket (a socketpair; descriptor 3 in the worker), a sequence of frames,
/// each a 4-byte big-endian length N (1 ≤ N ≤ `maximumSize`) followed by N bytes of one
/// JSON object (ModuleKit's strict parser). What a frame says is in docs/isolation.md;
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
        guard let frame = WorkerFrame.encode(message) else { return false }
        return writing.withLock { _ in
            frame.withUnsafeBytes { bytes in
                var done = 0
                while done < bytes.count {
                    let n = Glibc.send(fd, bytes.baseAddress! + done, bytes.count - done, Int32(MSG_NOSIGNAL))
                    if n < 0 && errno == EINTR { continue }
                    guard n > 0 else { return false }
                    done += n
                }
                return true
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
    private var buffer: [UInt8] = []
    private var start = 0

    init(fd: Int32) { self.fd = fd }

    /// Why reading stopped.
    enum End: Error, CustomStringConvertible {
        case closed
        case failed(Int32)
        case invalid(String)

        var description: String {
            switch self {
            case .closed: "the other end closed the connection"
            case .failed(let code): "read failed: \(String(cString: strerror(code)))"
            case .invalid(let reason): "invalid frame: \(reason)"
            }
        }
    }

    /// The next message, blocking until it has arrived whole.
    mutating func next() throws(End) -> JSONValue {
        let header = try take(4)
        let length = header.reduce(0) { $0 << 8 | Int($1) }
        guard length >= 1, length <= WorkerFrame.maximumSize else {
            throw .invalid("length \(length) is outside 1...\(WorkerFrame.maximumSize)")
        }
        let body = try take(length)
        let value: JSONValue
        do {
            value = try JSONValue.parse(body)
        } catch {
            throw .invalid("\(error)")
        }
        guard case .object = value else { throw .invalid("the frame holds \(value.kind), expected an object") }
        return value
    }

    private mutating func take(_ count: Int) throws(End) -> [UInt8] {
        while buffer.count - start < count {
            if start > 0 {
                buffer.removeFirst(start)
                start = 0
            }
            let want = max(65_536, count - buffer.count)
            let old = buffer.count
            buffer.append(contentsOf: repeatElement(0, count: want))
            let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + old, want) }
            if got < 0 {
                buffer.removeLast(want)
                if errno == EINTR { continue }
                throw .failed(errno)
            }
            buffer.removeLast(want - got)
            if got == 0 { throw .closed }
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
