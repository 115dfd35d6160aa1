import PluginCall
import Testing

/// Every type of the grammar through real C and Swift (`@_cdecl`) plugins, on both call
/// paths (register path where eligible, and libffi forced).
@Suite("Round trips through C and Swift plugins", .timeLimit(.minutes(5)))
struct RoundTripTests {
    static let targets: [(Fixtures.Language, CallPath)] = [
        (.c, .registers), (.c, .libffi), (.swift, .registers), (.swift, .libffi),
    ]

    func call(_ target: (Fixtures.Language, CallPath), _ name: String, _ arguments: [CallValue]) throws -> CallValue {
        let table = try Fixtures.table(target.0, path: target.1)
        let function = try table.function(named: target.0.prefix + name)
        return try function.call(arguments)
    }

    @Test("integers of every width: min, max, zero, -1", arguments: targets)
    func integers(_ target: (Fixtures.Language, CallPath)) throws {
        let cases: [(String, [CallValue])] = [
            ("id_i8", [.int8(.min), .int8(.max), .int8(0), .int8(-1)]),
            ("id_i16", [.int16(.min), .int16(.max), .int16(0), .int16(-1)]),
            ("id_i32", [.int32(.min), .int32(.max), .int32(0), .int32(-1)]),
            ("id_i64", [.int64(.min), .int64(.max), .int64(0), .int64(-1)]),
            ("id_u8", [.uint8(.min), .uint8(.max), .uint8(1)]),
            ("id_u16", [.uint16(.min), .uint16(.max), .uint16(1)]),
            ("id_u32", [.uint32(.min), .uint32(.max), .uint32(1)]),
            ("id_u64", [.uint64(.min), .uint64(.max), .uint64(1)]),
        ]
        for (name, values) in cases {
            for value in values {
                #expect(try call(target, name, [value]) == value, "\(name)(\(value))")
            }
        }
    }

    @Test("sign and zero extension across widths, narrow results", arguments: targets)
    func widths(_ target: (Fixtures.Language, CallPath)) throws {
        #expect(try call(target, "widen_i8", [.int8(-1)]) == .int64(-1))
        #expect(try call(target, "widen_i8", [.int8(-128)]) == .int64(-128))
        #expect(try call(target, "widen_u8", [.uint8(255)]) == .uint64(255))
        #expect(try call(target, "widen_i32", [.int32(.min)]) == .int64(Int64(Int32.min)))
        #expect(try call(target, "sub_u8", [.uint8(0), .uint8(1)]) == .uint8(255))
        #expect(try call(target, "add_i32", [.int32(-5), .int32(47)]) == .int32(42))
    }

    @Test("f32 and f64, including signed zero, extremes, infinities and NaN", arguments: targets)
    func floats(_ target: (Fixtures.Language, CallPath)) throws {
        let floats: [Float] = [0, 1.5, -2.25, .greatestFiniteMagnitude, -.greatestFiniteMagnitude,
                               .leastNonzeroMagnitude, .infinity, -.infinity]
        for value in floats {
            #expect(try call(target, "id_f32", [.float(value)]) == .float(value))
        }
        let doubles: [Double] = [0, 1.5, -2.25, .pi, .greatestFiniteMagnitude, .leastNonzeroMagnitude,
                                 .infinity, -.infinity]
        for value in doubles {
            #expect(try call(target, "id_f64", [.double(value)]) == .double(value))
        }
        guard case .float(let negativeZero) = try call(target, "id_f32", [.float(-0.0)]) else {
            Issue.record("id_f32 did not return an f32")
            return
        }
        #expect(negativeZero.sign == .minus && negativeZero == 0)
        guard case .double(let nan) = try call(target, "id_f64", [.double(.nan)]),
            case .float(let nanF) = try call(target, "id_f32", [.float(.nan)])
        else {
            Issue.record("id_f64 / id_f32 returned the wrong type")
            return
        }
        #expect(nan.isNaN && nanF.isNaN)
    }

