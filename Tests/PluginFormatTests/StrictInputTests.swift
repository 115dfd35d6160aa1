import Foundation
@testable import PluginFormat
import Testing

/// The strict JSON rules and the name grammar, at the parser every entry point uses.
@Suite struct StrictJSONTests {
    /// `text` must be refused with `message` at byte `offset`.
    static func refused(_ bytes: [UInt8], offset: Int, _ message: String) {
        do {
            let value = try JSONTree.parse(bytes)
            Issue.record("accepted \(value)")
        } catch {
            #expect(error.offset == offset, "\(error)")
            #expect(error.message.contains(message), "\(error)")
        }
    }

    @Test func aDuplicateMemberNameIsAnErrorAtItsOffset() throws {
        Self.refused(Array(#"{"a":1,"b":2,"a":3}"#.utf8), offset: 13, #"duplicate member name "a""#)
        Self.refused(Array(#"{"x":{"k":[],"k":{}}}"#.utf8), offset: 13, #"duplicate member name "k""#)
        // The same name in two different objects is fine.
        #expect(try JSONTree.parse(Array(#"[{"a":1},{"a":2}]"#.utf8)) == .array([.object(["a": .number(1)]), .object(["a": .number(2)])]))
    }

    @Test func leadingZerosAreAnError() throws {
        Self.refused(Array("0123".utf8), offset: 0, "leading zero")
        Self.refused(Array(#"{"order":-007}"#.utf8), offset: 10, "leading zero")
        Self.refused(Array("[00]".utf8), offset: 1, "leading zero")
        #expect(try JSONTree.parse(Array("[0, -0, 0.5, 10, 0e3]".utf8)) == .array([0, -0.0, 0.5, 10, 0].map(JSONTree.number)))
    }

    @Test func invalidUTF8IsAnErrorNotReplaced() throws {
        // A stray continuation byte, a truncated sequence, an overlong encoding and an
        // encoded surrogate, in fast-path and escaped strings and in member names.
        Self.refused(Array(#"["ab"#.utf8) + [0x80] + Array(#""]"#.utf8), offset: 4, "invalid UTF-8")
        Self.refused(Array(#"["\n"#.utf8) + [0xE2, 0x82] + Array(#""]"#.utf8), offset: 4, "invalid UTF-8")
        Self.refused(Array(#"{""#.utf8) + [0xC0, 0xAF] + Array(#"":1}"#.utf8), offset: 2, "invalid UTF-8")
        Self.refused(Array(#"["x"#.utf8) + [0xED, 0xA0, 0x80] + Array(#""]"#.utf8), offset: 3, "invalid UTF-8")
        Self.refused([0xFF], offset: 0, "expected a value")
        #expect(try JSONTree.parse(Array(#"["é€😀\n"]"#.utf8)) == .array([.string("é€😀\n")]))
    }

    @Test func aManifestBreakingAnyRuleIsRefusedWithTheOffset() {
        let head = Array(#"{"name":"x","version":"1","abi":"1.0","language":"c","modules":["m"],"#.utf8)
        for (tail, expected) in [(Array(#""name":"y"}"#.utf8), "at byte 69: duplicate member name \"name\""),
                                 (Array(#""order":012}"#.utf8), "at byte 77: leading zero"),
                                 (Array(#""order":1e999}"#.utf8), "at byte 77: number 1e999 is out of range"),
                                 (Array(#""description":""#.utf8) + [0xC3, 0x28] + Array(#""}"#.utf8), "at byte 84: invalid UTF-8")] {
            do {
                let manifest = try Manifest.parse(head + tail)
                Issue.record("accepted \(manifest)")
            } catch {
                #expect(error.reason.contains(expected), "\(error.reason)")
            }
        }
    }

    @Test func aNumberBeyondTheRangeOfADoubleIsAnError() throws {
        Self.refused(Array(#"{"v":1e400}"#.utf8), offset: 5, "1e400 is out of range")
        Self.refused(Array("-1e999".utf8), offset: 0, "out of range")
        #expect(try JSONTree.parse(Array("1e308".utf8)) == .number(1e308))
    }

    @Test func anIntegerADoubleDoesNotHoldExactlyIsAnErrorNotRounded() throws {
        Self.refused(Array(#"{"id":9007199254740993}"#.utf8), offset: 6, "integer 9007199254740993 is not exactly a JSON number")
        Self.refused(Array("[1,-9007199254740993]".utf8), offset: 3, "not exactly a JSON number")
        Self.refused(Array("18446744073709551615".utf8), offset: 0, "send it as a decimal string")
        Self.refused(Array(("1" + String(repeating: "0", count: 22) + "1").utf8), offset: 0, "not exactly")
        // Integers a double holds exactly, and numbers with a fraction or exponent, stay numbers.
        let exact: [(String, Double)] = [("9007199254740992", 0x1p53), ("-9007199254740992", -0x1p53),
                                         ("9007199254740994", 0x1p53 + 2), ("18446744073709551616", 0x1p64),
                                         ("1" + String(repeating: "0", count: 22), 1e22),
                                         ("9007199254740993.0", 0x1p53), ("9007199254740993e0", 0x1p53)]
        for (text, value) in exact {
            #expect(try JSONTree.parse(Array(text.utf8)) == .number(value), "\(text)")
        }
    }
}

@Suite struct NameGrammarTests {
    static let accepted = ["Greeting", "a", "calc_add", "com.example.tool-2", "_x", "9lives", String(repeating: "n", count: 64)]
    static let refused = ["", "../../x", "a/b", "a\nb", "esc\u{1B}[31m", ".hidden", "..", "-flag", "sp ace", "é",
                          String(repeating: "n", count: 65)]

    @Test func theGrammarAcceptsOnlySafeNames() {
        for name in Self.accepted { #expect(PluginName.problem(name) == nil, "\(name)") }
        for name in Self.refused { #expect(PluginName.problem(name) != nil, "\(name.debugDescription)") }
    }

    static func manifest(name: String = "Good", modules: [String] = ["good"], dependencies: [String] = []) -> [UInt8] {
        func list(_ items: [String]) -> String { items.map(quoted).joined(separator: ",") }
        func quoted(_ text: String) -> String {
            "\"" + text.unicodeScalars.map { $0.value < 0x20 ? String(format: "\\u%04x", $0.value) : String($0) }.joined() + "\""
        }
        return Array(#"{"name":\#(quoted(name)),"version":"1","abi":"1.0","language":"c","modules":[\#(list(modules))],"dependencies":[\#(list(dependencies))]}"#.utf8)
    }

    @Test(arguments: refused)
    func aManifestWithABadNameIsRefusedNamingTheFieldAndTheGrammar(bad: String) {
        for (bytes, field) in [(Self.manifest(name: bad), "\"name\""), (Self.manifest(modules: ["ok", bad]), "\"modules[1]\""),
                               (Self.manifest(dependencies: [bad]), "\"dependencies[0]\"")] {
            do {
                let manifest = try Manifest.parse(bytes)
                Issue.record("accepted \(manifest)")
            } catch {
                #expect(error.reason.contains("field \(field)"), "\(error.reason)")
                #expect(error.reason.contains("letters, digits"), "\(error.reason)")
                // One line, whatever the name holds.
                #expect(!error.reason.contains("\n") && !error.reason.contains("\u{1B}"), "\(error.reason.debugDescription)")
            }
        }
    }

    @Test func anOrderOutsideItsRangeIsRefused() throws {
        var text = String(decoding: Self.manifest(), as: UTF8.self)
        text.removeLast()
        #expect(throws: ManifestError.self) { try Manifest.parse(Array((text + #","order":1e300}"#).utf8)) }
        #expect(try Manifest.parse(Array((text + #","order":-1000000}"#).utf8)).order == -1_000_000)
    }
}
