/// The strict JSON reader of `JSONValue.parse(_:)`: the one parser for every JSON document
/// the host reads from outside (manifests, the configuration file, control requests and
/// their call arguments, `--payload`, payloads from C modules) and for modules that parse
/// JSON themselves. Small and fast: the host reads a manifest for every plugin file on
/// every scan.
extension JSONValue {
    /// The deepest nesting `parse(_:)` reads: a document nested deeper is refused, so that
    /// input from outside cannot exhaust the stack. The top-level value is level 1.
    public static let maximumDepth = 64

    /// Parses `bytes` as one JSON value (surrounding white space allowed), by RFC 8259 and
    /// stricter where the RFC leaves a choice, so that one document never means two things.
    ///
    /// These are errors, each with the byte offset where it occurs: anything RFC 8259 does
    /// not allow (a trailing comma, a comment, a single-quoted string, text after the
    /// value...); a member name given twice in one object; a number with a leading zero
    /// (`0123`); a number beyond the range of a double (`1e400`); an integer literal (no
    /// fraction, no exponent) that a double does not hold exactly, such as
    /// 9007199254740993 (2^53 + 1), which is never rounded to a neighbour; invalid UTF-8;
    /// nesting deeper than `maximumDepth`. Nothing is replaced or guessed. Numbers are
    /// doubles.
    ///
    /// The input is read once, from the start, and only as far as the first error; the
    /// caller bounds its size. Safe to call from any thread.
    public static func parse(_ bytes: [UInt8]) throws(JSONSyntaxError) -> JSONValue {
        var parser = Parser(bytes: bytes)
        let value = try parser.value(depth: 0)
        parser.skipSpace()
        guard parser.index == bytes.count else { throw parser.error("unexpected text after the JSON value") }
        return value
    }

    /// A document read by `parseKeepingMembers(_:)`: a top-level object's members in
    /// document order, or any other value.
    @_spi(ModuleHost) @frozen
    public enum TopLevel: Sendable {
        case members(keys: [String], values: [JSONValue])
        case other(JSONValue)
    }

    /// `parse(_:)` with the same rules, except that a top-level object's members are
    /// returned in document order instead of in a dictionary: cheaper for a reader that
    /// looks up a few names once (the host's manifest reader, run for every plugin file on
    /// every scan). Nested objects are dictionaries as usual.
    @_spi(ModuleHost)
    public static func parseKeepingMembers(_ bytes: [UInt8]) throws(JSONSyntaxError) -> TopLevel {
        var parser = Parser(bytes: bytes)
        parser.skipSpace()
        let result: TopLevel
        if parser.index < bytes.count, bytes[parser.index] == UInt8(ascii: "{") {
            parser.index += 1
            let (keys, values) = try parser.members(depth: 0)
            result = .members(keys: keys, values: values)
        } else {
            result = .other(try parser.value(depth: 0))
        }
        parser.skipSpace()
        guard parser.index == bytes.count else { throw parser.error("unexpected text after the JSON value") }
        return result
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0
        /// Up to this many members, an object's member names are checked for duplicates
        /// by comparison; from then on, through a set.
        static let linearMemberLimit = 16

        func error(_ message: String) -> JSONSyntaxError { JSONSyntaxError(offset: index, message: message) }

        mutating func skipSpace() {
            while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
                index += 1
            }
        }

