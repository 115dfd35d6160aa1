@_spi(ModuleHost) import ModuleKit

/// The frames of the two hot paths of an isolated plugin, a synchronous custom event or
/// notification and a call by name, and of their answers, in bytes rather than JSON
/// (docs/isolation.md, "Compact frames"): writing and reading their JSON took longer than
/// the kernel takes to move the frames.
///
/// Each is another spelling of a JSON message the protocol already has, and reads as
/// exactly that message (`WorkerMessage`): whatever a compact frame can say, a JSON frame
/// could say too, so a worker that writes them can do nothing it could not do before. Its
/// first byte (the tag, 1 to 4) is one no JSON text starts with. Every length is checked against
/// the frame before it is used; a frame that does not hold exactly what its lengths say,
/// or whose text is not valid UTF-8, is invalid, as a JSON frame that does not parse is.
///
/// - event (tag 1): `[1][id: 8 bytes LE][kind: 1 = custom, 2 = notification]
///   [module: 4-byte LE length, UTF-8][event: the same][payload: the rest, one JSON text]`,
///   the request `{"op":"event","module":M,"kind":K,"event":E,"payload":J,"id":N}`.
/// - answer (tag 2): `[2][id: 8 bytes LE][stuck: the rest, UTF-8, possibly empty]`, the
///   reply `{"id":N}`, or `{"stuck":S,"id":N}` when the rest is not empty.
/// - call (tag 3): `[3][id: 8 bytes LE][arguments: 0 = none, 1 = texts, 2 = json]
///   [function: 4-byte LE length, UTF-8][the arguments: the rest, a JSON array; empty for
///   none]`, the request `{"op":"call","function":F,"texts":[...],"id":N}` (or `"json"`,
///   or neither).
/// - result (tag 4): `[4][id: 8 bytes LE][type: 4-byte LE length, UTF-8][value: the rest,
///   one JSON text]`, the reply `{"type":T,"value":J,"id":N}`. An error is answered in JSON.
///
/// Ids are whole numbers from 0 to 2^53 (as JSON numbers hold them exactly). The daemon's
/// request ids count up from 1 and stay in that range; an answer to any other id (only a
/// request the plugin's code forged could have one) is sent as JSON.
enum CompactFrame {
    static let eventTag: UInt8 = 1
    static let answerTag: UInt8 = 2
    static let callTag: UInt8 = 3
    static let resultTag: UInt8 = 4
    /// The largest id a compact frame carries.
    static let maximumID = 1 << 53

    /// The kinds of event a compact frame carries.
    enum Kind: UInt8 {
        case custom = 1
        case notification = 2

        init?(_ name: String) {
            switch name {
            case "custom": self = .custom
            case "notification": self = .notification
            default: return nil
            }
        }

        var name: String { self == .custom ? "custom" : "notification" }
    }

    /// True when `body` (a frame's body) is a compact frame rather than JSON.
    static func isCompact(_ body: ArraySlice<UInt8>) -> Bool { body.first.map { (eventTag...resultTag).contains($0) } ?? false }

    /// How a call's arguments are given (`IsolatedPlugin.call`).
    enum Arguments {
        case none
        case texts([String])
        case json([JSONValue])

        var code: UInt8 {
            switch self {
            case .none: 0
            case .texts: 1
            case .json: 2
            }
        }
    }

    /// The frame (with its header) of event request `id` (from 0 to 2^53); nil when it would
    /// be larger than `WorkerFrame.maximumSize`, as its JSON would be too.
    static func event(id: Int, kind: Kind, module: String, event: String, payload: JSONValue) -> [UInt8]? {
        precondition((0...maximumID).contains(id), "request ids count up from 0")
        var frame: [UInt8] = [0, 0, 0, 0, eventTag]
        frame.reserveCapacity(32 + module.utf8.count + event.utf8.count)
        appendLittleEndian(UInt64(id), to: &frame)
        frame.append(kind.rawValue)
        appendText(module, to: &frame)
        appendText(event, to: &frame)
        payload.appendJSONText(to: &frame)
        return WorkerFrame.finish(&frame) ? frame : nil
    }

