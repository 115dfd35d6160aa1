import CDynamicLoader
import DaemonKit
import Glibc
@_spi(ModuleHost) import ModuleKit
import Synchronization

/// The wire format between `modhostd` and a `modhost-worker` (docs/isolation.md): over
/// each of three UNIX stream sockets (socketpairs; descriptors 3, 4 and 5 in the worker), a
/// sequence of frames, each a 4-byte big-endian length N (1 ≤ N ≤ `maximumSize`) followed
/// by N bytes of one JSON object (ModuleKit's strict parser): one encoding for every
/// frame, both ways. What a frame says is in docs/isolation.md; this file only moves
/// frames.
enum WorkerFrame {
    /// The largest frame body, in bytes (16 MiB): a payload, a state or a call result
    /// larger than this is refused, not read.
    static let maximumSize = 16 << 20
    /// The largest frame body a worker may write on its control socket (1 MiB): logs,
    /// notifications it posts, its questions and its answers to awaited events. One thread
    /// of the daemon reads every worker's control socket, so one worker's frame must not
    /// take it long: a larger frame ends the worker (its own end refuses to write one).
    static let controlMaximumSize = 1 << 20

    /// The frame carrying `message`, nil when its text is longer than `maximumSize`. Given
    /// an `id`, the message (an object without one) gets it as member "id". The text is written right
    /// after room for the header, in one buffer.
    static func encode(_ message: JSONValue, id: JSONValue? = nil) -> [UInt8]? {
        var frame: [UInt8] = [0, 0, 0, 0]
        frame.reserveCapacity(256)
        message.appendJSONText(to: &frame)
        if let id, case .object(let members) = message {
            frame.removeLast()  // "}"
            appendID(id, after: !members.isEmpty, to: &frame)
        }
        return finish(&frame) ? frame : nil
    }

    /// The frame carrying the object of `members` (each name once, none "id"), in their
    /// order, and, given an `id`, member "id": each name and value as `JSONValue.jsonText`
    /// writes it, without building a dictionary first. Nil when longer than `maximumSize`.
    static func encode(members: KeyValuePairs<String, JSONValue>, id: JSONValue? = nil) -> [UInt8]? {
        var frame: [UInt8] = [0, 0, 0, 0, UInt8(ascii: "{")]
        frame.reserveCapacity(256)
        for (index, member) in members.enumerated() {
            if index > 0 { frame.append(UInt8(ascii: ",")) }
            JSONValue.string(member.key).appendJSONText(to: &frame)
            frame.append(UInt8(ascii: ":"))
            member.value.appendJSONText(to: &frame)
        }
        if let id {
            appendID(id, after: !members.isEmpty, to: &frame)
        } else {
            frame.append(UInt8(ascii: "}"))
        }
        return finish(&frame) ? frame : nil
    }

    /// Appends `"id":ID}` to an object's text whose `}` is not written yet (after a comma
    /// when it has members).
    private static func appendID(_ id: JSONValue, after members: Bool, to frame: inout [UInt8]) {
        if members { frame.append(UInt8(ascii: ",")) }
        JSONValue.string("id").appendJSONText(to: &frame)
        frame.append(UInt8(ascii: ":"))
        id.appendJSONText(to: &frame)
        frame.append(UInt8(ascii: "}"))
    }

    /// Fills in `frame`'s header (in place: the frame is not copied); false when its body
    /// is empty or too large.
    static func finish(_ frame: inout [UInt8]) -> Bool {
        let count = frame.count - 4
        guard count >= 1, count <= maximumSize else { return false }
        for index in 0..<4 { frame[index] = UInt8(truncatingIfNeeded: count >> (24 - 8 * index)) }
        return true
    }