    @Test("bool", arguments: targets)
    func bools(_ target: (Fixtures.Language, CallPath)) throws {
        #expect(try call(target, "id_bool", [.bool(true)]) == .bool(true))
        #expect(try call(target, "id_bool", [.bool(false)]) == .bool(false))
        #expect(try call(target, "not_bool", [.bool(true)]) == .bool(false))
        #expect(try call(target, "not_bool", [.bool(false)]) == .bool(true))
    }

    @Test("mixed integer and float arguments keep their positions", arguments: targets)
    func mixed(_ target: (Fixtures.Language, CallPath)) throws {
        let expected = -3.0 + 65535.0 * 2 + 0.25 * 4 + -1.5 * 8 + Double(Int64(1) << 40) * 16 + 1000
        let result = try call(
            target, "mix", [.int8(-3), .uint16(65535), .float(0.25), .double(-1.5), .int64(1 << 40), .bool(true)])
        #expect(result == .double(expected))
        // Eight integer arguments: more than x86-64 passes in registers.
        let sum = try call(target, "sum8", (1...8).map { CallValue.int64($0 == 3 ? -Int64($0) : Int64($0)) })
        #expect(sum == .int64(204 - 2 * 9))
    }

    @Test("strings: empty, ASCII, UTF-8, long; results owned and freed by the host", arguments: targets)
    func strings(_ target: (Fixtures.Language, CallPath)) throws {
        let long = String(repeating: "abcdefghij", count: 10_000)
        for text in ["", "hello", "héllo wörld ✓ 日本語 🎉", long] {
            #expect(try call(target, "echo_str", [.string(text)]) == .string(text))
        }
        #expect(try call(target, "str_len", [.string("héllo")]) == .uint64(6))
        #expect(try call(target, "str_len", [.string("")]) == .uint64(0))
        #expect(try call(target, "concat", [.string("ab"), .string("ç🎉")]) == .string("abç🎉"))
        #expect(try call(target, "concat", [.string(""), .string("")]) == .string(""))
    }

    @Test("buffers: empty, every byte value, large; two C parameters; results freed", arguments: targets)
    func buffers(_ target: (Fixtures.Language, CallPath)) throws {
        let all = (0...255).map { UInt8($0) }
        let large = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        for bytes in [[], [0], all, large] {
            #expect(try call(target, "echo_buf", [.bytes(bytes)]) == .bytes(bytes))
        }
        #expect(try call(target, "reverse", [.bytes([1, 2, 3])]) == .bytes([3, 2, 1]))
        #expect(try call(target, "buf_sum", [.bytes(all)]) == .uint64(255 * 256 / 2))
        // An empty buffer is still passed with a non-NULL pointer.
        #expect(try call(target, "buf_is_null", [.bytes([])]) == .bool(false))
        // A buf argument takes two C parameters: the next argument follows them.
        #expect(try call(target, "buf_then_i32", [.bytes([9, 9, 9]), .int32(-7)]) == .int64(2993))
        // NULL with length 0 is an empty result.
        #expect(try call(target, "empty_buf", []) == .bytes([]))
    }

