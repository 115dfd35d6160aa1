import PluginCall
import Synchronization
import Testing

/// Collects what closures saw, from any thread.
final class Recorder: Sendable {
    private let lines = Mutex<[String]>([])
    func record(_ line: String) { lines.withLock { $0.append(line) } }
    var all: [String] { lines.withLock { $0 } }
}

@Suite("libffi closures called from C", .timeLimit(.minutes(5)))
struct ClosureTests {
    func pointerValue(_ pointer: UnsafeRawPointer) -> CallValue { .uint64(UInt64(UInt(bitPattern: pointer))) }

    @Test("each log closure carries its own context through a context-free C pointer")
    func perClosureContext() throws {
        let table = try Fixtures.table(.c)
        let recorder = Recorder()
        let alpha = try FFIClosure.log { level, message in recorder.record("alpha \(level) \(message)") }
        let beta = try FFIClosure.log { level, message in recorder.record("beta \(level) \(message)") }
        _ = try table.call("c_call_log", [pointerValue(alpha.functionPointer), .int32(2), .string("hé")])
        _ = try table.call("c_call_log", [pointerValue(beta.functionPointer), .int32(0), .string("")])
        _ = try table.call("c_call_log", [pointerValue(alpha.functionPointer), .int32(3), .string("x")])
        #expect(recorder.all == ["alpha 2 hé", "beta 0 ", "alpha 3 x"])
        #expect(alpha.functionPointer != beta.functionPointer)
        #expect(alpha.asLog != nil && alpha.asHasModule == nil && alpha.asPostNotification == nil)
    }

    @Test("post_notification gets nil for a NULL payload and the payload's bytes as they are; has_module returns bool")
    func shapes() throws {
        let table = try Fixtures.table(.c)
        let recorder = Recorder()
        let post = try FFIClosure.postNotification { name, payload in
            recorder.record("\(name)|\(payload.map { $0.map(String.init).joined(separator: ",") } ?? "nil")")
        }
        let post2 = pointerValue(post.functionPointer)
        _ = try table.call("c_call_post", [post2, .string("ping"), .bool(false), .string("ignored")])
        _ = try table.call("c_call_post", [post2, .string("pong"), .bool(true), .string("{\"a\":1}")])
        // Bytes that are not UTF-8 arrive unchanged, for the JSON parser to locate.
        let function = try #require(post.asPostNotification)
        let hostile: [CChar] = [0x22, -1, 0x22, 0].map { CChar(truncatingIfNeeded: $0) }
        hostile.withUnsafeBufferPointer { payload in "raw".withCString { function($0, payload.baseAddress) } }
        #expect(recorder.all == ["ping|nil", "pong|123,34,97,34,58,49,125", "raw|34,255,34"])
        let has = try FFIClosure.hasModule { $0 == "present" }
        #expect(try table.call("c_call_has", [pointerValue(has.functionPointer), .string("present")]) == .bool(true))
        #expect(try table.call("c_call_has", [pointerValue(has.functionPointer), .string("absent")]) == .bool(false))
    }

    @Test("HostCallbacks: the three modhost_host_api pointers, bound to one module")
    func hostCallbacks() throws {
        let table = try Fixtures.table(.c)
        let recorder = Recorder()
        let module = "mod.alpha"
        let callbacks = try HostCallbacks(
            log: { level, message in recorder.record("\(module) log \(level) \(message)") },
            postNotification: { name, payload in
                recorder.record("\(module) post \(name) \(payload.map { String(decoding: $0, as: UTF8.self) } ?? "-")")
            },
            hasModule: { $0 == module })
        func bits<F>(_ f: F) -> CallValue { .uint64(UInt64(UInt(bitPattern: unsafeBitCast(f, to: UnsafeRawPointer.self)))) }
        _ = try table.call("c_call_log", [bits(callbacks.log), .int32(1), .string("hello")])
        _ = try table.call("c_call_post", [bits(callbacks.postNotification), .string("n"), .bool(false), .string("")])
        #expect(try table.call("c_call_has", [bits(callbacks.hasModule), .string("mod.alpha")]) == .bool(true))
        #expect(recorder.all == ["mod.alpha log 1 hello", "mod.alpha post n -"])
        // The typed pointers are callable from Swift as well.
        "direct".withCString { callbacks.log(3, $0) }
        #expect(recorder.all.last == "mod.alpha log 3 direct")
        #expect("mod.alpha".withCString { callbacks.hasModule($0) })
    }

    @Test("one closure called from 8 C threads at once")
    func threads() throws {
        let table = try Fixtures.table(.c)
        let calls = Mutex(0)
        let has = try FFIClosure.hasModule { name in
            calls.withLock { $0 += 1 }
            return name == "odd"
        }
        let hits = try table.call("c_call_has_threads", [pointerValue(has.functionPointer), .int32(8), .int32(1000)])
        #expect(hits == .int32(8 * 500))
        #expect(calls.withLock { $0 } == 8000)
    }

    @Test("a generic closure decodes every argument kind and returns a typed result")
    func generic() throws {
        let table = try Fixtures.table(.c)
        let signature = try Signature(parsing: "i64(i32,f64,str,buf,bool)")
        let recorder = Recorder()
        let first = try FFIClosure(signature: signature, context: Int64(1_000)) { context, arguments in
            recorder.record(arguments.map(\.description).joined(separator: " "))
            guard case .int32(let a) = arguments[0], case .double(let b) = arguments[1] else { return .int64(-1) }
            return .int64(context + Int64(a) + Int64(b * 10))
        }
        let second = try FFIClosure(signature: signature, context: Int64(2_000)) { context, _ in .int64(context) }
        #expect(try table.call("c_call_generic", [pointerValue(first.functionPointer)]) == .int64(1_032))
        #expect(try table.call("c_call_generic", [pointerValue(second.functionPointer)]) == .int64(2_000))
        #expect(recorder.all == ["i32:7 f64:2.5 str:héllo buf:hex:010203 bool:true"])

        let float = try FFIClosure(signature: try Signature(parsing: "f32(f32,u16)")) { arguments in
            guard case .float(let x) = arguments[0], case .uint16(let n) = arguments[1] else { return .float(-1) }
            return .float(x * Float(n))
        }
        #expect(try table.call("c_call_float", [pointerValue(float.functionPointer)]) == .float(4.5))
    }

    @Test("str and buf results are refused for closures")
    func refusedResults() throws {
        #expect(throws: FFIClosureError.self) {
            try FFIClosure(signature: try Signature(parsing: "str()")) { _ in .string("") }
        }
        #expect(throws: FFIClosureError.self) {
            try FFIClosure(signature: try Signature(parsing: "buf(i32)")) { _ in .bytes([]) }
        }
    }
}