    /// Waits until `fd` is ready for `events` (or has hung up) or `deadline` (nil: none)
    /// has passed; false when the deadline passed first.
    static func wait(_ fd: Int32, for events: Int16, until deadline: ContinuousClock.Instant?) -> Bool {
        guard let deadline else {
            var entry = pollfd(fd: fd, events: events, revents: 0)
            while poll(&entry, 1, -1) < 0 && errno == EINTR {}
            return true
        }
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

/// How the daemon's memory follows what workers send it: a frame, a call's result or a
/// reply of megabytes is returned to the system once it is freed (`FrameReader` lets go of
/// its large buffers too), however many came before.
public enum LargeBlocks {
    /// The smallest block that gets a mapping of its own (glibc's default threshold).
    static let mappedFrom = 128 << 10

    /// Has every block of 128 KiB or more mapped on its own, and so unmapped when freed,
    /// for the rest of the process's life: glibc otherwise raises that threshold to the
    /// largest block freed so far (up to 32 MiB), after which such blocks come from heaps
    /// that keep them once freed: a worker's frames of 16 MiB, or a call's results, then
    /// leave the daemon tens of megabytes larger for good. Called by modhostd at its start.
    public static func returnToTheSystemWhenFreed() {
        _ = modhost_malloc_map_blocks_from(Int32(mappedFrom))
    }
}

/// One end of a worker socket: `send` from any thread (one frame at a time, whole);
/// `FrameReader` on the one thread that reads.
final class WorkerChannel: Sendable {
    let fd: Int32
    /// The largest frame body it writes; a larger message is not sent (`gone`).
    let maximumSize: Int
    private let writing = Mutex(())

    init(fd: Int32, maximumSize: Int = WorkerFrame.maximumSize) {
        self.fd = fd
        self.maximumSize = maximumSize
    }

    /// Whether the socket holds bytes no one has read yet (or has hung up), now.
    var hasUnreadInput: Bool {
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, 0) == 1 && entry.revents != 0
    }

    /// Writes `message` as one frame; false when the other end is gone or the message is
    /// too large.
    @discardableResult
    func send(_ message: JSONValue) -> Bool {
        send(message, until: nil) == .sent
    }

    /// What became of a frame `send(_:until:)` was given.
    enum Sent: Equatable, Sendable {
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
        send(frame: WorkerFrame.encode(message), until: deadline)
    }

    /// Writes `frame` (from `WorkerFrame.encode`; nil: too large), as `send(_:until:)`.
    func send(frame: [UInt8]?, until deadline: ContinuousClock.Instant?) -> Sent {
        guard let frame, frame.count - 4 <= maximumSize else { return .gone }
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

/// The daemon's sending end of a worker socket whose senders must never wait for room in it
/// (calls by name, awaited events, the worker poller's answers): a frame the socket takes
/// whole at once is written by the sender's thread; the rest of a frame it has no room for,
/// and the frames queued behind it, by the worker poller when the socket has room again
/// (`flush`), each by its deadline. No thread of its own, and no thread waits.
///
/// A frame not written whole by its deadline leaves the stream out of step: that frame is
/// `timedOut`, every other one `gone`, and the poller kills the worker for the reason the
/// frame was given.
final class FrameOutbox: Sendable {
    let channel: WorkerChannel

    /// Why the worker is killed when a frame is not written whole by its deadline: "it did
    /// not ACTION SUBJECT within DEADLINE", written out only then (a frame that is written
    /// at once costs no text and no closure).
    struct Overdue: Sendable {
        let action: String
        let subject: String
        let within: Duration

        init(_ action: String, _ subject: String = "", within: Duration) {
            self.action = action
            self.subject = subject
            self.within = within
        }

        var reason: String { "it did not \(action)\(subject.isEmpty ? "" : " " + subject) within \(within.secondsText)" }
    }

    private struct Queued {
        let frame: [UInt8]
        var written: Int
        let deadline: ContinuousClock.Instant
        let overdue: Overdue
        let done: FirstResult<WorkerChannel.Sent>
    }

    private struct State {
        /// In order; the first may be partly written.
        var queue: [Queued] = []
        /// A frame could not be written whole (the other end is gone, or a deadline
        /// passed): nothing more is written.
        var broken = false
    }
    private let state = Mutex(State())

    init(_ channel: WorkerChannel) { self.channel = channel }

    /// What `enqueue` decided now.
    enum Enqueued {
        /// The frame's fate is known already: written whole now, or not to be written.
        case finished(WorkerChannel.Sent)
        /// It waits for room in the socket (the poller must be asked to `flush`); its fate
        /// comes later.
        case waiting(FirstResult<WorkerChannel.Sent>)
    }

    /// Queues `frame` (from `WorkerFrame.encode`; nil: too large, `gone`), in the order
    /// `enqueue` was called, to be written whole no later than `deadline`, without waiting:
    /// what the socket takes now is written now. `overdue`: why the worker is killed if the
    /// frame is not written whole in time.
    func enqueue(_ frame: [UInt8]?, until deadline: ContinuousClock.Instant, overdue: Overdue) -> Enqueued {
        guard let frame else { return .finished(.gone) }
        return state.withLock { state -> Enqueued in
            guard !state.broken else { return .finished(.gone) }
            var written = 0
            if state.queue.isEmpty {
                switch Self.write(channel.fd, frame, &written) {
                case .whole: return .finished(.sent)
                case .noRoom: break
                case .failed:
                    state.broken = true
                    return .finished(.gone)
                }
            }
            let done = FirstResult<WorkerChannel.Sent>()
            state.queue.append(Queued(frame: frame, written: written, deadline: deadline, overdue: overdue, done: done))
            return .waiting(done)
        }
    }

    /// What `flush` left.
    enum Flushed {
        /// Nothing is queued.
        case empty
        /// Frames wait for room in the socket; the earliest of their deadlines.
        case waiting(until: ContinuousClock.Instant)
        /// A frame was not written whole by its deadline: the worker is to be killed for
        /// this reason (the frames were failed).
        case overdue(String)
    }

    /// From the worker poller, when the socket has room or a deadline has come: writes what
    /// the socket takes now, in order, without waiting; fails the frames once one is overdue
    /// or the other end is gone.
    func flush(now: ContinuousClock.Instant) -> Flushed {
        var finished: [(FirstResult<WorkerChannel.Sent>, WorkerChannel.Sent)] = []
        let left = state.withLock { state -> Flushed in
            func failAll(timedOut late: Int?) {
                for (index, queued) in state.queue.enumerated() { finished.append((queued.done, index == late ? .timedOut : .gone)) }
                state.queue = []
                state.broken = true
            }
            if state.broken {
                failAll(timedOut: nil)
                return .empty
            }
            while !state.queue.isEmpty {
                switch Self.write(channel.fd, state.queue[0].frame, &state.queue[0].written) {
                case .whole:
                    finished.append((state.queue.removeFirst().done, .sent))
                case .noRoom:
                    if let late = state.queue.indices.min(by: { state.queue[$0].deadline < state.queue[$1].deadline }),
                       state.queue[late].deadline <= now {
                        let reason = state.queue[late].overdue.reason
                        failAll(timedOut: late)
                        return .overdue(reason)
                    }
                    return .waiting(until: state.queue.map(\.deadline).min()!)
                case .failed:
                    failAll(timedOut: nil)
                    return .empty
                }
            }
            return .empty
        }
        for (done, sent) in finished { done.finish(sent) }
        return left
    }

    /// Fails every frame still queued (their worker is gone) and writes nothing more.
    func abandon() {
        let dropped = state.withLock { state -> [Queued] in
            state.broken = true
            defer { state.queue = [] }
            return state.queue
        }
        for queued in dropped { queued.done.finish(.gone) }
    }

    private enum Written { case whole, noRoom, failed }

    /// Writes what the socket takes of `frame` from `written` on now, without waiting.
    private static func write(_ fd: Int32, _ frame: [UInt8], _ written: inout Int) -> Written {
        frame.withUnsafeBytes { bytes in
            while written < bytes.count {
                let n = Glibc.send(fd, bytes.baseAddress! + written, bytes.count - written, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                if n < 0 && errno == EINTR { continue }
                if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return .noRoom }
                guard n > 0 else { return .failed }
                written += n
            }
            return .whole
        }
    }
}

/// Reads frames from a worker socket, buffered; used by one thread only.
///
/// What it holds follows what has arrived, not what a header announces: the buffer grows
/// as the bytes of a frame come (at most doubling at a time, never past the frame), so the
/// header of a frame of 16 MiB followed by nothing costs nothing; and a buffer grown past
/// `keptSize` is let go as soon as the frame that grew it has been taken, so one large frame
/// costs its size while it is read, not for the rest of the reader's life.
struct FrameReader {
    let fd: Int32
    /// Bytes read and not yet taken are `buffer[start..<end]`. Most frames are a few hundred
    /// bytes.
    private var buffer = [UInt8](repeating: 0, count: Self.smallSize)
    private var start = 0
    private var end = 0
    /// The largest frame body it takes; a larger frame is `invalid`.
    let maximumSize: Int
    /// The size of a new buffer, and of the room a read asks for at least.
    private static let smallSize = 4096
    /// The largest buffer kept once the frames it held have been taken.
    private static let keptSize = 64 << 10

    init(fd: Int32, maximumSize: Int = WorkerFrame.maximumSize) {
        self.fd = fd
        self.maximumSize = maximumSize
    }

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
            case .failed(let code): "read failed: \(SystemError.describe(code))"
            case .invalid(let reason): "invalid frame: \(reason)"
            }
        }
    }

