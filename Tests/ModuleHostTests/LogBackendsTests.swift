import DaemonShell
import Foundation
import ModuleKit
import Testing

@Suite(.timeLimit(.minutes(5)))
struct LogBackendsTests {
    @Test func textLinesAreJournaldFriendly() {
        let backend = TextLogBackend()
        let line = backend.format(
            level: .info, label: "modhostd", message: "loaded plugin",
            metadata: [("plugin", "a.so"), ("reason", "bad magic number"), ("empty", ""), ("eq", "a=b")])
        #expect(line == "info modhostd: loaded plugin plugin=a.so reason=\"bad magic number\" empty=\"\" eq=\"a=b\"\n")
    }

    /// On the journal, each line starts with its syslog priority, which journald keeps as
    /// the entry's priority and removes from the message.
    @Test func onTheJournalEachLineCarriesItsPriority() {
        let text = TextLogBackend(priorityPrefixes: true)
        let json = JSONLogBackend(timestamps: false, priorityPrefixes: true)
        for (level, prefix) in [(LogLevel.error, "<3>"), (.warning, "<4>"), (.info, "<6>"), (.debug, "<7>")] {
            #expect(text.format(level: level, label: "modhostd", message: "m", metadata: []) == "\(prefix)\(level) modhostd: m\n")
            #expect(json.format(level: level, label: "modhostd", message: "m", metadata: []).hasPrefix("\(prefix){\"level\":"))
        }
        #expect(!TextLogBackend().format(level: .error, label: "x", message: "m", metadata: []).hasPrefix("<"))
    }

    /// The "started N modules" line lists the first names and how many more: at a
    /// thousand modules it stays one short line (`modhostctl list` has them all).
    @Test func theStartedLineListsTheFirstNames() {
        let few = ["a", "b", "c"]
        #expect(Daemon.firstNames(few) == "a, b, c")
        let many = (1...1000).map { "module\($0)" }
        let line = Daemon.firstNames(many)
        #expect(line.hasPrefix("module1, module2, ") && line.hasSuffix(", module20 and 980 more (modhostctl list)"), "\(line)")
        #expect(line.utf8.count < 400)
    }

    @Test func oneRecordIsAlwaysOneLine() {
        let backend = TextLogBackend()
        let line = backend.format(level: .error, label: "x", message: "first\nsecond\tthird", metadata: [("k", "v\nw")])
        #expect(line == "error x: first\\nsecond\\tthird k=\"v\\nw\"\n")
        #expect(line.filter { $0 == "\n" }.count == 1)
    }

    /// Text that would reorder or break the shown line (a right-to-left override, an
    /// isolate, a line separator) is escaped wherever it is: message, label, value.
    @Test func aLineShowsWhatItHolds() {
        let backend = TextLogBackend()
        let line = backend.format(level: .info, label: "x\u{202E}y", message: "file \u{202E}txt.exe",
                                  metadata: [("plugin", "a\u{2066}b"), ("note", "c\u{2028}d"), ("eq", "k=\u{200F}")])
        #expect(line == #"info "x\u202ey": file \u202etxt.exe plugin="a\u2066b" note="c\u2028d" eq="k=\u200f""# + "\n")
        let json = JSONLogBackend(timestamps: false).format(level: .info, label: "l", message: "m\u{202E}", metadata: [])
        #expect(json.contains(#""message":"m\u202e""#), "\(json)")
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

    /// A message (a plugin's text) cannot pass for metadata either: one with an `=` in it,
    /// or that starts with `"`, is written as a JSON string, so that the pairs are what
    /// follows the message, and a label that is not a plain name is quoted too.
    @Test func aMessageOrLabelCannotFakePairs() throws {
        let backend = TextLogBackend()
        let forged = backend.format(level: .warning, label: "flooder", message: "innocent plugin=Near worker=1",
                                    metadata: [("module", "flooder"), ("plugin", "Flooder")])
        #expect(forged == "warning flooder: \"innocent plugin=Near worker=1\" module=flooder plugin=Flooder\n")
        let record = try #require(Self.parse(String(forged.dropLast())))
        #expect(record.message == "innocent plugin=Near worker=1")
        #expect(record.pairs.map(\.key) == ["module", "plugin"])
        let label = backend.format(level: .info, label: "x: plugin=Near", message: "\"quoted\" start", metadata: [("plugin", "Flooder")])
        #expect(label == "info \"x: plugin=Near\": \"\\\"quoted\\\" start\" plugin=Flooder\n")
        let labelled = try #require(Self.parse(String(label.dropLast())))
        #expect(labelled.label == "x: plugin=Near" && labelled.message == "\"quoted\" start")
        #expect(labelled.pairs.map(\.key) == ["plugin"])
        // A plain message is written as it is.
        #expect(backend.format(level: .info, label: "modhostd", message: "loaded plugin A: 2 modules", metadata: [])
                == "info modhostd: loaded plugin A: 2 modules\n")
    }

    /// A text log line read back as docs/daemon.md describes it: `LEVEL LABEL: MESSAGE` then
    /// `KEY=VALUE` pairs; a label or message that starts with `"` is a JSON string, an
    /// unquoted message has no `=` (the pairs start at the first word with one), a value
    /// that starts with `"` is a JSON string. nil when the line does not read so.
    static func parse(_ line: String) -> (level: String, label: String, message: String, pairs: [(key: String, value: String)])? {
        var rest = Substring(line)
        func quoted() -> String? {
            guard rest.first == "\"" else { return nil }
            var index = rest.index(after: rest.startIndex)
            while index < rest.endIndex, rest[index] != "\"" {
                if rest[index] == "\\" { index = rest.index(after: index) }
                guard index < rest.endIndex else { return nil }
                index = rest.index(after: index)
            }
            guard index < rest.endIndex else { return nil }
            let end = rest.index(after: index)
            let text = try? JSONSerialization.jsonObject(with: Data(rest[..<end].utf8), options: .fragmentsAllowed) as? String
            rest = rest[end...]
            return text
        }
        guard let space = rest.firstIndex(of: " ") else { return nil }
        let level = String(rest[..<space])
        rest = rest[rest.index(after: space)...]
        let label: String
        if rest.first == "\"" {
            guard let text = quoted() else { return nil }
            label = text
        } else {
            guard let colon = rest.range(of: ": ") else { return nil }
            label = String(rest[..<colon.lowerBound])
            rest = rest[colon.lowerBound...]
        }
        guard rest.hasPrefix(": ") else { return nil }
        rest = rest.dropFirst(2)
        let message: String
        if rest.first == "\"" {
            guard let text = quoted() else { return nil }
            message = text
        } else if let equals = rest.firstIndex(of: "=") {
            guard let space = rest[..<equals].lastIndex(of: " ") else { return nil }
            message = String(rest[..<space])
            rest = rest[space...]
        } else {
            message = String(rest)
            rest = ""
        }
        var pairs: [(key: String, value: String)] = []
        while !rest.isEmpty {
            guard rest.first == " ", let equals = rest.firstIndex(of: "=") else { return nil }
            let key = String(rest[rest.index(after: rest.startIndex)..<equals])
            rest = rest[rest.index(after: equals)...]
            if rest.first == "\"" {
                guard let value = quoted() else { return nil }
                pairs.append((key, value))
            } else {
                let end = rest.firstIndex(of: " ") ?? rest.endIndex
                pairs.append((key, String(rest[..<end])))
                rest = rest[end...]
            }
        }
        return (level, label, message, pairs)
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
