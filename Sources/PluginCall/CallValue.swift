import ModuleKit

/// A typed Swift value passed to or returned from a plugin function.
///
/// Each case corresponds to exactly one `ValueType`; a call accepts a value only for an
/// argument of exactly its type (no implicit widening), so `.int32(1)` for an `i64`
/// argument is a type error. To convert user input, use `Signature.parseArguments(_:)`
/// (text) or `Signature.arguments(fromJSON:)` (JSON), which convert per the declared
/// types with range checks.
public enum CallValue: Sendable, Hashable, CustomStringConvertible {
    case int8(Int8)
    case int16(Int16)
    case int32(Int32)
    case int64(Int64)
    case uint8(UInt8)
    case uint16(UInt16)
    case uint32(UInt32)
    case uint64(UInt64)
    /// `f32`.
    case float(Float)
    /// `f64`.
    case double(Double)
    case bool(Bool)
    /// `str`: must not contain a NUL character when passed as an argument.
    case string(String)
    /// `buf`.
    case bytes([UInt8])
    /// The result of a `void` function.
    case void

    /// The grammar type this value has.
    public var type: ValueType {
        switch self {
        case .int8: return .i8
        case .int16: return .i16
        case .int32: return .i32
        case .int64: return .i64
        case .uint8: return .u8
        case .uint16: return .u16
        case .uint32: return .u32
        case .uint64: return .u64
        case .float: return .f32
        case .double: return .f64
        case .bool: return .bool
        case .string: return .str
        case .bytes: return .buf
        case .void: return .void
        }
    }

    /// The value as command-line text, in a form `ValueType.parse(_:)` reads back to the
    /// same value: decimal integers, Swift's shortest round-trip spelling of floats
    /// (`nan`, `inf`, `-inf` included), `true`/`false`, the string itself, `hex:` followed
    /// by lowercase hex digits for bytes, and the empty text for `void`.
    public var text: String {
        switch self {
        case .int8(let v): return String(v)
        case .int16(let v): return String(v)
        case .int32(let v): return String(v)
        case .int64(let v): return String(v)
        case .uint8(let v): return String(v)
        case .uint16(let v): return String(v)
        case .uint32(let v): return String(v)
        case .uint64(let v): return String(v)
        case .float(let v): return v.description
        case .double(let v): return v.description
        case .bool(let v): return v ? "true" : "false"
        case .string(let v): return v
        case .bytes(let v): return "hex:" + Self.hex(v)
        case .void: return ""
        }
    }

    /// The value for a JSON reply. Integers are numbers when a JSON (double) number holds
    /// them exactly (|v| <= 2^53), else decimal strings; finite floats are numbers, NaN and
    /// infinities the strings `"nan"`, `"inf"`, `"-inf"`; bytes are a base64 string;
    /// `void` is `null`. `Signature.arguments(fromJSON:)` accepts every one of these forms.
    public var json: JSONValue {
        switch self {
        case .int8(let v): return .number(Double(v))
        case .int16(let v): return .number(Double(v))
        case .int32(let v): return .number(Double(v))
        case .int64(let v): return Self.jsonInteger(Int128(v))
        case .uint8(let v): return .number(Double(v))
        case .uint16(let v): return .number(Double(v))
        case .uint32(let v): return .number(Double(v))
        case .uint64(let v): return Self.jsonInteger(Int128(v))
        case .float(let v): return Self.jsonFloat(Double(v))
        case .double(let v): return Self.jsonFloat(v)
        case .bool(let v): return .bool(v)
        case .string(let v): return .string(v)
        case .bytes(let v): return .string(Base64.encode(v))
        case .void: return .null
        }
    }

    /// `type:text`, e.g. `i32:42`, for logs and test failures.
    public var description: String { "\(type):\(text)" }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// 2^53: the largest magnitude below which every integer is an exact JSON number.
    static let exactJSONLimit: Int128 = 1 << 53
    /// `exactJSONLimit` as a Double, converted once (Int128 to Double is a generic conversion).
    static let exactJSONLimitAsDouble = Double(exactJSONLimit)

    static func jsonInteger(_ value: Int128) -> JSONValue {
        value.magnitude <= exactJSONLimit.magnitude ? .number(Double(value)) : .string(String(value))
    }

    static func jsonFloat(_ value: Double) -> JSONValue {
        if value.isNaN { return .string("nan") }
        if value.isInfinite { return .string(value < 0 ? "-inf" : "inf") }
        return .number(value)
    }
}

/// Why a text or JSON input is not a valid value of a type.
public struct ValueError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The declared type the input was converted to.
    public let type: ValueType
    /// The input as text (JSON inputs in JSON spelling).
    public let input: String
    /// What is wrong, e.g. `out of range for u8 (0...255)`.
    public let reason: String

    public init(type: ValueType, input: String, reason: String) {
        self.type = type
        self.input = input
        self.reason = reason
    }

    public var description: String { "\"\(input)\" is not a valid \(type): \(reason)" }
}