    /// The frame (with its header) of the answer to request `id`, saying that the module's
    /// code overran its deadline in `stuck` if given; nil when `id` is not a whole number
    /// from 0 to 2^53 (answer in JSON then).
    static func answer(id: JSONValue, stuck: String?) -> [UInt8]? {
        guard let number = id.wholeNumber, (0...maximumID).contains(number) else { return nil }
        var frame: [UInt8] = [0, 0, 0, 0, answerTag]
        appendLittleEndian(UInt64(number), to: &frame)
        if let stuck { frame.append(contentsOf: stuck.utf8) }
        return WorkerFrame.finish(&frame) ? frame : nil
    }

    /// The frame (with its header) of call request `id` (from 0 to 2^53); nil when it would
    /// be larger than `WorkerFrame.maximumSize`, as its JSON would be too.
    static func call(id: Int, function: String, arguments: Arguments) -> [UInt8]? {
        precondition((0...maximumID).contains(id), "request ids count up from 0")
        var frame: [UInt8] = [0, 0, 0, 0, callTag]
        frame.reserveCapacity(32 + function.utf8.count)
        appendLittleEndian(UInt64(id), to: &frame)
        frame.append(arguments.code)
        appendText(function, to: &frame)
        switch arguments {
        case .none: break
        case .texts(let texts): JSONValue.array(texts.map { .string($0) }).appendJSONText(to: &frame)
        case .json(let values): JSONValue.array(values).appendJSONText(to: &frame)
        }
        return WorkerFrame.finish(&frame) ? frame : nil
    }

    /// The frame (with its header) of the result of call `id`: a value of `type`, as JSON;
    /// nil when `id` is not a whole number from 0 to 2^53 or the frame would be too large
    /// (answer in JSON then).
    static func result(id: JSONValue, type: String, value: JSONValue) -> [UInt8]? {
        guard let number = id.wholeNumber, (0...maximumID).contains(number) else { return nil }
        var frame: [UInt8] = [0, 0, 0, 0, resultTag]
        appendLittleEndian(UInt64(number), to: &frame)
        appendText(type, to: &frame)
        value.appendJSONText(to: &frame)
        return WorkerFrame.finish(&frame) ? frame : nil
    }

    /// The message compact frame `body` says.
    static func message(_ body: ArraySlice<UInt8>) throws(FrameReader.End) -> WorkerMessage {
        var reader = Reader(body: body, offset: body.startIndex)
        let tag = try reader.byte()
        let id = try reader.id()
        switch tag {
        case eventTag:
            guard let kind = Kind(rawValue: try reader.byte()) else { throw .invalid("compact event of unknown kind") }
            let module = try reader.text(count: try reader.length())
            let event = try reader.text(count: try reader.length())
            return WorkerMessage(keys: ["op", "module", "kind", "event", "payload", "id"],
                                 values: [WorkerOp.event.json, .string(module), .string(kind.name), .string(event), try reader.json("payload"), id])
        case answerTag:
            guard reader.offset < body.endIndex else { return WorkerMessage(keys: ["id"], values: [id]) }
            return WorkerMessage(keys: ["stuck", "id"], values: [.string(try reader.text(count: body.endIndex - reader.offset)), id])
        case callTag:
            let form = try reader.byte()
            let function = try reader.text(count: try reader.length())
            let name: String
            switch form {
            case 0:
                guard reader.offset == body.endIndex else { throw .invalid("compact call without arguments has bytes after its function name") }
                return WorkerMessage(keys: ["op", "function", "id"], values: [WorkerOp.call.json, .string(function), id])
            case 1: name = "texts"
            case 2: name = "json"
            default: throw .invalid("compact call with arguments of unknown form \(form)")
            }
            return WorkerMessage(keys: ["op", "function", name, "id"], values: [WorkerOp.call.json, .string(function), try reader.json("arguments"), id])
        case resultTag:
            let type = try reader.text(count: try reader.length())
            return WorkerMessage(keys: ["type", "value", "id"], values: [.string(type), try reader.json("value"), id])
        default:
            throw .invalid("compact frame of unknown kind \(tag)")
        }
    }

