import DaemonShell
import Foundation
import Glibc
@testable import ModuleHost
import ModuleKit
import PluginCall
import PluginFormat
import Testing
import TestSupport

// The examples of README.md and docs/*.md, checked against the built tools (build/bin) and
// a running modhostd: when a command's output, a reply's shape or an accepted file format
// changes, the document showing it fails here. (The Swift examples of docs/modules.md are
// compiled and run in Tests/ModuleKitTests/DocExamplesTests.swift; the README's first
// plugin is built in OutOfTreeBuildTests.)
//
// How a document marks what is checked:
// - ```console blocks: `$ COMMAND` lines, each followed by the output it prints (standard
//   output and standard error together). Commands run with bash in a scratch directory
//   holding `plugins/` (the example plugins of Plugins/ and `libBroken.so`, a text file)
//   while a modhostd runs on it; `modhostctl` talks to that daemon. In a shown line, `...`
//   stands for any text (a pid, a time, a path); a line that is only `...` stands for any
//   number of lines.
// - Blocks of `→ REQUEST` / `← REPLY` lines (the control protocol): each request is sent to
//   that daemon, in document order, and the reply must have the shape shown: the same
//   members (recursively), the same JSON types, the same `ok`, `id` and `v`, the same error
//   `code`; the values of `code`, `message`, `module`, `plugin`, `function`, `event`,
//   `state`, `type`, `name` and `text` are compared too (`...` standing for any text). An
//   example array element must match one of the reply's elements. A reply may continue on
//   the lines after `←`.
// - ```json blocks: a plugin.json or manifest (an object with "name" and "modules") goes
//   through `modhostctl manifest` and its exports through the signature parser; an
//   `"exports": [...]` fragment through the signature parser; a daemon configuration
//   (an object with "pluginDirectories") through the daemon's configuration reader. Any
//   other JSON block fails the test, so that no example goes unchecked by accident.
// - ```c blocks that include a header compile with the flags plugin.mk uses, without a warning.
@Suite("docs: examples against the real commands", .timeLimit(.minutes(5)), .serialized)
struct DocExamplesTests {
    /// A modhostd on a scratch copy of the example plugins, with wrappers that make
    /// `modhostctl` in a command line talk to it.
    final class Sandbox {
        let root = TemporaryDirectory("doc-examples")
        let daemon: RunningProcess
        var socket: String { root.file("modhostd.sock") }

        init() async throws {
            let plugins = root.directory("plugins")
            for name in try FileManager.default.contentsOfDirectory(atPath: BuildProducts.pluginDirectory).sorted()
            where name.hasSuffix(".so") {
                try root.copy(BuildProducts.pluginDirectory + "/" + name, as: "plugins/" + name)
            }
            try root.write("plugins/libBroken.so", text: "this is not a plugin\n")
            _ = root.directory("bin")
            try root.write("bin/modhostctl", text: "#!/bin/sh\nexec '\(BuildProducts.modhostctl)' --socket '\(root.file("modhostd.sock"))' \"$@\"\n",
                           mode: 0o755)
            try root.write("bin/modhostd", text: "#!/bin/sh\nexec '\(BuildProducts.modhostd)' \"$@\"\n", mode: 0o755)
            daemon = try RunningProcess(BuildProducts.modhostd, [
                "--plugins", plugins, "--state-dir", root.file("state"), "--socket", root.file("modhostd.sock"),
            ])
            guard await daemon.waitFor("control socket ready") else {
                throw DaemonDidNotStart(log: daemon.text)
            }
        }

        struct DaemonDidNotStart: Error, CustomStringConvertible {
            var log: String
            var description: String { "modhostd did not start:\n\(log)" }
        }

        /// Runs one command line as a reader would type it; standard error joins standard output.
        func shell(_ command: String) throws -> String {
            let result = try run("/bin/bash", ["-c", command + " 2>&1"],
                                 environment: ["PATH": root.file("bin") + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")],
                                 directory: root.path)
            return result.standardOutput
        }

        /// Stops the daemon; it must have survived every example and shut down cleanly.
        func stop() async {
            daemon.send(SIGTERM)
            let status = await daemon.wait()
            #expect(status == 0, "modhostd exited \(status):\n\(daemon.text)")
        }
    }

    static func blocks(_ language: String? = nil) throws -> [MarkdownBlock] {
        try MarkdownBlock.documents().flatMap { try MarkdownBlock.blocks(of: $0) }
            .filter { language == nil || $0.language == language }
    }