    /// The next message, blocking until it has arrived whole, or (`deadline`) until then.
    /// A read that timed out took nothing: the next one goes on where it stopped.
    mutating func next(until deadline: ContinuousClock.Instant? = nil) throws(End) -> WorkerMessage {
        try fill(4, until: deadline)
        let length = try length(of: buffer[start..<(start + 4)])
        try fill(4 + length, until: deadline)
        let body = buffer[(start + 4)..<(start + 4 + length)]
        start += 4 + length
        defer { releaseIfLarge() }
        return try Self.message(body)
    }

    /// The next message if it is whole in the buffer, nil when more must be read first
    /// (`receiveAvailable`); never reads.
    mutating func buffered() throws(End) -> WorkerMessage? {
        guard end - start >= 4 else { return nil }
        let length = try length(of: buffer[start..<(start + 4)])
        guard end - start - 4 >= length else { return nil }
        let body = buffer[(start + 4)..<(start + 4 + length)]
        start += 4 + length
        defer { releaseIfLarge() }
        return try Self.message(body)
    }

    /// Whether it holds the start of a frame whose rest has not been read (after every whole
    /// frame has been taken with `buffered()`).
    var holdsUnfinishedFrame: Bool { end > start }

    /// Reads what the socket holds now into the buffer, without waiting (for a thread that
    /// polls many sockets); false when it held nothing. Take every `buffered()` message
    /// first: the buffer grows only to hold the frame being read.
    mutating func receiveAvailable() throws(End) -> Bool {
        if start > 0 { compact() }
        var wanted = Self.smallSize
        if end >= 4 { wanted = max(wanted, 4 + (try length(of: buffer[0..<4]))) }
        makeRoom(toward: wanted)
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

    private func length(of header: some Collection<UInt8>) throws(End) -> Int {
        let length = header.reduce(0) { $0 << 8 | Int($1) }
        guard length >= 1, length <= maximumSize else {
            throw .invalid("length \(length) is outside 1...\(maximumSize)")
        }
        return length
    }

    /// The message of frame body `body` (a slice of the reader's buffer, read before the
    /// buffer changes again).
    static func message(_ body: ArraySlice<UInt8>) throws(End) -> WorkerMessage {
        let document: JSONValue.TopLevel
        do {
            document = try JSONValue.parseKeepingMembers(Array(body))
        } catch {
            throw .invalid("\(error)")
        }
        switch document {
        case .members(let keys, let values): return WorkerMessage(keys: keys, values: values)
        case .other(let value): throw .invalid("the frame holds \(value.kind), expected an object")
        }
    }

    /// Grows a full buffer (what is left of the last read at its front) toward `count`
    /// bytes: to twice its size at most, so that it follows what arrives.
    private mutating func makeRoom(toward count: Int) {
        guard end == buffer.count, buffer.count < count else { return }
        let grown = min(count, max(2 * buffer.count, Self.smallSize))
        buffer.append(contentsOf: repeatElement(0, count: grown - buffer.count))
    }

    /// Lets go of a buffer grown past `keptSize` once what is left in it, the start of the
    /// next frame if any, fits a small one: a large frame's buffer is not kept for the
    /// frames after it, most of them a few hundred bytes.
    private mutating func releaseIfLarge() {
        let left = end - start
        guard buffer.count > Self.keptSize, left <= Self.smallSize else { return }
        var small = [UInt8](repeating: 0, count: Self.smallSize)
        small.withUnsafeMutableBytes { to in
            buffer.withUnsafeBytes { from in
                if left > 0 { to.baseAddress!.copyMemory(from: from.baseAddress! + start, byteCount: left) }
            }
        }
        buffer = small
        start = 0
        end = left
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

    /// Reads, blocking (or until `deadline`), until `count` bytes not yet taken are buffered.
    private mutating func fill(_ count: Int, until deadline: ContinuousClock.Instant?) throws(End) {
        while end - start < count {
            // Waits in poll, not in read, even without a deadline: a thread blocked in read
            // on a stream socket is also woken each time the other end reads what this end
            // wrote (room to write), one wake-up for nothing per request this end answers.
            if !WorkerFrame.wait(fd, for: Int16(POLLIN), until: deadline) { throw .timedOut }
            // What is left of the last read moves to the front (usually nothing).
            if start > 0 { compact() }
            makeRoom(toward: count)
            let room = buffer.count - end
            let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + end, room) }
            if got < 0 {
                if errno == EINTR { continue }
                throw .failed(errno)
            }
            if got == 0 { throw .closed }
            end += got
        }
    }
}

