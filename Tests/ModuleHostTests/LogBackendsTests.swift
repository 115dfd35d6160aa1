import DaemonShell
import Foundation
import ModuleKit
import Testing

struct LogBackendsTests {
    @Test func textLinesAreJournaldFriendly() {
        let backend = TextLogBackend()
        let line = backend.format(
            level: .info, label: "modhostd", message: "loaded plugin",
            metadata: [("plugin", "a.so"), ("reason", "bad magic number"), ("empty", ""), ("eq", "a=b")])
        #expect(line == "info modhostd: loaded plugin plugin=a.so reason=\"bad magic number\" empty=\"\" eq=\"a=b\"\n")
    }

    @Test func oneRecordIsAlwaysOneLine() {
        let backend = TextLogBackend()
        let line = backend.format(level: .error, label: "x", message: "first\nsecond\tthird", metadata: [("k", "v\nw")])
        #expect(line == "error x: first\\nsecond\\tthird k=\"v\\nw\"\n")
        #expect(line.filter { $0 == "\n" }.count == 1)
    }

    /// A key (a module's, or one an isolated plugin's worker sends) cannot fake other pairs:
    /// only letters, digits, `_`, `.` and `-` are written as they are, the rest as `%XX`.
    @Test func aKeyCannotFakeOtherPairs() {
        let backend = TextLogBackend()
        let line = backend.format(
            level: .error, label: "modhostd", message: "m",
            metadata: [("plugin=Counter module", "counter"), ("plugin ", "x"), ("a\"b\nc%", "v"), ("", "e"),
                       ("é", "u"), ("ok_key.v-2", "y"), ("plugin", "Evil")])
        #expect(line == "error modhostd: m plugin%3DCounter%20module=counter plugin%20=x a%22b%0Ac%25=v %=e %C3%A9=u ok_key.v-2=y plugin=Evil\n")
        let pairs = line.dropLast().split(separator: " ").dropFirst(3)
        #expect(pairs.filter { $0.hasPrefix("plugin=") } == ["plugin=Evil"])
    }

    @Test func textTimestampsAreOptional() throws {
        let line = TextLogBackend(timestamps: true).format(level: .warning, label: "l", message: "m", metadata: [])
        let pattern = try Regex(#"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z warning l: m\n$"#)
        #expect(line.wholeMatch(of: pattern) != nil)
    }

    @Test func jsonLinesParseAndKeepEveryKey() throws {
        let backend = JSONLogBackend()
        let line = backend.format(
            level: .debug, label: "modhostd", message: "say \"hi\"\n",
            metadata: [("plugin", "a.so"), ("level", "shadowed"), ("plugin", "again")])
        #expect(line.hasSuffix("}\n"))
        #expect(line.dropLast().contains("\n") == false)
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String])
        #expect(object["level"] == "debug")
        #expect(object["label"] == "modhostd")
        #expect(object["message"] == "say \"hi\"\n")
        #expect(object["plugin"] == "a.so")
        #expect(object["_level"] == "shadowed")
        #expect(object["_plugin"] == "again")
        let time = try #require(object["time"])
        #expect(time.wholeMatch(of: try Regex(#"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z"#)) != nil)
        #expect(line.hasPrefix("{\"time\":"))
        #expect(!JSONLogBackend(timestamps: false).format(level: .info, label: "l", message: "m", metadata: []).contains("time"))
    }
}