        mutating func value(depth: Int) throws(JSONSyntaxError) -> JSONValue {
            guard depth < JSONValue.maximumDepth else { throw error("nested deeper than \(JSONValue.maximumDepth) levels") }
            skipSpace()
            guard index < bytes.count else { throw error("unexpected end of input") }
            switch bytes[index] {
            case UInt8(ascii: "{"):
                index += 1
                let (keys, values) = try members(depth: depth)
                var members: [String: JSONValue] = .init(minimumCapacity: keys.count)
                for (key, value) in zip(keys, values) { members[key] = value }
                return .object(members)
            case UInt8(ascii: "["):
                index += 1
                var elements: [JSONValue] = []
                skipSpace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "]") { index += 1; return .array(elements) }
                while true {
                    elements.append(try value(depth: depth + 1))
                    skipSpace()
                    guard index < bytes.count else { throw error("unexpected end of input in an array") }
                    if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                    if bytes[index] == UInt8(ascii: "]") { index += 1; return .array(elements) }
                    throw error("expected ',' or ']' in an array")
                }
            case UInt8(ascii: "\""):
                return .string(try string())
            case UInt8(ascii: "t"):
                try literal("true")
                return .bool(true)
            case UInt8(ascii: "f"):
                try literal("false")
                return .bool(false)
            case UInt8(ascii: "n"):
                try literal("null")
                return .null
            default:
                return .number(try number())
            }
        }

        /// The members of an object whose `{` was just read, in document order, up to and
        /// including its `}`. A duplicate name is found when it is read: by comparing with
        /// the names before it while there are few (a manifest has about ten), then through
        /// a set.
        mutating func members(depth: Int) throws(JSONSyntaxError) -> (keys: [String], values: [JSONValue]) {
            var keys: [String] = []
            var values: [JSONValue] = []
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") { index += 1; return (keys, values) }
            keys.reserveCapacity(Self.linearMemberLimit)
            values.reserveCapacity(Self.linearMemberLimit)
            var seen: Set<String> = []
            while true {
                skipSpace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw error("expected a member name in quotes") }
                let keyOffset = index
                let key = try string()
                let duplicate = keys.count < Self.linearMemberLimit ? keys.contains(key) : !seen.insert(key).inserted
                guard !duplicate else {
                    throw JSONSyntaxError(offset: keyOffset, message: "duplicate member name \(JSONValue.quote(key))")
                }
                keys.append(key)
                if keys.count == Self.linearMemberLimit { seen = Set(keys) }
                skipSpace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw error("expected ':' after a member name") }
                index += 1
                values.append(try value(depth: depth + 1))
                skipSpace()
                guard index < bytes.count else { throw error("unexpected end of input in an object") }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                if bytes[index] == UInt8(ascii: "}") { index += 1; return (keys, values) }
                throw error("expected ',' or '}' in an object")
            }
        }

        mutating func literal(_ word: StaticString) throws(JSONSyntaxError) {
            let count = word.utf8CodeUnitCount
            guard index + count <= bytes.count,
                  bytes[index..<index + count].elementsEqual(UnsafeBufferPointer(start: word.utf8Start, count: count))
            else { throw error("invalid literal") }
            index += count
        }

        mutating func number() throws(JSONSyntaxError) -> Double {
            let start = index
            func digits() -> Int {
                let from = index
                while index < bytes.count, bytes[index] >= 0x30, bytes[index] <= 0x39 { index += 1 }
                return index - from
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
            let integerStart = index
            let integerDigits = digits()
            guard integerDigits > 0 else { throw error("expected a value") }
            if integerDigits > 1, bytes[integerStart] == UInt8(ascii: "0") {
                throw JSONSyntaxError(offset: integerStart, message: "leading zero in a number")
            }
            var isInteger = true
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
                isInteger = false
                index += 1
                guard digits() > 0 else { throw error("expected digits after '.'") }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                isInteger = false
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
                guard digits() > 0 else { throw error("expected digits in an exponent") }
            }
            // A short integer (nearly every number a manifest or a request holds) is exact in
            // a Double: read its digits directly rather than through text.
            if isInteger, integerDigits <= 15 {
                var magnitude = 0
                for digit in bytes[integerStart..<index] { magnitude = magnitude * 10 + Int(digit - 0x30) }
                return integerStart > start ? -Double(magnitude) : Double(magnitude)
            }
            let text = String(decoding: bytes[start..<index], as: UTF8.self)
            guard let value = Double(text) else { throw JSONSyntaxError(offset: start, message: "invalid number") }
            guard value.isFinite else {
                throw JSONSyntaxError(offset: start, message: "number \(text.prefix(40)) is out of range (beyond ±1.8e308)")
            }
            // An integer literal stands for one integer: it is never rounded to a neighbour.
            if isInteger, integerDigits > 15, !Self.isExact(value, digits: bytes[integerStart..<index]) {
                throw JSONSyntaxError(offset: start, message:
                    "integer \(text.prefix(40)) is not exactly a JSON number (integers are exact only up to ±2^53); send it as a decimal string")
            }
            return value
        }

        /// Whether the whole double `value` is exactly the decimal `digits` (no sign, no
        /// leading zero): its exact decimal expansion, worked out in base 10^9, is `digits`.
        static func isExact(_ value: Double, digits: ArraySlice<UInt8>) -> Bool {
            let magnitude = value.magnitude
            guard magnitude >= 0x1p63 else { return digits.elementsEqual(String(UInt64(magnitude)).utf8) }
            // magnitude = significand * 2^shift with a 53-bit significand and shift > 10.
            let shift = Int(magnitude.exponent) - 52
            let significand = UInt64(magnitude.significandBitPattern | (1 << 52))
            var limbs: [UInt64] = [significand % 1_000_000_000, significand / 1_000_000_000]  // least significant first
            for _ in 0..<shift {
                var carry: UInt64 = 0
                for i in limbs.indices {
                    let doubled = limbs[i] * 2 + carry
                    limbs[i] = doubled % 1_000_000_000
                    carry = doubled / 1_000_000_000
                }
                if carry > 0 { limbs.append(carry) }
            }
            while limbs.count > 1, limbs.last == 0 { limbs.removeLast() }
            var text = String(limbs.last!)
            for limb in limbs.dropLast().reversed() {
                let part = String(limb)
                text += String(repeating: "0", count: 9 - part.count) + part
            }
            return digits.elementsEqual(text.utf8)
        }

        mutating func string() throws(JSONSyntaxError) -> String {
            index += 1  // opening quote
            // Fast path: no escapes, as in nearly every manifest string.
            var end = index
            while end < bytes.count, bytes[end] != UInt8(ascii: "\""), bytes[end] != UInt8(ascii: "\\"), bytes[end] >= 0x20 {
                end += 1
            }
            if end < bytes.count, bytes[end] == UInt8(ascii: "\"") {
                let text = try utf8(index..<end)
                index = end + 1
                return text
            }
            var scalars = String.UnicodeScalarView()
            var runStart = index
            func flush(_ end: Int) throws(JSONSyntaxError) { scalars.append(contentsOf: try utf8(runStart..<end).unicodeScalars) }
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    try flush(index)
                    index += 1
                    return String(scalars)
                }
                if byte < 0x20 { throw error("control character in a string") }
                if byte != UInt8(ascii: "\\") { index += 1; continue }
                try flush(index)
                index += 1
                guard index < bytes.count else { break }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""): scalars.append("\"")
                case UInt8(ascii: "\\"): scalars.append("\\")
                case UInt8(ascii: "/"): scalars.append("/")
                case UInt8(ascii: "b"): scalars.append("\u{08}")
                case UInt8(ascii: "f"): scalars.append("\u{0C}")
                case UInt8(ascii: "n"): scalars.append("\n")
                case UInt8(ascii: "r"): scalars.append("\r")
                case UInt8(ascii: "t"): scalars.append("\t")
                case UInt8(ascii: "u"):
                    var code = try hex4()
                    if (0xD800..<0xDC00).contains(code), index + 1 < bytes.count,
                       bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") {
                        index += 2
                        let low = try hex4()
                        guard (0xDC00..<0xE000).contains(low) else { throw error("invalid surrogate pair") }
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    }
                    guard let scalar = Unicode.Scalar(code) else { throw error("invalid \\u escape") }
                    scalars.append(scalar)
                default:
                    throw error("invalid escape in a string")
                }
                runStart = index
            }
            throw error("unterminated string")
        }

        /// The bytes in `range` as a string; an error at the first byte that is not valid
        /// UTF-8 (never a replacement character).
        func utf8(_ range: Range<Int>) throws(JSONSyntaxError) -> String {
            // ASCII (nearly every string) is valid UTF-8 as it is.
            precondition(range.lowerBound >= 0 && range.upperBound <= bytes.count, "JSON string range outside the input")
            let ascii = bytes.withUnsafeBufferPointer { all -> String? in
                let part = UnsafeBufferPointer(rebasing: all[range])
                return part.allSatisfy({ $0 < 0x80 }) ? String(decoding: part, as: UTF8.self) : nil
            }
            if let ascii { return ascii }
            if let text = String(validating: bytes[range], as: UTF8.self) { return text }
            let offset = range.lowerBound + (JSONSyntaxError(invalidUTF8In: bytes[range])?.offset ?? 0)
            throw JSONSyntaxError(offset: offset, message: "invalid UTF-8 in a string")
        }

        mutating func hex4() throws(JSONSyntaxError) -> UInt32 {
            guard index + 4 <= bytes.count else { throw error("short \\u escape") }
            var code: UInt32 = 0
            for _ in 0..<4 {
                let byte = bytes[index]
                let digit: UInt32
                switch byte {
                case 0x30...0x39: digit = UInt32(byte - 0x30)
                case 0x41...0x46: digit = UInt32(byte - 0x41 + 10)
                case 0x61...0x66: digit = UInt32(byte - 0x61 + 10)
                default: throw error("invalid hex digit in a \\u escape")
                }
                code = code << 4 | digit
                index += 1
            }
            return code
        }
    }
}