    // MARK: console

    @Test(.timeLimit(.minutes(5)))
    func consoleExamplesPrintWhatTheDocumentsShow() async throws {
        let sandbox = try await Sandbox()
        var checked = 0
        for block in try Self.blocks("console") {
            for example in ConsoleExample.parse(block.body) {
                let output = try sandbox.shell(example.command)
                let lines = output.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
                #expect(TextPattern.matches(example.expected, Array(lines.dropLast(lines.last == "" ? 1 : 0))),
                        "\(block.location): `$ \(example.command)` printed:\n\(output)\nthe document shows:\n\(example.expected.joined(separator: "\n"))")
                checked += 1
            }
        }
        #expect(checked >= 5, "only \(checked) console examples found")
        await sandbox.stop()
    }

    // MARK: control protocol

    @Test(.timeLimit(.minutes(5)))
    func protocolExamplesHaveTheShapeOfTheDaemonsReplies() async throws {
        let sandbox = try await Sandbox()
        let connection = try RawConnection(sandbox.socket)
        var checked = 0
        for block in try Self.blocks() {
            for example in ProtocolExample.parse(block.body) {
                connection.send(example.request + "\n")
                let (lines, _) = connection.readLines(1)
                let reply = try #require(lines.first, "\(block.location): no reply to \(example.request)")
                let shown = try #require(try? JSONValue.parse(Array(example.reply.utf8)),
                                         "\(block.location): the example reply is not JSON: \(example.reply)")
                let real = try JSONValue.parse(Array(reply.utf8))
                let problem = ReplyShape.mismatch(shown: shown, real: real, path: "")
                #expect(problem == nil, "\(block.location): \(example.request)\n  shown: \(example.reply)\n  real:  \(reply)\n  \(problem ?? "")")
                checked += 1
            }
        }
        #expect(checked >= 10, "only \(checked) protocol examples found")
        await sandbox.stop()
    }

    // MARK: JSON files

    @Test func jsonExamplesAreAcceptedByWhatReadsThem() throws {
        let scratch = TemporaryDirectory("doc-json")
        for block in try Self.blocks("json") {
            let text = block.body.trimmingCharacters(in: .whitespacesAndNewlines)
            let whole = text.hasPrefix("\"") ? "{" + text + "}" : text
            guard case .object(let members)? = try? JSONValue.parse(Array(whole.utf8)) else {
                Issue.record("\(block.location): not JSON:\n\(block.body)")
                continue
            }
            if members["pluginDirectories"] != nil {
                let path = try scratch.write("modhostd.json", text: whole)
                #expect(throws: Never.self, "\(block.location)") { try DaemonConfiguration.load(path) }
            } else if members["name"] != nil, members["modules"] != nil {
                let path = try scratch.write("plugin.json", text: whole)
                let language = members["language"]?.stringValue ?? "c"
                let result = try run(BuildProducts.modhostctl, ["manifest", "--language", language,
                                                                "--sdk", BuildProducts.directory + "/lib/libModuleKit.so",
                                                                "--swift-version", "Swift version \(HostSDK.current.compilerVersion)", path])
                #expect(result.status == 0, "\(block.location): modhostctl manifest refuses it: \(result.standardError)")
                checkExports(members["exports"], block)
            } else if members.keys.sorted() == ["exports"] {
                checkExports(members["exports"], block)
            } else if members["instance"] != nil {
                continue  // docs/modules.md's info payload: Tests/ModuleKitTests/DocExamplesTests.swift
            } else {
                Issue.record("\(block.location): a JSON example no check knows; add one to DocExamplesTests")
            }
        }
    }

    func checkExports(_ exports: JSONValue?, _ block: MarkdownBlock) {
        guard case .array(let list)? = exports else { return }
        let declared = list.map { Manifest.Export(name: $0["name"]?.stringValue ?? "", signature: $0["signature"]?.stringValue ?? "") }
        #expect(throws: Never.self, "\(block.location)") { try SymbolOwnership.parseExports(declared, plugin: "Example") }
    }

    // MARK: C

    /// Warning-free under exactly what plugin.mk passes (`modhostctl flags`, its default
    /// optimization and warnings), with warnings as errors.
    @Test func cExamplesCompile() throws {
        let scratch = TemporaryDirectory("doc-c")
        let flags = try run(BuildProducts.modhostctl, ["flags", "--c", "--plugin", "Example"])
        try #require(flags.status == 0, "\(flags.standardError)")
        let pluginFlags = flags.standardOutput.split(whereSeparator: \.isWhitespace).map(String.init)
        var checked = 0
        for block in try Self.blocks("c") where block.body.contains("#include") {
            let path = try scratch.write("example.c", text: block.body)
            let result = try run("/usr/bin/env", ["cc"] + pluginFlags + ["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", path])
            #expect(result.status == 0, "\(block.location) does not compile:\n\(result.standardError)")
            checked += 1
        }
        #expect(checked >= 2)
    }

    // MARK: Makefiles

    /// Every Makefile a document shows (a ```make block including plugin.mk) builds the
    /// plugin `modhostctl new` writes for its PLUGIN, copied as shown with only the SDK path
    /// set to the built one: a comment after a value, for instance, becomes part of it in
    /// make (`MODHOST_SDK ?= /usr/local   # ...` names "/usr/local   ").
    @Test func makefileExamplesBuildAPlugin() throws {
        let scratch = TemporaryDirectory("doc-make")
        var checked = 0
        for block in try Self.blocks("make") where block.body.contains("plugin.mk") {
            let lines = block.body.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            let plugin = try #require(lines.first { $0.hasPrefix("PLUGIN =") }.map { $0.dropFirst("PLUGIN =".count).trimmingCharacters(in: .whitespaces) },
                                      "\(block.location): no PLUGIN line")
            let makefile = lines.map { line -> String in
                guard line.hasPrefix("MODHOST_SDK ?=") else { return line }
                // Only the path is replaced; what follows it on the line stays.
                let value = line.dropFirst("MODHOST_SDK ?=".count).drop { $0 == " " }
                let rest = value.drop { $0 != " " && $0 != "\t" }
                return "MODHOST_SDK ?= " + BuildProducts.directory + rest
            }.joined(separator: "\n")
            let directory = scratch.file("\(checked)/\(plugin)")
            let scaffold = try run(BuildProducts.modhostctl, ["new", "--c", plugin, "--dir", directory])
            try #require(scaffold.status == 0, "\(scaffold.standardError)")
            try makefile.write(toFile: directory + "/Makefile", atomically: true, encoding: .utf8)
            let build = try run("/bin/bash", ["-c", "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MODHOST_SDK make --no-print-directory 2>&1"],
                                directory: directory)
            #expect(build.status == 0, "\(block.location): the Makefile shown does not build:\n\(makefile)\n\(build.standardOutput)")
            checked += 1
        }
        #expect(checked >= 3, "only \(checked) Makefiles found")
    }

    // MARK: options and paths

    /// The options docs/daemon.md's table lists are those `modhostd --help` lists.
    @Test func daemonOptionsTableMatchesHelp() throws {
        let document = try String(contentsOfFile: BuildProducts.packageRoot + "/docs/daemon.md", encoding: .utf8)
        let table = document.split(separator: "\n").filter { $0.hasPrefix("| `--") }
        let documented = Set(table.compactMap { $0.dropFirst(3).split(separator: " ").first.map { String($0.filter { $0 != "`" }) } })
        let help = try run(BuildProducts.modhostd, ["--help"]).standardOutput
        let offered = Set(help.split(separator: "\n").compactMap { line -> String? in
            let word = line.drop { $0 == " " }.split(separator: " ").first.map(String.init) ?? ""
            return word.hasPrefix("--") ? word : nil
        })
        #expect(documented == offered.subtracting(["--help"]), "docs/daemon.md: \(documented.sorted()); modhostd --help: \(offered.sorted())")
    }

    /// Every repository path a document names exists.
    @Test func pathsTheDocumentsNameExist() throws {
        let pattern = try NSRegularExpression(pattern: "(?<![A-Za-z0-9_./$)-])(?:Sources|Plugins|Tests|share|docs)/[A-Za-z0-9_./-]*")
        var checked = 0
        for document in try MarkdownBlock.documents() {
            let text = try String(contentsOfFile: BuildProducts.packageRoot + "/" + document, encoding: .utf8)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                var path = String(text[Range(match.range, in: text)!])
                while path.hasSuffix(".") || path.hasSuffix(",") { path.removeLast() }
                #expect(FileManager.default.fileExists(atPath: BuildProducts.packageRoot + "/" + path),
                        "\(document) names \(path), which does not exist")
                checked += 1
            }
        }
        #expect(checked >= 20, "only \(checked) paths found")
    }
}

