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
    /// as integers (`1`, never `1.0`; negative zero as `-0`); NaN and infinities, which JSON cannot hold, as
    /// `null`; strings as `quote(_:)` writes them. `parse(_:)` reads the text back to an
    /// equal value (but for NaN and infinities).
    public var jsonText: String {
        var out: [UInt8] = []
        out.reserveCapacity(64)
        write(into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends the UTF-8 bytes of `jsonText` to `out`, with no `String` in between: for a
    /// writer that sends the text at once (the host's frames to its worker processes).
    @_spi(ModuleHost)
    public func appendJSONText(to out: inout [UInt8]) { write(into: &out) }

    /// Appends `jsonText` to `out`: one buffer of bytes for the whole value (appending to
    /// a byte array costs a fraction of appending to a `String`).
    private func write(into out: inout [UInt8]) {
        switch self {
        case .null: Self.append("null", to: &out)
        case .bool(let value): Self.append(value ? "true" : "false", to: &out)
        case .number(let value):
            // Whole numbers a double holds exactly (up to 2^53) print as integers, never `1.0`;
            // negative zero keeps its sign.
            if value.isFinite, value == value.rounded(), abs(value) <= 0x1p53 {
                if value == 0, value.sign == .minus { out.append(UInt8(ascii: "-")) }
                Self.append(Int64(value), to: &out)
            } else {
                out.append(contentsOf: (value.isFinite ? "\(value)" : "null").utf8)
            }
        case .string(let value): Self.appendQuoted(value, to: &out)
        case .array(let values):
            out.append(UInt8(ascii: "["))
            for (index, value) in values.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                value.write(into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (index, member) in members.sorted(by: { $0.key < $1.key }).enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                Self.appendQuoted(member.key, to: &out)
                out.append(UInt8(ascii: ":"))
                member.value.write(into: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    private static func append(_ text: StaticString, to out: inout [UInt8]) {
        out.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// Appends the decimal digits of `value` (with its sign), as `String(value)` writes them.
    private static func append(_ value: Int64, to out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes: room for 20 digits
        var count = 0
        withUnsafeMutableBytes(of: &digits) { buffer in
            repeat {
                buffer[23 - count] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
                count += 1
            } while magnitude > 0
            out.append(contentsOf: buffer[(24 - count)...])
        }
    }

    /// Appends `quote(text)` to `out`; text with nothing to escape (nearly all) is copied
    /// as it is. 0xC2 leads every C1 control in UTF-8, so text holding one takes `quote`.
    private static func appendQuoted(_ text: String, to out: inout [UInt8]) {
        var text = text
        let plain = text.withUTF8 { bytes -> Bool in
            guard !bytes.contains(where: { $0 < 0x20 || $0 == 0x22 || $0 == 0x5C || $0 == 0x7F || $0 == 0xC2 }) else { return false }
            out.append(UInt8(ascii: "\""))
            out.append(contentsOf: bytes)
            out.append(UInt8(ascii: "\""))
            return true
        }
        if !plain { out.append(contentsOf: quote(text).utf8) }
    }

    /// `text` for a terminal or a log line: unchanged when it has no control character,
    /// else as `quote` without the quotes (`1\n\u001b[2J`), so text from a plugin never
    /// breaks a line nor sends a terminal escape sequence. Besides C0, DEL and C1, the
    /// characters that change the direction of the text around them (U+061C, U+200E,
    /// U+200F, U+202A to U+202E, U+2066 to U+2069) and the line and paragraph separators
    /// (U+2028, U+2029) are escaped: in a terminal or a log viewer they would make a line
    /// show something else than it holds.
    public static func escapingControlCharacters(_ text: String) -> String {
        guard hasControlCharacters(text) else { return text }
        return String(quote(text).dropFirst().dropLast())
    }

    /// Whether `text` holds a character `escapingControlCharacters` escapes.
    public static func hasControlCharacters(_ text: String) -> Bool {
        text.unicodeScalars.contains(where: isControlCharacter)
    }

    /// Whether `escapingControlCharacters` escapes `scalar`: C0, DEL, C1, and the
    /// characters that reorder or break a shown line.
    public static func isControlCharacter(_ scalar: Unicode.Scalar) -> Bool {
        isControl(scalar) || isLayoutControl(scalar)
    }

    /// C0 controls, DEL and C1 controls (0x9B alone starts a terminal escape sequence).
    private static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7f...0x9f).contains(scalar.value)
    }

    /// The bidirectional formatting characters and the line and paragraph separators.
    private static func isLayoutControl(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069, 0x2028, 0x2029: true
        default: false
        }
    }

    /// `text` as a JSON string literal with its quotes; `"`, `\\`, control characters (C0,
    /// DEL and C1) and the characters that reorder or break a shown line (as
    /// `escapingControlCharacters`) escaped, so the result is always one line that shows
    /// what it holds.
    public static func quote(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where isControlCharacter(scalar):
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


/// `Codable` types to and from `JSONValue`, without text in between: the host writes its
/// replies and files as `JSONValue` (so `jsonText` is the one JSON writer) and reads what
/// `parse(_:)` produced into its types (so the strict parser is the one reader).
extension JSONValue {
    /// `value` as a JSON value, through its `Encodable` conformance.
    ///
    /// Numbers must be ones JSON holds exactly: a NaN or an infinity, or an integer beyond
    /// ±2^53, throws `EncodingError.invalidValue` naming the coding path. Optionals that are
    /// nil are left out by the synthesized conformances, as with `JSONEncoder`; a type that
    /// encodes nothing is an empty object. `Date`, `Data` and `URL` encode as their own
    /// conformances say (no special forms). Safe to call from any thread.
    public init(encoding value: some Encodable) throws {
        let root = EncodedNode()
        try root.encode(value, codingPath: [])
        self = root.value
    }

    /// This value as a `T`, through its `Decodable` conformance.
    ///
    /// Types must match exactly: a string is never read as a number nor a number as a
    /// string; an integer type reads only a whole number within its range (`1.5` or `300`
    /// for a `UInt8` throws). Errors are `DecodingError`s naming the coding path. Unknown
    /// object members are ignored, as the synthesized conformances do. Safe to call from any
    /// thread.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try ValueDecoder(value: self, codingPath: []).decodeLeaf(T.self)
    }

    /// The same text as `jsonText`, indented for people: one member or element a line,
    /// two spaces a level, `"key" : value`, keys sorted; empty arrays and objects as `[]`
    /// and `{}`.
    public var prettyJSONText: String {
        var out = ""
        writePretty(into: &out, indent: "")
        return out
    }

    private func writePretty(into out: inout String, indent: String) {
        let inner = indent + "  "
        switch self {
        case .array(let elements) where !elements.isEmpty:
            out += "[\n"
            for (index, element) in elements.enumerated() {
                out += inner
                element.writePretty(into: &out, indent: inner)
                out += index == elements.count - 1 ? "\n" : ",\n"
            }
            out += indent + "]"
        case .object(let members) where !members.isEmpty:
            out += "{\n"
            let keys = members.keys.sorted()
            for (index, key) in keys.enumerated() {
                out += inner + Self.quote(key) + " : "
                members[key]!.writePretty(into: &out, indent: inner)
                out += index == keys.count - 1 ? "\n" : ",\n"
            }
            out += indent + "}"
        default:
            out += jsonText
        }
    }
}

// MARK: Encoding

/// One value being encoded: a leaf, an object or an array whose children are still
/// being filled in by the containers that point at them.
private final class EncodedNode {
    /// A member: a value already complete (a scalar), or one still being encoded.
    private enum Member {
        case value(JSONValue)
        case node(EncodedNode)

        var value: JSONValue {
            switch self {
            case .value(let value): value
            case .node(let node): node.value
            }
        }
    }

    private var leaf: JSONValue?
    private var members: [String: Member]?
    private var elements: [EncodedNode]?

    var value: JSONValue {
        if let members { return .object(members.mapValues(\.value)) }
        if let elements { return .array(elements.map(\.value)) }
        return leaf ?? .object([:])
    }

    func setLeaf(_ value: JSONValue) {
        leaf = value
        members = nil
        elements = nil
    }

    func member(_ key: String) -> EncodedNode {
        makeObject()
        let child = EncodedNode()
        members![key] = .node(child)
        return child
    }

    /// Sets member `key` to a complete value.
    func setMember(_ key: String, _ value: JSONValue) {
        makeObject()
        members![key] = .value(value)
    }

    func makeObject() { if members == nil { leaf = nil; elements = nil; members = [:] } }

    func makeArray() { if elements == nil { leaf = nil; members = nil; elements = [] } }

    func appendElement() -> EncodedNode {
        makeArray()
        let child = EncodedNode()
        elements!.append(child)
        return child
    }

    var count: Int { elements?.count ?? 0 }

    /// Encodes `value` here: JSON's own scalars directly, anything else through its
    /// conformance.
    func encode<T: Encodable>(_ value: T, codingPath: [any CodingKey]) throws {
        func invalid(_ what: String) -> EncodingError {
            EncodingError.invalidValue(value, .init(codingPath: codingPath, debugDescription: what))
        }
        switch value {
        case let value as JSONValue: setLeaf(value)
        case let value as String: setLeaf(.string(value))
        case let value as Bool: setLeaf(.bool(value))
        case let value as Double:
            guard value.isFinite else { throw invalid("\(value) is not a JSON number") }
            setLeaf(.number(value))
        case let value as Float:
            guard value.isFinite else { throw invalid("\(value) is not a JSON number") }
            setLeaf(.number(Double(value)))
        case let value as any BinaryInteger:
            guard let number = Self.exactNumber(value) else {
                throw invalid("\(value) is beyond ±2^53, where JSON numbers are exact")
            }
            setLeaf(.number(number))
        default:
            try value.encode(to: NodeEncoder(node: self, codingPath: codingPath))
        }
    }

    private static func exactNumber(_ value: some BinaryInteger) -> Double? {
        guard let wide = Int64(exactly: value), wide.magnitude <= 1 << 53 else { return nil }
        return Double(wide)
    }
}

private struct NodeEncoder: Encoder {
    let node: EncodedNode
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        node.makeObject()
        return KeyedEncodingContainer(KeyedNodeEncoder<Key>(node: node, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        node.makeArray()
        return UnkeyedNodeEncoder(node: node, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        SingleNodeEncoder(node: node, codingPath: codingPath)
    }
}

private struct KeyedNodeEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let node: EncodedNode
    let codingPath: [any CodingKey]

    mutating func encodeNil(forKey key: Key) throws { node.setMember(key.stringValue, .null) }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try node.member(key.stringValue).encode(value, codingPath: codingPath + [key])
    }

    // The scalars of synthesized conformances, without a dynamic cast or a coding path
    // (which only an error needs).
    mutating func encode(_ value: String, forKey key: Key) throws { node.setMember(key.stringValue, .string(value)) }
    mutating func encode(_ value: Bool, forKey key: Key) throws { node.setMember(key.stringValue, .bool(value)) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { node.setMember(key.stringValue, .number(Double(value))) }
    mutating func encode(_ value: Double, forKey key: Key) throws {
        guard value.isFinite else { return try node.member(key.stringValue).encode(value, codingPath: codingPath + [key]) }
        node.setMember(key.stringValue, .number(value))
    }
    mutating func encode(_ value: Int, forKey key: Key) throws {
        guard value.magnitude > 1 << 53 else { return node.setMember(key.stringValue, .number(Double(value))) }
        try node.member(key.stringValue).encode(value, codingPath: codingPath + [key])
    }
    mutating func encode(_ value: Int64, forKey key: Key) throws {
        guard value.magnitude > 1 << 53 else { return node.setMember(key.stringValue, .number(Double(value))) }
        try node.member(key.stringValue).encode(value, codingPath: codingPath + [key])
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key)
        -> KeyedEncodingContainer<NestedKey>
    {
        NodeEncoder(node: node.member(key.stringValue), codingPath: codingPath + [key]).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        NodeEncoder(node: node.member(key.stringValue), codingPath: codingPath + [key]).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder {
        NodeEncoder(node: node.member("super"), codingPath: codingPath + [JSONCodingKey("super")])
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        NodeEncoder(node: node.member(key.stringValue), codingPath: codingPath + [key])
    }
}

private struct UnkeyedNodeEncoder: UnkeyedEncodingContainer {
    let node: EncodedNode
    let codingPath: [any CodingKey]
    var count: Int { node.count }

    private var nextPath: [any CodingKey] { codingPath + [JSONCodingKey(index: count)] }

    mutating func encodeNil() throws { node.appendElement().setLeaf(.null) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        let path = nextPath
        try node.appendElement().encode(value, codingPath: path)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let path = nextPath
        return NodeEncoder(node: node.appendElement(), codingPath: path).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let path = nextPath
        return NodeEncoder(node: node.appendElement(), codingPath: path).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder {
        let path = nextPath
        return NodeEncoder(node: node.appendElement(), codingPath: path)
    }
}

private struct SingleNodeEncoder: SingleValueEncodingContainer {
    let node: EncodedNode
    let codingPath: [any CodingKey]

    mutating func encodeNil() throws { node.setLeaf(.null) }

    mutating func encode<T: Encodable>(_ value: T) throws { try node.encode(value, codingPath: codingPath) }
}

/// A coding key for array positions and names the containers make up.
private struct JSONCodingKey: CodingKey {
    var stringValue: String
    var intValue: Int?

    init(_ string: String) { stringValue = string }
    init(index: Int) { stringValue = "Index \(index)"; intValue = index }
    init?(stringValue: String) { self.init(stringValue) }
    init?(intValue: Int) { self.init(index: intValue) }
}

// MARK: Decoding

private struct ValueDecoder: Decoder {
    let value: JSONValue
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func mismatch<T>(_ type: T.Type, _ expected: String) -> DecodingError {
        .typeMismatch(type, .init(codingPath: codingPath, debugDescription: "expected \(expected), found \(value.kind)"))
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .object(let members) = value else { throw mismatch([String: JSONValue].self, "an object") }
        return KeyedDecodingContainer(KeyedValueDecoder<Key>(members: members, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let elements) = value else { throw mismatch([JSONValue].self, "an array") }
        return UnkeyedValueDecoder(elements: elements, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { SingleValueDecoder(decoder: self) }

    /// `value` as a `T`: JSON's own scalars directly, anything else through its conformance.
    func decodeLeaf<T: Decodable>(_ type: T.Type) throws -> T {
        if T.self == JSONValue.self { return value as! T }
        if T.self == String.self {
            guard case .string(let text) = value else { throw mismatch(type, "a string") }
            return text as! T
        }
        if T.self == Bool.self {
            guard case .bool(let flag) = value else { throw mismatch(type, "true or false") }
            return flag as! T
        }
        if T.self == Double.self {
            guard case .number(let number) = value else { throw mismatch(type, "a number") }
            return number as! T
        }
        if T.self == Float.self {
            guard case .number(let number) = value else { throw mismatch(type, "a number") }
            let narrow = Float(number)
            guard narrow.isFinite else {
                throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "\(number) is beyond the range of a Float"))
            }
            return narrow as! T
        }
        if let integer = T.self as? any (BinaryInteger & Decodable).Type {
            return try decodeInteger(integer) as! T
        }
        return try T(from: self)
    }

    private func decodeInteger<I: BinaryInteger & Decodable>(_ type: I.Type) throws -> I {
        guard case .number(let number) = value else { throw mismatch(type, "an integer") }
        guard let integer = I(exactly: number) else {
            throw DecodingError.dataCorrupted(.init(
                codingPath: codingPath, debugDescription: "\(JSONValue.number(number).jsonText) is not an integer of type \(I.self)"))
        }
        return integer
    }
}

private struct KeyedValueDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let members: [String: JSONValue]
    let codingPath: [any CodingKey]

    var allKeys: [Key] { members.keys.compactMap { Key(stringValue: $0) } }

    func contains(_ key: Key) -> Bool { members[key.stringValue] != nil }

    private func member(_ key: Key) throws -> JSONValue {
        guard let value = members[key.stringValue] else {
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no member \"\(key.stringValue)\""))
        }
        return value
    }

    private func decoder(_ key: Key) throws -> ValueDecoder {
        ValueDecoder(value: try member(key), codingPath: codingPath + [key])
    }

    func decodeNil(forKey key: Key) throws -> Bool { try member(key) == .null }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try decoder(key).decodeLeaf(type) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws
        -> KeyedDecodingContainer<NestedKey>
    {
        try decoder(key).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try decoder(key).unkeyedContainer()
    }

    func superDecoder() throws -> any Decoder {
        ValueDecoder(value: members["super"] ?? .null, codingPath: codingPath + [JSONCodingKey("super")])
    }

    func superDecoder(forKey key: Key) throws -> any Decoder {
        ValueDecoder(value: members[key.stringValue] ?? .null, codingPath: codingPath + [key])
    }
}

private struct UnkeyedValueDecoder: UnkeyedDecodingContainer {
    let elements: [JSONValue]
    let codingPath: [any CodingKey]
    var currentIndex = 0

    init(elements: [JSONValue], codingPath: [any CodingKey]) {
        self.elements = elements
        self.codingPath = codingPath
    }

    var count: Int? { elements.count }
    var isAtEnd: Bool { currentIndex >= elements.count }

    private mutating func next<T>(_ type: T.Type) throws -> ValueDecoder {
        let path = codingPath + [JSONCodingKey(index: currentIndex)]
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(type, .init(codingPath: path, debugDescription: "the array has no more elements"))
        }
        defer { currentIndex += 1 }
        return ValueDecoder(value: elements[currentIndex], codingPath: path)
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd, elements[currentIndex] == .null else { return false }
        currentIndex += 1
        return true
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try next(type).decodeLeaf(type) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        try next([String: JSONValue].self).container(keyedBy: type)
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        try next([JSONValue].self).unkeyedContainer()
    }

    mutating func superDecoder() throws -> any Decoder { try next(JSONValue.self) }
}

private struct SingleValueDecoder: SingleValueDecodingContainer {
    let decoder: ValueDecoder
    var codingPath: [any CodingKey] { decoder.codingPath }

    func decodeNil() -> Bool { decoder.value == .null }

    func decode<T: Decodable>(_ type: T.Type) throws -> T { try decoder.decodeLeaf(type) }
}