extension ValueType {
    /// Converts command-line text to a value of this type.
    ///
    /// - Integers: optional sign, then decimal digits or `0x` and hex digits; out-of-range
    ///   values are refused, never wrapped.
    /// - `f32`/`f64`: decimal or hex float text, `nan`, `inf`, `-inf`; finite text too
    ///   large for the type is refused.
    /// - `bool`: `true`, `false`, `1`, `0`.
    /// - `str`: the text itself; a NUL character is refused.
    /// - `buf`: `hex:` + hex digit pairs, `base64:` + base64, `text:` + text (UTF-8), or
    ///   any other text as its UTF-8 bytes.
    /// - Throws: `ValueError` for `void` and for text that is not a value of the type.
    public func parse(_ text: String) throws(ValueError) -> CallValue {
        func fail(_ reason: String) -> ValueError { ValueError(type: self, input: text, reason: reason) }
        switch self {
        case .i8, .i16, .i32, .i64, .u8, .u16, .u32, .u64:
            return try integerValue(try Self.parseInteger(text, type: self), input: text)
        case .f32:
            guard let value = Float(text) else { throw fail("not a number") }
            if value.isInfinite && !Self.isInfinityText(text) {
                throw fail("out of range for f32 (magnitude at most \(Float.greatestFiniteMagnitude))")
            }
            return .float(value)
        case .f64:
            guard let value = Double(text) else { throw fail("not a number") }
            if value.isInfinite && !Self.isInfinityText(text) {
                throw fail("out of range for f64 (magnitude at most \(Double.greatestFiniteMagnitude))")
            }
            return .double(value)
        case .bool:
            switch text {
            case "true", "1": return .bool(true)
            case "false", "0": return .bool(false)
            default: throw fail("expected true, false, 1 or 0")
            }
        case .str:
            if text.utf8.contains(0) { throw fail("contains a NUL character, which ends a C string") }
            return .string(text)
        case .buf:
            if text.hasPrefix("hex:") {
                guard let bytes = Self.decodeHex(text.dropFirst(4)) else {
                    throw fail("after \"hex:\" expected an even number of hex digits")
                }
                return .bytes(bytes)
            }
            if text.hasPrefix("base64:") {
                guard let bytes = Base64.decode(String(text.dropFirst(7))) else {
                    throw fail("after \"base64:\" expected base64 text")
                }
                return .bytes(bytes)
            }
            if text.hasPrefix("text:") { return .bytes(Array(text.utf8.dropFirst(5))) }
            return .bytes(Array(text.utf8))
        case .void:
            throw fail("void is not an argument type")
        }
    }

    /// Converts a JSON argument to a value of this type.
    ///
    /// - Integers: a JSON number that is a whole number with magnitude at most 2^53 (the
    ///   range a JSON double holds exactly), or a string read as by `parse(_:)` (any value
    ///   of the type, e.g. `"18446744073709551615"`).
    /// - `f32`/`f64`: a number (finite; for f32 within its range) or a string as by
    ///   `parse(_:)` (`"nan"`, `"inf"`).
    /// - `bool`: `true` or `false`.
    /// - `str`: a string without NUL.
    /// - `buf`: a base64 string, or an array of integers 0...255.
    /// - Throws: `ValueError` for any other shape (an object is never an argument), a
    ///   fraction for an integer, `null`, or a value out of range.
    public func value(fromJSON json: JSONValue) throws(ValueError) -> CallValue {
        func fail(_ reason: String) -> ValueError { ValueError(type: self, input: json.jsonText, reason: reason) }
        switch (self, json) {
        case (.void, _):
            throw fail("void is not an argument type")
        case (_, .string(let text)) where isInteger || self == .f32 || self == .f64:
            return try parse(text)
        case (.i8, .number(let n)), (.i16, .number(let n)), (.i32, .number(let n)), (.i64, .number(let n)),
            (.u8, .number(let n)), (.u16, .number(let n)), (.u32, .number(let n)), (.u64, .number(let n)):
            guard n.isFinite, n == n.rounded() else { throw fail("not a whole number") }
            guard n.magnitude <= CallValue.exactJSONLimitAsDouble else {
                throw fail("a JSON number holds integers exactly only up to 2^53; pass it as a string")
            }
            // As an Int64 (|n| <= 2^53): Double to Int64 is one instruction, Double to
            // Int128 a generic conversion. The input is written out only for an error.
            return try integerValue(Int64(n), input: json.jsonText)
        case (.f32, .number(let n)):
            let value = Float(n)
            if value.isInfinite && n.isFinite {
                throw fail("out of range for f32 (magnitude at most \(Float.greatestFiniteMagnitude))")
            }
            return .float(value)
        case (.f64, .number(let n)):
            return .double(n)
        case (.bool, .bool(let b)):
            return .bool(b)
        case (.str, .string(let text)):
            return try parse(text)
        case (.buf, .string(let text)):
            guard let bytes = Base64.decode(text) else { throw fail("expected base64 text") }
            return .bytes(bytes)
        case (.buf, .array(let elements)):
            var bytes: [UInt8] = []
            bytes.reserveCapacity(elements.count)
            for element in elements {
                guard case .number(let n) = element, n == n.rounded(), n >= 0, n <= 255 else {
                    throw fail("expected an array of integers 0...255")
                }
                bytes.append(UInt8(n))
            }
            return .bytes(bytes)
        default:
            throw fail("\(json.kind) is not accepted for \(self)")
        }
    }