// MARK: - Reading examples

/// One `$ COMMAND` of a console block and the lines shown after it.
struct ConsoleExample {
    var command: String
    var expected: [String]

    static func parse(_ body: String) -> [ConsoleExample] {
        var examples: [ConsoleExample] = []
        for line in body.split(separator: "\n", omittingEmptySubsequences: false).dropLast() {
            if line.hasPrefix("$ ") {
                examples.append(ConsoleExample(command: String(line.dropFirst(2)), expected: []))
            } else if !examples.isEmpty {
                examples[examples.count - 1].expected.append(String(line))
            }
        }
        return examples
    }
}

/// One `→ REQUEST` and the `← REPLY` after it (which may go on over several lines).
struct ProtocolExample {
    var request: String
    var reply: String

    static func parse(_ body: String) -> [ProtocolExample] {
        var examples: [ProtocolExample] = []
        var pending: String?
        for line in body.split(separator: "\n") {
            if line.hasPrefix("→ ") {
                pending = String(line.dropFirst(2))
            } else if line.hasPrefix("← "), let request = pending {
                examples.append(ProtocolExample(request: request, reply: String(line.dropFirst(2))))
                pending = nil
            } else if !examples.isEmpty, pending == nil {
                examples[examples.count - 1].reply += line.trimmingCharacters(in: .whitespaces)
            }
        }
        return examples
    }
}

