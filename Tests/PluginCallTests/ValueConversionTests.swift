import PluginCall
import Testing

@Suite("Argument conversion from text and JSON", .timeLimit(.minutes(5)))
struct ValueConversionTests {
    @Test("integer text: decimal, hex, signs, exact bounds of every width")
    func integerText() throws {
        #expect(try ValueType.i8.parse("-128") == .int8(-128))
        #expect(try ValueType.i8.parse("127") == .int8(127))
        #expect(try ValueType.u8.parse("255") == .uint8(255))
        #expect(try ValueType.u8.parse("0xff") == .uint8(255))
        #expect(try ValueType.i16.parse("-0x8000") == .int16(.min))
        #expect(try ValueType.u32.parse("+4294967295") == .uint32(.max))
        #expect(try ValueType.i64.parse("-9223372036854775808") == .int64(.min))
        #expect(try ValueType.u64.parse("18446744073709551615") == .uint64(.max))
        for type in ValueType.allCases where type.isInteger {
            let range = try #require(type.integerRange)
            #expect(try type.parse(String(range.lowerBound)).text == String(range.lowerBound))
            #expect(try type.parse(String(range.upperBound)).text == String(range.upperBound))
            #expect(throws: ValueError.self) { try type.parse(String(range.upperBound + 1)) }
            #expect(throws: ValueError.self) { try type.parse(String(range.lowerBound - 1)) }
        }
    }

