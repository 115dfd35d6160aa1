import ControlProtocol
import DaemonKit
import DaemonShell
import Foundation
import Glibc
@testable import ModuleHost
import ModuleKit
import PluginFormat
import Testing
import TestSupport

/// Every place the host reads JSON from outside refuses the same hostile documents, each
/// with the byte offset `JSONValue.parse` gives: manifests (from a plugin file, and
/// plugin.json through `modhostctl manifest`), the configuration file, control requests
/// and their call arguments (on the real socket), `modhostctl send --payload`, and payloads
/// C modules post.
@Suite(.timeLimit(.minutes(5)), .serialized) struct JSONEntryPointTests {
    /// A control request calling a function; each hostile document puts its problem in the
    /// call's arguments.
    static let head = Array(#"{"v":1,"id":1,"cmd":"call","plugin":"Calculator","function":"add","args":["#.utf8)

    struct Hostile: Sendable, CustomTestStringConvertible {
        var name: String
        var bytes: [UInt8]
        /// Where the problem is, counted by hand from the document.
        var offset: Int
        /// The parser's words for it.
        var message: String
        var testDescription: String { name }
    }

    static let hostile: [Hostile] = [
        Hostile(name: "duplicate member name", bytes: head + Array(#"{"k":1,"k":2}]}"#.utf8),
                offset: head.count + 7, message: #"duplicate member name "k""#),
        Hostile(name: "leading zero", bytes: head + Array("01,2]}".utf8), offset: head.count, message: "leading zero"),
        Hostile(name: "invalid UTF-8", bytes: head + [0x22, 0xFF, 0x22] + Array("]}".utf8),
                offset: head.count + 1, message: "invalid UTF-8"),
        // The request is level 1 and "args" level 2: the 63rd bracket inside is level 65.
        Hostile(name: "nesting over the limit",
                bytes: head + Array((String(repeating: "[", count: 70) + String(repeating: "]", count: 70) + "]}").utf8),
                offset: head.count + 62, message: "nested deeper than 64 levels"),
        Hostile(name: "trailing comma", bytes: head + Array("1,]}".utf8), offset: head.count + 2, message: "expected a value"),
    ]

    /// "at byte N", as every entry point words the offset.
    static func located(_ hostile: Hostile) -> String { "at byte \(hostile.offset)" }

    @Test(arguments: hostile)
    func theParserRefusesItAtTheOffset(hostile: Hostile) {
        do {
            let value = try JSONValue.parse(hostile.bytes)
            Issue.record("accepted \(value)")
        } catch {
            #expect(error.offset == hostile.offset, "\(error)")
            #expect(error.message.hasPrefix(hostile.message), "\(error)")
        }
    }

    @Test(arguments: hostile)
    func aManifestIsRefused(hostile: Hostile) {
        #expect {
            _ = try Manifest.parse(hostile.bytes)
        } throws: { error in
            let reason = (error as? ManifestError)?.reason ?? ""
            return reason.contains(Self.located(hostile)) && reason.contains(hostile.message)
        }
    }

    @Test(arguments: hostile)
    func theConfigurationFileIsRefused(hostile: Hostile) throws {
        let directory = TemporaryDirectory("json-entry-config")
        let path = try directory.write("modhostd.json", hostile.bytes)
        #expect {
            _ = try DaemonConfiguration.load(path)
        } throws: { error in
            let message = (error as? DaemonError)?.message ?? ""
            return message.contains("is not valid JSON \(Self.located(hostile)): \(hostile.message)")
        }
    }

    @Test(arguments: hostile)
    func aControlRequestIsRefusedAndNothingIsCalled(hostile: Hostile) async throws {
        let fixture = try ControlProtocolTests.Fixture()
        let path = fixture.socketPath
        let bytes = hostile.bytes
        let lines = await ControlProtocolTests.onThread { () -> [String] in
            guard let connection = try? RawConnection(path) else { return ["connect failed"] }
            connection.send(bytes + [0x0A])
            return connection.readLines(1, timeout: .seconds(20)).lines
        }
        let reply = try ControlProtocolTests.Reply(try #require(lines.first))
        #expect(reply.ok == false)
        #expect(reply.code == "malformed_request", "\(reply.text)")
        let message = reply.message ?? ""
        #expect(message.contains(Self.located(hostile)), "\(message)")
        // A bad byte is found by the socket's framing, before the parser: its own words.
        #expect(message.contains(hostile.bytes.contains(0xFF) ? "not valid UTF-8" : hostile.message), "\(message)")
        #expect(await fixture.daemon.calls.isEmpty)
        await fixture.stop()
    }

    /// Runs modhostctl with `arguments`, where `{}` stands for the hostile bytes (passed
    /// through a file and the shell, since a Swift string cannot hold invalid UTF-8).
    func modhostctl(_ arguments: [String], hostile: Hostile) throws -> ProcessResult {
        let directory = TemporaryDirectory("json-entry-cli")
        let file = try directory.write("hostile.json", hostile.bytes)
        let words = arguments.map { $0 == "{}" ? #""$(cat "$1")""# : "'\($0)'" }.joined(separator: " ")
        return try run("/bin/bash", ["-c", #"exec "$0" "# + words, BuildProducts.modhostctl, file])
    }

    @Test(arguments: hostile)
    func aSendPayloadIsAUsageError(hostile: Hostile) throws {
        let result = try modhostctl(["--socket", "/nonexistent/modhostd.sock", "send", "tick", "--payload", "{}"], hostile: hostile)
        #expect(result.status == ExitCode.usage.rawValue, "\(result.standardError)")
        #expect(result.standardError.contains(Self.located(hostile)), "\(result.standardError)")
        // A bad byte is found in the command line, before the parser.
        let expected = hostile.bytes.contains(0xFF) ? "argument 6 is not valid UTF-8" : "--payload is not valid JSON"
        #expect(result.standardError.contains(expected), "\(result.standardError)")
    }

    @Test(arguments: hostile)
    func aPluginJSONForPluginMkIsRefused(hostile: Hostile) throws {
        let directory = TemporaryDirectory("json-entry-plugin-json")
        let file = try directory.write("plugin.json", hostile.bytes)
        let result = try run(BuildProducts.modhostctl, ["manifest", file, "--language", "c"])
        #expect(result.status == ExitCode.dataError.rawValue, "\(result.standardError)")
        #expect(result.standardError.contains("\(file): not valid JSON \(Self.located(hostile)): \(hostile.message)"),
                "\(result.standardError)")
    }

    @Test(arguments: hostile)
    func aPayloadFromACModuleIsAStringWithAWarning(hostile: Hostile) {
        let (payload, warning) = CHostServices.payload(hostile.bytes, name: "tick")
        #expect(payload == .string(String(decoding: hostile.bytes, as: UTF8.self)))
        #expect(warning?.contains("not valid JSON \(Self.located(hostile)): \(hostile.message)") == true, "\(warning ?? "none")")
    }

    @Test func theSameDocumentsWithoutTheProblemAreRead() throws {
        // Each hostile document differs from a valid one only where it is refused.
        let fixed: [[UInt8]] = [
            Self.head + Array(#"{"k":1,"j":2}]}"#.utf8), Self.head + Array("1,2]}".utf8),
            Self.head + Array(#""é"]}"#.utf8),
            Self.head + Array((String(repeating: "[", count: 62) + String(repeating: "]", count: 62) + "]}").utf8),
            Self.head + Array("1]}".utf8),
        ]
        for bytes in fixed {
            #expect(throws: Never.self) { try JSONValue.parse(bytes) }
            #expect(CHostServices.payload(bytes, name: "tick").warning == nil)
        }
    }

    @Test func anOversizedFileIsRefusedBeforeItIsReadWhole() throws {
        let directory = TemporaryDirectory("json-entry-size")
        let big = try directory.write("big.json", Array(repeating: UInt8(ascii: " "), count: DaemonConfiguration.maximumFileSize) + Array("{}".utf8))
        for path in [big, "/dev/zero"] {
            #expect {
                _ = try DaemonConfiguration.load(path)
            } throws: { error in
                (error as? DaemonError)?.message.contains("\(path): configuration is larger than 1048576 bytes") == true
            }
        }
        let result = try run(BuildProducts.modhostctl, ["manifest", "/dev/zero", "--language", "c"])
        #expect(result.status == ExitCode.dataError.rawValue, "\(result.standardError)")
        #expect(result.standardError.contains("cannot read /dev/zero: /dev/zero is larger than 65536 bytes"), "\(result.standardError)")
    }
}