    private static func appendLittleEndian<T: FixedWidthInteger>(_ value: T, to frame: inout [UInt8]) {
        for shift in stride(from: 0, to: T.bitWidth, by: 8) { frame.append(UInt8(truncatingIfNeeded: value >> shift)) }
    }

    /// A 4-byte length and the UTF-8 of `text` (a longer text makes the frame too large).
    private static func appendText(_ text: String, to frame: inout [UInt8]) {
        appendLittleEndian(UInt32(truncatingIfNeeded: text.utf8.count), to: &frame)
        frame.append(contentsOf: text.utf8)
    }

    /// Takes the fields of a compact frame in order, each checked to lie within it.
    private struct Reader {
        static let null: [UInt8] = Array("null".utf8)
        let body: ArraySlice<UInt8>
        /// The index in `body` of the next field.
        var offset: Int

        private mutating func take(_ count: Int, _ what: String) throws(FrameReader.End) -> ArraySlice<UInt8> {
            guard count >= 0, count <= body.endIndex - offset else {
                throw .invalid("compact frame of \(body.count) bytes ends inside its \(what)")
            }
            defer { offset += count }
            return body[offset..<offset + count]
        }

        mutating func byte() throws(FrameReader.End) -> UInt8 {
            let bytes = try take(1, "kind")
            return bytes[bytes.startIndex]
        }

        /// The little-endian integer of the next `count` bytes.
        private mutating func integer(_ count: Int, _ what: String) throws(FrameReader.End) -> UInt64 {
            let bytes = try take(count, what)
            var value: UInt64 = 0
            for index in bytes.indices.reversed() { value = value << 8 | UInt64(bytes[index]) }
            return value
        }

        mutating func id() throws(FrameReader.End) -> JSONValue {
            let value = try integer(8, "id")
            guard value <= UInt64(CompactFrame.maximumID) else { throw .invalid("compact frame id \(value) is past 2^53") }
            return .number(Double(value))
        }

        mutating func length() throws(FrameReader.End) -> Int { Int(try integer(4, "length")) }

        /// The rest of the frame, one JSON text (strict, as a JSON frame's).
        mutating func json(_ what: String) throws(FrameReader.End) -> JSONValue {
            let rest = body[offset...]
            offset = body.endIndex
            // Nearly every event's payload, and a call's whole-number result: as the parser
            // reads them, without its setup. (A leading zero or more digits go to the parser.)
            if rest.count == 4, rest.elementsEqual(Self.null) { return .null }
            if (1...15).contains(rest.count), rest.first != UInt8(ascii: "0") || rest.count == 1,
               rest.allSatisfy({ (0x30...0x39).contains($0) }) {
                return .number(Double(rest.reduce(0) { $0 * 10 + Int($1 - 0x30) }))
            }
            do {
                return try JSONValue.parse(Array(rest))
            } catch {
                throw .invalid("compact frame \(what): \(error)")
            }
        }

        mutating func text(count: Int) throws(FrameReader.End) -> String {
            let bytes = try take(count, "text")
            // ASCII (nearly every name) is valid UTF-8 as it is, as the JSON parser takes it.
            let ascii = bytes.withUnsafeBufferPointer { part -> String? in
                part.allSatisfy({ $0 < 0x80 }) ? String(decoding: part, as: UTF8.self) : nil
            }
            guard let text = ascii ?? String(validating: bytes, as: UTF8.self) else {
                throw .invalid("compact frame text is not valid UTF-8")
            }
            return text
        }
    }
}
