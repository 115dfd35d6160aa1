/// Base64 (RFC 4648, section 4: the standard alphabet, with `=` padding) for byte buffers
/// in JSON and on the command line. It writes what Foundation's `base64EncodedString()`
/// writes, and reads what RFC 4648 allows, to the bytes Foundation's
/// `Data(base64Encoded:)` reads from it (Foundation also takes some text that is not
/// base64, such as `AA=A`: refused here).
enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// `bytes` as base64 text, padded with `=` to a multiple of 4 characters, on one line.
    static func encode(_ bytes: [UInt8]) -> String {
        var text: [UInt8] = []
        text.reserveCapacity((bytes.count + 2) / 3 * 4)
        var index = 0
        while index < bytes.count {
            let count = min(3, bytes.count - index)
            let b0 = UInt32(bytes[index])
            let b1 = count > 1 ? UInt32(bytes[index + 1]) : 0
            let b2 = count > 2 ? UInt32(bytes[index + 2]) : 0
            let group = b0 << 16 | b1 << 8 | b2
            text.append(alphabet[Int(group >> 18 & 63)])
            text.append(alphabet[Int(group >> 12 & 63)])
            text.append(count > 1 ? alphabet[Int(group >> 6 & 63)] : UInt8(ascii: "="))
            text.append(count > 2 ? alphabet[Int(group & 63)] : UInt8(ascii: "="))
            index += 3
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// The bytes `text` encodes; nil unless it is a multiple of 4 characters of the
    /// alphabet, with at most two `=` at its end only (no space, no line break, nothing
    /// else). The empty text is no bytes.
    static func decode(_ text: String) -> [UInt8]? {
        let characters = Array(text.utf8)
        guard characters.count % 4 == 0 else { return nil }
        var padding = 0
        while padding < 2, padding < characters.count, characters[characters.count - 1 - padding] == UInt8(ascii: "=") {
            padding += 1
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(characters.count / 4 * 3)
        var group: UInt32 = 0
        for (index, character) in characters[..<(characters.count - padding)].enumerated() {
            guard let value = sextet(character) else { return nil }
            group = group << 6 | UInt32(value)
            if index % 4 == 3 {
                bytes.append(UInt8(group >> 16 & 0xff))
                bytes.append(UInt8(group >> 8 & 0xff))
                bytes.append(UInt8(group & 0xff))
                group = 0
            }
        }
        switch padding {
        case 1: bytes.append(UInt8(group >> 10 & 0xff)); bytes.append(UInt8(group >> 2 & 0xff))
        case 2: bytes.append(UInt8(group >> 4 & 0xff))
        default: break
        }
        return bytes
    }

    /// The value of one character of the alphabet; nil for any other byte (`=` included).
    private static func sextet(_ character: UInt8) -> UInt8? {
        switch character {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): character - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): character - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): character - UInt8(ascii: "0") + 52
        case UInt8(ascii: "+"): 62
        case UInt8(ascii: "/"): 63
        default: nil
        }
    }
}
