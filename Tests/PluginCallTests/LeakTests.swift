import PluginCall
import Testing

/// Heap use measured with glibc's `mallinfo2` (through the C test plugin, which shares the
/// process's malloc). Other suites run in parallel and move the measure by up to about
/// 1 MB, so payloads are 1000 bytes: a leak per call would show as ~30 MB over 30k calls,
/// against a limit of 4 MB. The calibration test proves the measure sees such a leak.
@Suite("No leaks from strings, buffers and closures", .timeLimit(.minutes(5)), .serialized)
struct LeakTests {
    static let calls = 30_000

    func heapInUse() throws -> Int64 {
        guard case .uint64(let bytes) = try Fixtures.table(.c).call("c_heap_in_use", []) else {
            throw PluginBuilder.Failure(description: "c_heap_in_use did not return u64")
        }
        return Int64(bytes)
    }

    /// Heap growth across `body`, after a warm-up run of it.
    func growth(_ body: () throws -> Void) throws -> Int64 {
        try body()
        let before = try heapInUse()
        try body()
        return try heapInUse() - before
    }

    static let limit: Int64 = 4_000_000

    @Test("the measure sees a leak of 1000 bytes per call")
    func calibration() throws {
        let leak = try Fixtures.table(.c).function(named: "c_leak")
        let grown = try growth {
            for _ in 0..<10_000 { _ = try leak.call(.uint64(1000)) }
        }
        #expect(grown >= 8_000_000, "10000 leaked blocks of 1000 bytes grew the heap by only \(grown)")
    }

    @Test("str results are freed by the host (30k calls, C and Swift plugins)", arguments: Fixtures.Language.allCases)
    func strings(_ language: Fixtures.Language) throws {
        let echo = try Fixtures.table(language).function(named: language.prefix + "echo_str")
        let text = String(repeating: "ü", count: 500)  // 1000 bytes of UTF-8
        let grown = try growth {
            for _ in 0..<Self.calls {
                guard try echo.call(.string(text)) == .string(text) else {
                    throw PluginBuilder.Failure(description: "wrong echo")
                }
            }
        }
        #expect(grown < Self.limit, "heap grew by \(grown) bytes over \(Self.calls) calls")
    }

    @Test("buf results are freed by the host (30k calls, C and Swift plugins)", arguments: Fixtures.Language.allCases)
    func buffers(_ language: Fixtures.Language) throws {
        let reverse = try Fixtures.table(language).function(named: language.prefix + "reverse")
        let bytes = (0..<1000).map { UInt8(truncatingIfNeeded: $0) }
        let reversed = CallValue.bytes(bytes.reversed())
        let grown = try growth {
            for _ in 0..<Self.calls {
                guard try reverse.call(.bytes(bytes)) == reversed else {
                    throw PluginBuilder.Failure(description: "wrong reverse")
                }
            }
        }
        #expect(grown < Self.limit, "heap grew by \(grown) bytes over \(Self.calls) calls")
    }

    @Test("closures free their cif and handler when released")
    func closures() throws {
        let signature = try Signature(parsing: "i32(i32)")
        let grown = try growth {
            for index in 0..<100_000 {
                let closure = try FFIClosure(signature: signature, context: index) { context, _ in .int32(Int32(context)) }
                _ = closure.functionPointer
            }
        }
        // A leaked cif, type array, handler box and closure object is >= 150 bytes: 15 MB.
        #expect(grown < Self.limit, "heap grew by \(grown) bytes over 100000 closures")
    }
}
