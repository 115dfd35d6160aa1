import Foundation
import PluginCall
import Testing

@Suite("Byte buffers as base64", .timeLimit(.minutes(5)))
struct Base64Tests {
    @Test("bytes are written as Foundation writes them and read back")
    func foundationsText() throws {
        var generator = SystemRandomNumberGenerator()
        for count in 0..<40 {
            let bytes = (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let text = Data(bytes).base64EncodedString()
            #expect(CallValue.bytes(bytes).json == .string(text))
            #expect(try ValueType.buf.value(fromJSON: .string(text)) == .bytes(bytes))
            #expect(try ValueType.buf.parse("base64:" + text) == .bytes(bytes))
        }
        let all = (0...255).map { UInt8($0) }
        #expect(CallValue.bytes(all).json == .string(Data(all).base64EncodedString()))
    }

    @Test("only RFC 4648 base64 is read: padded to 4 characters, = only at the end, nothing else",
          arguments: ["A", "AA", "AAA", "AA=", "A===", "====", "AA=A", "A=AA", "AAAA====", "AAA=AAAA", "AA==\n", " AAA",
                      "AA-_", "AA.=", "ARxD=", "é==="])
    func refused(_ text: String) {
        #expect(throws: ValueError.self) { try ValueType.buf.value(fromJSON: .string(text)) }
        #expect(throws: ValueError.self) { try ValueType.buf.parse("base64:" + text) }
    }

    @Test("padding and the bits it leaves over")
    func padding() throws {
        #expect(try ValueType.buf.value(fromJSON: .string("")) == .bytes([]))
        #expect(try ValueType.buf.value(fromJSON: .string("AP8=")) == .bytes([0, 255]))
        #expect(try ValueType.buf.value(fromJSON: .string("/w==")) == .bytes([255]))
        // Bits past the last byte are ignored, as Foundation does.
        #expect(try ValueType.buf.value(fromJSON: .string("AB==")) == .bytes([0]))
        #expect(try ValueType.buf.value(fromJSON: .string("+/+/")) == .bytes([0xfb, 0xff, 0xbf]))
    }
}
