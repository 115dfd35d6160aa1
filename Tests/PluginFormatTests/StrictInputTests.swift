import Foundation
@testable import PluginFormat
import Testing

/// The strict JSON rules (`JSONValue.parse`, tested in ModuleKitTests) as the manifest
/// reader reports them.
@Suite(.timeLimit(.minutes(5))) struct StrictManifestTests {
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
}

@Suite(.timeLimit(.minutes(5))) struct NameGrammarTests {
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

    @Test func aVersionIsAtMost64Bytes() throws {
        func manifest(version: String) -> [UInt8] {
            Array(String(decoding: Self.manifest(), as: UTF8.self).replacingOccurrences(of: #""version":"1""#, with: #""version":"\#(version)""#).utf8)
        }
        #expect(try Manifest.parse(manifest(version: String(repeating: "1", count: 64))).version.count == 64)
        #expect {
            try Manifest.parse(manifest(version: String(repeating: "é", count: 40)))
        } throws: { error in
            "\(error)".contains(#"field "version" is ""#) && "\(error)".contains("80 bytes: versions are at most 64 bytes")
        }
    }

    @Test func anOrderOutsideItsRangeIsRefused() throws {
        var text = String(decoding: Self.manifest(), as: UTF8.self)
        text.removeLast()
        #expect(throws: ManifestError.self) { try Manifest.parse(Array((text + #","order":1e300}"#).utf8)) }
        #expect(try Manifest.parse(Array((text + #","order":-1000000}"#).utf8)).order == -1_000_000)
    }
}
