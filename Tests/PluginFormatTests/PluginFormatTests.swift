import Foundation
import ModuleKit
@testable import PluginFormat
import Testing
import TestSupport

@Suite(.timeLimit(.minutes(5))) struct ManifestParsingTests {
    @Test func aCompleteManifestRoundTrips() throws {
        let text = #"""
            {"name":"Greeting","version":"1.0.0","description":"d \"quoted\" \u00e9","abi":"1.0","language":"swift",
             "toolchain":{"swift":"Swift version 6.3.1","moduleKit":"1.2"},"dependencies":["A"],"order":-3,
             "modules":["greeting"],"exports":[{"name":"f","signature":"i32(str)"}],"future":{"ignored":[1,2,3]}}
            """#
        let manifest = try Manifest.parse(Array(text.utf8))
        #expect(manifest.description == "d \"quoted\" é")
        #expect(manifest.order == -3)
        #expect(manifest.toolchain == .init(swift: "Swift version 6.3.1", moduleKit: "1.2"))
        #expect(manifest.toolchain?.moduleKitVersion ?? (0, 0) == (1, 2))
        #expect(manifest.toolchain?.compilerVersion == "6.3")
        #expect(manifest.exports == [.init(name: "f", signature: "i32(str)")])
        // An unknown field is listed (the validator refuses it), not an error of the parser.
        #expect(manifest.unknownFields == ["future"])
        #expect(manifest.unknownField?.problem == #"unknown field "future""#)
        // What plugin.mk embeds parses back to the same manifest, without it.
        var known = manifest
        known.unknownFields = []
        #expect(try Manifest.parse(Array(manifest.jsonText().utf8)) == known)
    }

    @Test(arguments: [
        ("Swift version 6.3.1 (swift-6.3.1-RELEASE)", "6.3"),
        ("Apple Swift version 6.2 (swiftlang-6.2.0.19.9 clang-1700.3.19.1)", "6.2"),
        ("Swift version 6.3-dev (LLVM abc, Swift def)", "6.3"),
        ("Swift version 10.12.1", "10.12"),
        ("Swift version 6", nil), ("Swift version .3", nil), ("swift 6.3.1", nil), ("", nil),
        ("Swift version 99999.1", nil),
    ] as [(String, String?)])
    func theCompilerVersionIsTakenFromSwiftcVersion(text: String, expected: String?) {
        #expect(Manifest.Toolchain.compilerVersion(of: text) == expected)
    }

    /// The version reader's quick path for digits.digits and its general path agree on
    /// every form, including the ones only the general path reads.
    @Test(arguments: [
        ("1.0", (1, 0)), ("01.20", (1, 20)), ("0.0", (0, 0)), ("123456789012345678.1", (123456789012345678, 1)),
        ("+1.0", (1, 0)), ("1.-2", (1, -2)), ("9223372036854775807.0", (Int.max, 0)),
        ("9223372036854775808.0", nil), ("1.", nil), (".1", nil), ("1", nil), ("1.0.0", nil), ("", nil),
        (" 1.0", nil), ("1.0 ", nil), ("a.b", nil), ("1..0", nil), ("١.٠", nil), ("1.0\u{0}", nil),
    ] as [(String, (Int, Int)?)])
    func majorMinorReadsOnlyMajorDotMinor(text: String, expected: (Int, Int)?) {
        let read = Manifest.majorMinor(text)
        #expect(read?.major == expected?.0 && read?.minor == expected?.1, "\(text): \(String(describing: read))")
    }

    @Test(arguments: [
        ("", "not valid JSON at byte 0"),
        ("[1,2]", "the top level is an array"),
        (#"{"name":"x","version":"1","abi":"1.0","language":"c","modules":["m"],"order":1.5}"#, "field \"order\" has the wrong type"),
        (#"{"name":"x","version":"1","abi":"1.0","language":"rust","modules":["m"]}"#, "field \"language\" is \"rust\""),
        (#"{"name":"x","version":"1","abi":"1.0","language":"c","modules":[7]}"#, "field \"modules[0]\" has the wrong type"),
        (#"{"name":"x","version":"1","abi":"1.0","language":"c","modules":["m"],"exports":[{"name":"f"}]}"#, "required field \"exports[0].signature\" is missing"),
        (#"{"name":"x","version":"1","abi":"1.0","language":"c","modules":["m"]} trailing"#, "unexpected text after the JSON value"),
        (#"{"name":"x\u0001"#, "unterminated string"),
    ])
    func errorsNameTheProblem(text: String, expected: String) {
        #expect(throws: ManifestError.self) { try Manifest.parse(Array(text.utf8)) }
        do {
            _ = try Manifest.parse(Array(text.utf8))
        } catch {
            #expect(error.reason.contains(expected), "\(error.reason)")
        }
    }

    @Test func deeplyNestedInputIsRefusedNotACrash() {
        let text = String(repeating: "[", count: 100_000)
        #expect(throws: JSONSyntaxError.self) { try JSONValue.parse(Array(text.utf8)) }
    }
}

@Suite(.timeLimit(.minutes(5))) struct DynamicStringPatchTests {
    @Test(arguments: [
        ("libGreeting.so", 1, "libGreeting.so"),
        ("libGreeting.so", 2, "libGreeting.02"),
        ("libGreeting.so", 36, "libGreeting.10"),
        ("libA.so", 1295, "libA.zz"),
    ])
    func generationNamesKeepTheLength(soname: String, generation: Int, expected: String) {
        let name = DynamicStringPatch.generationName(soname, generation: generation)
        #expect(name == expected)
        #expect(name?.count == soname.count)
    }

    @Test func generationsPastTheNameSpaceAreRefused() {
        #expect(DynamicStringPatch.generationName("libA.so", generation: 1296) == nil)
    }

    @Test func renamingSonameAndNeededChangesOnlyThoseStrings() throws {
        let dir = TemporaryDirectory("patch")
        let factory = PluginFactory(directory: dir.path)
        try factory.buildC("PatchBase", source: "int base_value(void) { return 7; }\n", manifest: nil)
        let dependent = try factory.buildC(
            "PatchUser", source: "int base_value(void); int user_value(void) { return base_value() + 1; }\n",
            manifest: nil, flags: "-Wl,--no-as-needed -lPatchBase")
        let image = try ELFImage(path: dependent)
        #expect(try image.dynamicInfo().needed.contains("libPatchBase.so"))
        let bytes = Array(try Data(contentsOf: URL(fileURLWithPath: dependent)))
        let patched = try DynamicStringPatch.apply(
            ["libPatchBase.so": "libPatchBase.02", "libPatchUser.so": "libPatchUser.02"], to: bytes, image: image)
        #expect(patched.count == bytes.count)
        try dir.write("patched.so", patched)
        let info = try ELFImage(path: dir.file("patched.so")).dynamicInfo()
        #expect(info.soname == "libPatchUser.02")
        #expect(info.needed.contains("libPatchBase.02"))
        #expect(!info.needed.contains("libPatchBase.so"))
        #expect(info.needed.contains("libc.so.6"))
        // Exactly the two names' last two bytes changed.
        let changed = zip(bytes, patched).filter { $0 != $1 }.count
        #expect(changed <= 4)
    }

    @Test func aNameOfAnotherLengthIsRefused() throws {
        let dir = TemporaryDirectory("patch-length")
        let file = try PluginFactory(directory: dir.path).buildC("Short", source: "int x(void) { return 1; }\n", manifest: nil)
        let bytes = Array(try Data(contentsOf: URL(fileURLWithPath: file)))
        #expect(throws: ELFError.self) {
            try DynamicStringPatch.apply(["libShort.so": "libShorter.so"], to: bytes, image: try ELFImage(path: file))
        }
    }
}
