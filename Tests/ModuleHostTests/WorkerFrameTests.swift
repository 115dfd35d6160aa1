import Foundation
import Glibc
import ModuleKit
import Testing
@testable import ModuleHost

/// The frames between the daemon and its worker processes (docs/isolation.md, "Frames"):
/// what one end writes, the other reads back whole and the same, however the bytes arrive;
/// what is no valid frame is refused, never guessed.
@Suite(.timeLimit(.minutes(5))) struct WorkerFrameTests {
    /// Two connected stream sockets, closed at the end of the test.
    final class Pair {
        let ours: Int32
        let theirs: Int32
        init() {
            var ends: [Int32] = [-1, -1]
            precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &ends) == 0)
            ours = ends[0]
            theirs = ends[1]
        }
        func write(_ bytes: [UInt8]) {
            bytes.withUnsafeBytes { precondition(Glibc.write(theirs, $0.baseAddress!, $0.count) == $0.count) }
        }
        deinit {
            close(ours)
            close(theirs)
        }
    }

    static func header(_ count: Int) -> [UInt8] { (0..<4).map { UInt8(truncatingIfNeeded: count >> (24 - 8 * $0)) } }

    /// What `encode` writes: a 4-byte length, then the object, with the id as member "id".
    @Test func aFrameIsItsLengthThenTheObjectWithItsID() throws {
        let members = WorkerFrame.encode(members: ["op": "event", "module": "echo", "payload": ["b": [1, 2.5], "a": nil]], id: 7)!
        let body = Array(members.dropFirst(4))
        #expect(Array(members.prefix(4)) == Self.header(body.count))
        #expect(String(decoding: body, as: UTF8.self) == #"{"op":"event","module":"echo","payload":{"a":null,"b":[1,2.5]},"id":7}"#)
        let object = WorkerFrame.encode(["stuck": "event tick"], id: 12)!
        #expect(String(decoding: object.dropFirst(4), as: UTF8.self) == #"{"stuck":"event tick","id":12}"#)
        #expect(String(decoding: WorkerFrame.encode([:], id: 3)!.dropFirst(4), as: UTF8.self) == #"{"id":3}"#)
        #expect(String(decoding: WorkerFrame.encode(members: [:])!.dropFirst(4), as: UTF8.self) == "{}")
        #expect(String(decoding: WorkerFrame.encode(["b": 1, "a": "\u{1B}"])!.dropFirst(4), as: UTF8.self) == #"{"a":"\u001b","b":1}"#)
    }

    /// A frame that arrives a few bytes at a time (its header split too) is read whole, and
    /// two frames in one write are two messages.
    @Test func aFrameSplitAcrossReadsIsReadWholeAndFramesInOneWriteApart() throws {
        let pair = Pair()
        var reader = FrameReader(fd: pair.ours)
        let frame = WorkerFrame.encode(members: ["op": "call", "function": "echo_add", "json": [2, 3]], id: 41)!
        let writer = Thread { [theirs = pair.theirs] in
            var offset = 0
            for size in [1, 2, 3, 5, 8, 13] + Array(repeating: 21, count: frame.count / 21 + 1) where offset < frame.count {
                let end = min(frame.count, offset + size)
                frame[offset..<end].withUnsafeBytes { _ = Glibc.write(theirs, $0.baseAddress!, $0.count) }
                offset = end
                usleep(2_000)
            }
        }
        writer.start()
        let message = try reader.next(until: .now + .seconds(10))
        #expect(message.text("op") == "call" && message.text("function") == "echo_add" && message.integer("id") == 41)
        #expect(message["json"] == [2, 3])
        #expect(message["missing"] == nil)
        #expect(message.json == ["op": "call", "function": "echo_add", "json": [2, 3], "id": 41])

        pair.write(WorkerFrame.encode(["id": 1])! + WorkerFrame.encode(["id": 2])!)
        #expect(try reader.next(until: .now + .seconds(10)).integer("id") == 1)
        #expect(try reader.buffered()?.integer("id") == 2)
        #expect(try reader.buffered() == nil)
    }

    /// A frame the socket has room for is written at once, with nothing left to wait for; one
    /// it has no room for waits, and the frames behind it too, until `flush` writes them or
    /// fails them once the first is overdue: that one `timedOut` with the reason its worker is
    /// killed for, the others `gone`, and nothing is written afterwards.
    @Test func anOutboxWritesAtOnceWhatFitsAndFailsWhatIsOverdue() throws {
        let pair = Pair()
        let outbox = FrameOutbox(WorkerChannel(fd: dup(pair.theirs)))
        let deadline = ContinuousClock.now + .seconds(60)
        let call = FrameOutbox.Overdue("read call", "echo_add", within: .seconds(5))
        let small = WorkerFrame.encode(members: ["op": "call", "function": "echo_add", "json": [2, 3]], id: 1)!
        guard case .finished(.sent) = outbox.enqueue(small, until: deadline, overdue: call) else {
            Issue.record("a small frame was not written at once")
            return
        }
        var reader = FrameReader(fd: pair.ours)
        #expect(try reader.next(until: .now + .seconds(10)).json == ["op": "call", "function": "echo_add", "json": [2, 3], "id": 1])

        // Larger than any socket buffer: written in part, the rest waits.
        let large = WorkerFrame.encode(["payload": .string(String(repeating: "x", count: 8 << 20))])!
        guard case .waiting(let first) = outbox.enqueue(large, until: deadline, overdue: call),
              case .waiting(let second) = outbox.enqueue(small, until: deadline, overdue: .init("read its load frame", within: .seconds(2)))
        else {
            Issue.record("a frame larger than the socket's buffer did not wait")
            return
        }
        guard case .waiting(let until) = outbox.flush(now: .now) else {
            Issue.record("frames waiting for room were not reported waiting")
            return
        }
        #expect(until == deadline)
        guard case .overdue(let reason) = outbox.flush(now: deadline) else {
            Issue.record("a frame past its deadline was not overdue")
            return
        }
        #expect(reason == "it did not read call echo_add within 5 s")
        #expect(first.value == .timedOut && second.value == .gone)
        guard case .finished(.gone) = outbox.enqueue(small, until: deadline, overdue: call) else {
            Issue.record("a frame was accepted after the stream went out of step")
            return
        }
        #expect(FrameOutbox.Overdue("read its load frame", within: .milliseconds(500)).reason == "it did not read its load frame within 0.5 s")
    }

    /// The strict parser reads every frame: a member given twice, a body that is not an
    /// object or not JSON, a length of 0 or beyond 16 MiB make the frame invalid.
    @Test func whatIsNoValidFrameIsRefused() {
        func refused(_ bytes: [UInt8], _ reason: String, sourceLocation: SourceLocation = #_sourceLocation) {
            let pair = Pair()
            var reader = FrameReader(fd: pair.ours)
            pair.write(bytes)
            do {
                let message = try reader.next(until: .now + .seconds(10))
                Issue.record("read \(message.json.jsonText)", sourceLocation: sourceLocation)
            } catch .invalid(let problem) {
                #expect(problem.contains(reason), "\(problem)", sourceLocation: sourceLocation)
            } catch {
                Issue.record("\(error)", sourceLocation: sourceLocation)
            }
        }
        func framed(_ text: String) -> [UInt8] { Self.header(text.utf8.count) + Array(text.utf8) }
        refused(framed(#"{"id":1,"id":2}"#), "duplicate member name \"id\"")
        refused(framed(#"[1,2]"#), "the frame holds an array, expected an object")
        refused(framed(#"{"id":1} x"#), "unexpected text after the JSON value")
        let invalidUTF8 = Array(#"{"op":""#.utf8) + [0xFF] + Array(#""}"#.utf8)
        refused(Self.header(invalidUTF8.count) + invalidUTF8, "invalid UTF-8")
        refused(Self.header(0), "length 0 is outside 1...\(WorkerFrame.maximumSize)")
        refused(Self.header(WorkerFrame.maximumSize + 1), "length \(WorkerFrame.maximumSize + 1) is outside")
    }

    /// Every request the daemon writes reads back, in the worker, as the same request:
    /// the two ends share one spelling of each member. What is not a request is nil.
    @Test func everyRequestReadsBackAsItself() throws {
        let payload: JSONValue = ["text": "é\u{1B}\"", "list": [1, 2.5, nil, true]]
        let requests: [DaemonRequest] = [
            .create(module: "echo", configuration: ["limit": 3], running: ["a", "b"]),
            .event(module: "echo", kind: .start, name: "start", payload: nil),
            .event(module: "echo", kind: .deinitialize, name: "deinit", payload: nil),
            .event(module: "naïve", kind: .notification, name: "", payload: payload),
            .event(module: "echo", kind: .custom, name: "tick", payload: 7),
            .awaited(module: "echo", event: "willUnload", payload: nil),
            .configure(module: "echo", configuration: ["level": "debug"]),
            .info(module: "echo"), .state(module: "echo"), .restore(module: "echo", state: payload),
            .call(function: "now", arguments: .none), .call(function: "greet", arguments: .texts(["a b", "ü"])),
            .call(function: "echo_add", arguments: .json([2, 3])),
        ]
        for (index, request) in requests.enumerated() {
            let frame = try #require(request.frame(id: index + 1))
            let message = try FrameReader.message(frame[4...])
            #expect(message.integer("id") == index + 1)
            #expect(DaemonRequest(message) == request, "\(message.json.jsonText)")
        }
        for text in [#"{"op":"event","module":"m","kind":"later","event":"e","id":1}"#, #"{"op":"info","id":1}"#,
                     #"{"op":"call","function":"f","texts":[1],"id":1}"#, #"{"op":"launch","id":1}"#, #"{"id":1}"#] {
            #expect(DaemonRequest(try FrameReader.message(Array(text.utf8)[...])) == nil, "\(text)")
        }
    }
}