    /// The range-checked integer value of this integer type. Generic, so that a JSON
    /// number (an Int64) is checked without the Int128 arithmetic text needs.
    private func integerValue(_ value: some BinaryInteger, input: @autoclosure () -> String) throws(ValueError) -> CallValue {
        let result: CallValue?
        switch self {
        case .i8: result = Int8(exactly: value).map(CallValue.int8)
        case .i16: result = Int16(exactly: value).map(CallValue.int16)
        case .i32: result = Int32(exactly: value).map(CallValue.int32)
        case .i64: result = Int64(exactly: value).map(CallValue.int64)
        case .u8: result = UInt8(exactly: value).map(CallValue.uint8)
        case .u16: result = UInt16(exactly: value).map(CallValue.uint16)
        case .u32: result = UInt32(exactly: value).map(CallValue.uint32)
        case .u64: result = UInt64(exactly: value).map(CallValue.uint64)
        default: result = nil
        }
        guard let result else {
            let range = integerRange.map { "\($0.lowerBound)...\($0.upperBound)" } ?? "?"
            throw ValueError(type: self, input: input(), reason: "out of range for \(self) (\(range))")
        }
        return result
    }

    private static func parseInteger(_ text: String, type: ValueType) throws(ValueError) -> Int128 {
        var rest = Substring(text)
        var negative = false
        if let sign = rest.first, sign == "-" || sign == "+" {
            negative = sign == "-"
            rest = rest.dropFirst()
        }
        var radix = 10
        if rest.hasPrefix("0x") || rest.hasPrefix("0X") {
            radix = 16
            rest = rest.dropFirst(2)
        }
        let digitsOK = !rest.isEmpty && rest.allSatisfy { $0.isASCII && $0.isHexDigit && (radix == 16 || $0.isNumber) }
        guard digitsOK else {
            throw ValueError(type: type, input: text, reason: "not an integer (decimal, or hex with 0x)")
        }
        guard let magnitude = Int128(rest, radix: radix) else {
            let range = type.integerRange.map { "\($0.lowerBound)...\($0.upperBound)" } ?? "?"
            throw ValueError(type: type, input: text, reason: "out of range for \(type) (\(range))")
        }
        return negative ? -magnitude : magnitude
    }

    private static func isInfinityText(_ text: String) -> Bool {
        var t = Substring(text.lowercased())
        if t.first == "-" || t.first == "+" { t = t.dropFirst() }
        return t == "inf" || t == "infinity"
    }

    private static func decodeHex(_ text: Substring) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
            default: return nil
            }
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(chars.count / 2)
        var index = 0
        while index < chars.count {
            guard let high = nibble(chars[index]), let low = nibble(chars[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }
}

extension Signature {
    /// Converts one command-line text per argument (as `modhostctl call` receives them)
    /// to typed values, with `ValueType.parse(_:)` per declared type.
    ///
    /// - Throws: `CallError.wrongArity` when the count differs from the signature's, or
    ///   `CallError.invalidArgument` naming the first bad argument (1-based).
    public func parseArguments(_ texts: [String], function: String = "") throws(CallError) -> [CallValue] {
        guard texts.count == argumentTypes.count else {
            throw CallError.wrongArity(function: function, signature: self, given: texts.count)
        }
        var values: [CallValue] = []
        values.reserveCapacity(texts.count)
        for (index, (type, text)) in zip(argumentTypes, texts).enumerated() {
            do {
                values.append(try type.parse(text))
            } catch {
                throw CallError.invalidArgument(function: function, position: index + 1, error)
            }
        }
        return values
    }

    /// Converts JSON arguments (from the control protocol) to typed values, with
    /// `ValueType.value(fromJSON:)` per declared type.
    ///
    /// - Throws: `CallError.wrongArity` or `CallError.invalidArgument` as
    ///   `parseArguments(_:function:)` does.
    public func arguments(fromJSON json: [JSONValue], function: String = "") throws(CallError) -> [CallValue] {
        guard json.count == argumentTypes.count else {
            throw CallError.wrongArity(function: function, signature: self, given: json.count)
        }
        var values: [CallValue] = []
        values.reserveCapacity(json.count)
        for (index, (type, element)) in zip(argumentTypes, json).enumerated() {
            do {
                values.append(try type.value(fromJSON: element))
            } catch {
                throw CallError.invalidArgument(function: function, position: index + 1, error)
            }
        }
        return values
    }
}