/// Where and why JSON text is not valid: what `JSONValue.parse(_:)` throws.
public struct JSONSyntaxError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The offset in the input, in bytes from 0, of the first byte that is wrong (for a
    /// duplicate member name, its opening quote; for a number, its first character).
    public var offset: Int
    /// What is wrong there, e.g. `duplicate member name "id"`.
    public var message: String

    public init(offset: Int, message: String) {
        self.offset = offset
        self.message = message
    }

    /// `not valid JSON at byte OFFSET: MESSAGE`.
    public var description: String { "not valid JSON at byte \(offset): \(message)" }
}

extension JSONSyntaxError {
    /// The first byte of `bytes` that is not valid UTF-8, located as `JSONValue.parse(_:)`
    /// locates it: `offset` counts from the start of `bytes`, `message` is "invalid UTF-8";
    /// nil when every byte is valid. For input checked before a parser sees it (a control
    /// request line, a command-line argument), so that a bad byte has one offset whichever
    /// layer finds it.
    public init?(invalidUTF8In bytes: ArraySlice<UInt8>) {
        guard String(validating: bytes, as: UTF8.self) == nil else { return nil }
        var iterator = bytes.makeIterator()
        var decoder = UTF8()
        var offset = 0
        while case .scalarValue(let scalar) = decoder.decode(&iterator) { offset += UTF8.width(scalar) }
        self.init(offset: offset, message: "invalid UTF-8")
    }
}