    @Test("integer text errors say why")
    func integerErrors() {
        #expect(throws: ValueError(type: .u8, input: "256", reason: "out of range for u8 (0...255)")) {
            try ValueType.u8.parse("256")
        }
        #expect(throws: ValueError(type: .u8, input: "-1", reason: "out of range for u8 (0...255)")) {
            try ValueType.u8.parse("-1")
        }
        #expect(throws: ValueError(type: .i32, input: "1.5", reason: "not an integer (decimal, or hex with 0x)")) {
            try ValueType.i32.parse("1.5")
        }
        for bad in ["", "-", "0x", "12a", " 1", "1e3"] {
            #expect(throws: ValueError.self, "\(bad)") { try ValueType.i64.parse(bad) }
        }
        #expect(throws: ValueError.self) { try ValueType.u64.parse("999999999999999999999999999999999999999999") }
    }

    @Test("float text: finite, inf, nan; overflow refused")
    func floatText() throws {
        #expect(try ValueType.f32.parse("1.5") == .float(1.5))
        #expect(try ValueType.f64.parse("-0.125") == .double(-0.125))
        #expect(try ValueType.f64.parse("inf") == .double(.infinity))
        #expect(try ValueType.f32.parse("-inf") == .float(-.infinity))
        guard case .double(let nan) = try ValueType.f64.parse("nan") else {
            Issue.record("nan did not give an f64")
            return
        }
        #expect(nan.isNaN)
        #expect(throws: ValueError.self) { try ValueType.f32.parse("1e39") }
        #expect(throws: ValueError.self) { try ValueType.f64.parse("1e309") }
        #expect(throws: ValueError.self) { try ValueType.f64.parse("one") }
        #expect(try ValueType.f32.parse("3.4e38") == .float(3.4e38))
    }

    @Test("bool, str, buf text")
    func otherText() throws {
        #expect(try ValueType.bool.parse("true") == .bool(true))
        #expect(try ValueType.bool.parse("0") == .bool(false))
        #expect(throws: ValueError.self) { try ValueType.bool.parse("yes") }
        #expect(try ValueType.str.parse("héllo") == .string("héllo"))
        #expect(try ValueType.str.parse("") == .string(""))
        #expect(throws: ValueError.self) { try ValueType.str.parse("a\u{0}b") }
        #expect(try ValueType.buf.parse("hex:00Ff10") == .bytes([0, 255, 16]))
        #expect(try ValueType.buf.parse("base64:AAH/") == .bytes([0, 1, 255]))
        #expect(try ValueType.buf.parse("text:hex:") == .bytes(Array("hex:".utf8)))
        #expect(try ValueType.buf.parse("abc") == .bytes([97, 98, 99]))
        #expect(try ValueType.buf.parse("") == .bytes([]))
        #expect(throws: ValueError.self) { try ValueType.buf.parse("hex:0") }
        #expect(throws: ValueError.self) { try ValueType.buf.parse("hex:zz") }
        #expect(throws: ValueError.self) { try ValueType.void.parse("") }
    }

    @Test("text output reads back to the same value")
    func textRoundTrip() throws {
        let values: [CallValue] = [
            .int8(-128), .int16(.max), .int32(-1), .int64(.min), .uint8(255), .uint16(0), .uint32(.max),
            .uint64(.max), .float(0.1), .float(-.infinity), .double(.pi), .double(1e-300), .bool(true),
            .string("ü ✓"), .bytes([0, 1, 254, 255]), .bytes([]),
        ]
        for value in values {
            #expect(try value.type.parse(value.text) == value, "\(value)")
        }
        #expect(CallValue.void.text == "")
    }

    @Test("JSON input: exact numbers, strings for wide integers, base64 or arrays for buffers")
    func jsonInput() throws {
        #expect(try ValueType.i32.value(fromJSON: .number(-5)) == .int32(-5))
        #expect(try ValueType.u64.value(fromJSON: .number(9_007_199_254_740_992)) == .uint64(1 << 53))
        #expect(try ValueType.u64.value(fromJSON: .string("18446744073709551615")) == .uint64(.max))
        #expect(throws: ValueError.self) { try ValueType.i64.value(fromJSON: .number(1e17)) }
        #expect(throws: ValueError.self) { try ValueType.i32.value(fromJSON: .number(1.5)) }
        #expect(throws: ValueError.self) { try ValueType.u8.value(fromJSON: .number(256)) }
        #expect(throws: ValueError.self) { try ValueType.u8.value(fromJSON: .number(-1)) }
        #expect(throws: ValueError.self) { try ValueType.i32.value(fromJSON: .bool(true)) }
        #expect(throws: ValueError.self) { try ValueType.i32.value(fromJSON: .null) }
        #expect(try ValueType.f32.value(fromJSON: .number(0.5)) == .float(0.5))
        #expect(throws: ValueError.self) { try ValueType.f32.value(fromJSON: .number(1e39)) }
        #expect(try ValueType.f64.value(fromJSON: .string("-inf")) == .double(-.infinity))
        #expect(try ValueType.bool.value(fromJSON: .bool(false)) == .bool(false))
        #expect(throws: ValueError.self) { try ValueType.bool.value(fromJSON: .number(1)) }
        #expect(try ValueType.str.value(fromJSON: .string("x")) == .string("x"))
        #expect(throws: ValueError.self) { try ValueType.str.value(fromJSON: .number(1)) }
        #expect(try ValueType.buf.value(fromJSON: .string("AAH/")) == .bytes([0, 1, 255]))
        #expect(try ValueType.buf.value(fromJSON: .array([.number(0), .number(255)])) == .bytes([0, 255]))
        #expect(throws: ValueError.self) { try ValueType.buf.value(fromJSON: .array([.number(256)])) }
        #expect(throws: ValueError.self) { try ValueType.buf.value(fromJSON: .string("not base64!")) }
    }

    @Test("JSON output reads back as JSON input")
    func jsonRoundTrip() throws {
        let values: [CallValue] = [
            .int64(.min), .int64(1 << 53), .uint64(.max), .int8(-1), .float(1.25), .double(.infinity),
            .bool(true), .string("a\"b"), .bytes([0, 200, 255]), .bytes([]),
        ]
        for value in values {
            #expect(try value.type.value(fromJSON: value.json) == value, "\(value)")
        }
        #expect(CallValue.uint64(.max).json == .string("18446744073709551615"))
        #expect(CallValue.int32(7).json == .number(7))
        #expect(CallValue.bytes([0, 1, 255]).json == .string("AAH/"))
        #expect(CallValue.void.json == .null)
    }

    @Test("parseArguments: arity, and the failing argument's position")
    func parseArguments() throws {
        let signature = try Signature(parsing: "i32(u8,str,buf)")
        #expect(try signature.parseArguments(["7", "x", "hex:01"]) == [.uint8(7), .string("x"), .bytes([1])])
        #expect(throws: CallError.wrongArity(function: "f", signature: signature, given: 2)) {
            try signature.parseArguments(["1", "2"], function: "f")
        }
        #expect(
            throws: CallError.invalidArgument(
                function: "f", position: 1, ValueError(type: .u8, input: "300", reason: "out of range for u8 (0...255)"))
        ) {
            try signature.parseArguments(["300", "x", ""], function: "f")
        }
        let error = CallError.invalidArgument(
            function: "f", position: 1, ValueError(type: .u8, input: "300", reason: "out of range for u8 (0...255)"))
        #expect(error.description == "f: argument 1: \"300\" is not a valid u8: out of range for u8 (0...255)")
        #expect(try signature.arguments(fromJSON: [.number(1), .string(""), .array([])]) == [.uint8(1), .string(""), .bytes([])])
        #expect(throws: CallError.self) { try signature.arguments(fromJSON: [.number(1), .null, .array([])]) }
    }
}
