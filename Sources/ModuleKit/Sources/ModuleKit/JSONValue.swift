/// A JSON value: the type of event payloads, module configuration and module metadata, and
/// the one JSON model of the host (manifests, configuration, control requests and replies,
/// call arguments and results).
///
/// It is a plain `Sendable` value so payloads can cross from the host to any module and
/// between host instances without sharing mutable state.
///
/// Reading and writing: `parse(_:)` is the strict reader (errors carry a byte offset);
/// `jsonText` is the one writer (compact, keys sorted). Decoding through `Codable` follows
/// the rules of the decoder used, not those of `parse(_:)`.
///
/// `@frozen`: JSON has exactly these six kinds, so its cases and their payloads are a
/// promise kept across ModuleKit versions; a plugin may switch over them without
/// `@unknown default`, and payloads pass by value without indirection.
@frozen
public enum JSONValue: Sendable, Hashable, Codable, CustomStringConvertible {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// The member `key` of an object, or nil for any other value or a missing key.
    public subscript(key: String) -> JSONValue? {
        if case .object(let members) = self { return members[key] }
        return nil
    }

    public var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    public var numberValue: Double? {
        if case .number(let value) = self { return value }
        return nil
    }

    public var boolValue: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }

    /// A name for the kind of value, for messages: "null", "a boolean", "a number",
    /// "a string", "an array" or "an object".
    public var kind: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .number: "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }

    /// Compact JSON text with sorted keys, the form passed to C modules.
    public var description: String { jsonText }

    /// Compact JSON text with sorted keys: the one JSON writer, so the same value always
    /// gives the same text. Whole numbers a double holds exactly (up to 2^53) are written
    /// as integers (`1`, never `1.0`); NaN and infinities, which JSON cannot hold, as
    /// `null`; strings as `quote(_:)` writes them. `parse(_:)` reads the text back to an
    /// equal value (but for NaN and infinities).
    public var jsonText: String {
        switch self {
        case .null: return "null"
        case .bool(let value): return value ? "true" : "false"
        case .number(let value):
            // Whole numbers a double holds exactly (up to 2^53) print as integers, never `1.0`.
            if value.isFinite, value == value.rounded(), abs(value) <= 0x1p53 {
                return String(Int64(value))
            }
            return value.isFinite ? "\(value)" : "null"
        case .string(let value): return Self.quote(value)
        case .array(let values): return "[" + values.map(\.jsonText).joined(separator: ",") + "]"
        case .object(let members):
            let body = members.keys.sorted().map { Self.quote($0) + ":" + members[$0]!.jsonText }
            return "{" + body.joined(separator: ",") + "}"
        }
    }

    /// `text` for a terminal or a log line: unchanged when it has no control character,
    /// else as `quote` without the quotes (`1\n\u001b[2J`), so text from a plugin never
    /// breaks a line nor sends a terminal escape sequence.
    public static func escapingControlCharacters(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: isControl) else { return text }
        return String(quote(text).dropFirst().dropLast())
    }

    /// C0 controls, DEL and C1 controls (0x9B alone starts a terminal escape sequence).
    private static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7f...0x9f).contains(scalar.value)
    }

    /// `text` as a JSON string literal with its quotes; `"`, `\\` and control characters
    /// (C0, DEL and C1) escaped, so the result is always one line.
    public static func quote(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where isControl(scalar):
                out += "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                    + String(scalar.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int) { self = .number(Double(value)) }
    public init(floatLiteral value: Double) { self = .number(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
    public init(nilLiteral: ()) { self = .null }
}