/// How the daemon and its workers read a frame's body, for the worker-frame fuzz target
/// (Tests/Fuzzing): what a plugin's code writes on a worker socket reaches the daemon here.
package enum WorkerFrameReading {
    /// The JSON object `body` reads as, nil when it is invalid.
    package static func message(_ body: [UInt8]) -> JSONValue? { try? FrameReader.message(body[...]).json }

    /// The body of the JSON frame that carries `message` (an object), nil when too large.
    package static func jsonBody(_ message: JSONValue) -> [UInt8]? { WorkerFrame.encode(message).map { Array($0.dropFirst(4)) } }
}

/// What a frame between the daemon and a worker asks or tells, its `op` member: one
/// spelling for both ends (docs/isolation.md, "The worker protocol").
enum WorkerOp: String, Sendable {
    // The daemon's requests to the worker.
    case load, create, event, awaited, configure, info, state, restore, call
    // What the worker tells or asks the daemon.
    case ready, failed, log, post, locate

    /// The op as the value of a frame's `op` member.
    var json: JSONValue { .string(rawValue) }
}

/// The message of one frame: a JSON object, read by ModuleKit's strict parser
/// (`parseKeepingMembers`, the rules of `JSONValue.parse`: a member given twice, invalid
/// UTF-8... make the frame invalid), with its members in the order the frame gave them.
/// A frame has a handful of members, each looked up once or twice: found by comparing
/// names, they cost less than hashing them all into a dictionary.
struct WorkerMessage: Sendable {
    private let keys: [String]
    private let values: [JSONValue]