    @Test("results that break the ownership convention are errors", arguments: targets)
    func badResults(_ target: (Fixtures.Language, CallPath)) throws {
        let name = target.0.prefix
        #expect(throws: CallError.nullResult(function: name + "null_str")) {
            try call(target, "null_str", [])
        }
        #expect(throws: CallError.invalidResult(function: name + "bad_buf", reason: "returned NULL for a buf result with length 5")) {
            try call(target, "bad_buf", [])
        }
    }

    @Test("fixed-arity overloads (the allocation-free path) on every language and path", arguments: targets)
    func fixedArity(_ target: (Fixtures.Language, CallPath)) throws {
        let table = try Fixtures.table(target.0, path: target.1)
        func function(_ name: String) throws -> CallableFunction { try table.function(named: target.0.prefix + name) }
        let add = try function("add_i32")
        #expect(try add.call(.int32(-5), .int32(47)) == .int32(42))
        #expect(try add.call(.int32(.min), .int32(0)) == .int32(.min))
        #expect(try function("sub_u8").call(.uint8(0), .uint8(1)) == .uint8(255))
        #expect(try function("widen_i8").call(.int8(-1)) == .int64(-1))
        #expect(try function("id_f64").call(.double(-0.5)) == .double(-0.5))
        #expect(try function("id_f32").call(.float(3.25)) == .float(3.25))
        #expect(try function("not_bool").call(.bool(false)) == .bool(true))
        #expect(try function("madd").call(.int64(-1 << 40), .int32(3), .uint8(255)) == .int64((-1 << 40) * 3 + 255))
        #expect(try function("str_len").call(.string("abc")) == .uint64(3))
        #expect(throws: CallError.wrongType(function: add.name, position: 1, expected: .i32, given: .i64)) {
            try add.call(.int64(1), .int32(2))
        }
        #expect(throws: CallError.wrongType(function: add.name, position: 2, expected: .i32, given: .f32)) {
            try add.call(.int32(1), .float(2))
        }
        #expect(throws: CallError.wrongArity(function: add.name, signature: add.signature, given: 1)) {
            try add.call(.int32(1))
        }
    }

    @Test("void results and argument-less calls, every language and path")
    func voidResults() throws {
        // One test, run sequentially: the counter is shared plugin state.
        var value: Int32 = 100
        for target in Self.targets {
            value += 1
            #expect(try call(target, "set_counter", [.int32(value)]) == .void)
            #expect(try call(target, "get_counter", []) == .int32(value))
        }
    }

    @Test("fixed-arity overloads and text/JSON inputs reach the same function")
    func overloadsAndInputs() throws {
        let table = try Fixtures.table(.c)
        let add = try table.function(named: "c_add_i32")
        #expect(add.path == .registers)
        #expect(try add.call(.int32(40), .int32(2)) == .int32(42))
        #expect(try table.call("c_add_i32", texts: ["-40", "0x10"]) == .int32(-24))
        #expect(try table.call("c_add_i32", json: [.number(1), .string("2")]) == .int32(3))
        #expect(try table.function(named: "c_id_u8").call(.uint8(7)) == .uint8(7))
        #expect(try table.function(named: "c_get_counter").call() != .void)
        let three = try table.function(named: "c_buf_then_i32")
        #expect(throws: CallError.wrongArity(function: "c_buf_then_i32", signature: three.signature, given: 3)) {
            try three.call(.bytes([]), .int32(1), .int32(2))
        }
        #expect(try table.call("c_echo_buf", texts: ["hex:00ff"]) == .bytes([0, 255]))
        #expect(try table.call("c_echo_str", json: [.string("ü")]).json == .string("ü"))
        #expect(try table.call("c_id_u64", json: [.string("18446744073709551615")]).json == .string("18446744073709551615"))
    }

    @Test("the path chosen per signature")
    func paths() throws {
        let table = try Fixtures.table(.c)
        #expect(try table.function(named: "c_add_i32").path == .registers)
        #expect(try table.function(named: "c_echo_buf").path == .registers)
        #expect(try table.function(named: "c_mix").path == .libffi)  // floats
        #expect(try table.function(named: "c_sum8").path == .libffi)  // 8 > 6 registers on x86-64
        #expect(try Fixtures.table(.c, path: .libffi).function(named: "c_add_i32").path == .libffi)
    }

    @Test("concurrent calls from many tasks")
    func concurrentCalls() async throws {
        let function = try Fixtures.table(.c).function(named: "c_concat")
        try await withThrowingTaskGroup(of: Void.self) { group in
            for task in 0..<8 {
                group.addTask {
                    for index in 0..<2_000 {
                        let result = try function.call(.string("t\(task)-"), .string("\(index)"))
                        guard result == .string("t\(task)-\(index)") else {
                            throw PluginBuilder.Failure(description: "task \(task) call \(index) got \(result)")
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
    }
}