/// Shown text against real text: `...` in a line stands for any text; a line that is only
/// `...` for any number of lines. Trailing spaces do not count.
enum TextPattern {
    static func matches(_ shown: [String], _ real: [String]) -> Bool {
        guard let first = shown.first else { return real.isEmpty }
        let rest = Array(shown.dropFirst())
        if first.trimmingCharacters(in: .whitespaces) == "..." {
            return (0...real.count).contains { matches(rest, Array(real.dropFirst($0))) }
        }
        guard let line = real.first, matches(line: first, line) else { return false }
        return matches(rest, Array(real.dropFirst()))
    }

    static func matches(line shown: String, _ real: String) -> Bool {
        let parts = trimmed(shown).components(separatedBy: "...").map(NSRegularExpression.escapedPattern(for:))
        let pattern = "^" + parts.joined(separator: ".*") + "$"
        return trimmed(real).range(of: pattern, options: .regularExpression) != nil
    }

    private static func trimmed(_ text: String) -> String {
        String(text.reversed().drop { $0 == " " }.reversed())
    }
}

/// Compares a documented reply with a real one (see the suite's description).
enum ReplyShape {
    static let comparedStrings: Set<String> = ["code", "message", "module", "plugin", "function", "event", "state", "type", "name", "text"]
    static let comparedNumbers: Set<String> = ["id", "v", "protocol"]

    static func mismatch(shown: JSONValue, real: JSONValue, path: String) -> String? {
        let key = path.split(separator: ".").last.map(String.init) ?? ""
        switch (shown, real) {
        case (.object(let a), .object(let b)):
            if Set(a.keys) != Set(b.keys) {
                return "\(path.isEmpty ? "the reply" : path) has members \(b.keys.sorted()), the example \(a.keys.sorted())"
            }
            for (name, value) in a.sorted(by: { $0.key < $1.key }) {
                if let problem = mismatch(shown: value, real: b[name]!, path: path.isEmpty ? name : path + "." + name) { return problem }
            }
            return nil
        case (.array(let a), .array(let b)):
            if b.isEmpty { return nil }
            for (index, element) in a.enumerated() where !b.contains(where: { mismatch(shown: element, real: $0, path: path + "[]") == nil }) {
                let nearest = b.lazy.compactMap { mismatch(shown: element, real: $0, path: path + "[\(index)]") }.first ?? ""
                return "\(path)[\(index)] matches no element of the reply: \(nearest)"
            }
            return nil
        case (.string(let a), .string(let b)):
            return !comparedStrings.contains(key) || TextPattern.matches(line: a, b) ? nil : "\(path) is \(real.jsonText), the example \(shown.jsonText)"
        case (.number(let a), .number(let b)):
            return !comparedNumbers.contains(key) || a == b ? nil : "\(path) is \(real.jsonText), the example \(shown.jsonText)"
        case (.bool(let a), .bool(let b)):
            return key != "ok" || a == b ? nil : "\(path) is \(b), the example \(a)"
        case (.null, .null):
            return nil
        default:
            return "\(path) is \(real.jsonText), the example \(shown.jsonText) (another JSON type)"
        }
    }
}