    init(keys: [String], values: [JSONValue]) {
        self.keys = keys
        self.values = values
    }

    /// Member `key`, nil when there is none.
    subscript(key: String) -> JSONValue? {
        keys.firstIndex(of: key).map { values[$0] }
    }

    /// Member `key` as an integer (a whole number of at most 2^53 in magnitude, which a
    /// JSON number holds exactly), nil otherwise.
    func integer(_ key: String) -> Int? { self[key]?.wholeNumber }

    /// Member `key` as text, nil otherwise.
    func text(_ key: String) -> String? { self[key]?.stringValue }

    /// What the message asks or tells (its `op`), nil for a reply or an op this side does
    /// not know.
    var op: WorkerOp? { text("op").flatMap(WorkerOp.init(rawValue:)) }

    /// The message as a JSON object.
    var json: JSONValue { .object(Dictionary(uniqueKeysWithValues: zip(keys, values))) }
}

extension JSONValue {
    /// A whole number of at most 2^53 in magnitude (which a JSON number holds exactly), nil
    /// otherwise.
    var wholeNumber: Int? {
        guard let number = numberValue, number == number.rounded(), abs(number) <= 9_007_199_254_740_992 else { return nil }
        return Int(number)
    }

    /// Member `key` as an integer (a whole number of at most 2^53 in magnitude), nil
    /// otherwise.
    func integer(_ key: String) -> Int? { self[key]?.wholeNumber }

    /// Member `key` as text, nil otherwise.
    func text(_ key: String) -> String? { self[key]?.stringValue }
}
