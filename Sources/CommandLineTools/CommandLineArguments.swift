import Glibc
import ModuleKit

/// A command-line mistake: printed as `Error: ...`, the usage line, and where help is.
public struct UsageError: Error, Sendable {
    public var message: String
    public init(_ message: String) { self.message = message }
}

/// `argument` as a usage error shows it: in single quotes, with control characters
/// escaped (`JSONValue.escapingControlCharacters`), then cut after 80 characters, so a
/// typo cannot break the line or fill the terminal.
func shownArgument(_ argument: String) -> String {
    let escaped = JSONValue.escapingControlCharacters(argument)
    guard escaped.unicodeScalars.count > 80 else { return "'" + escaped + "'" }
    return "'" + String(String.UnicodeScalarView(escaped.unicodeScalars.prefix(80))) + "…'"
}

/// This process's arguments after the program name, each required to be UTF-8:
/// `CommandLine.arguments` replaces bad bytes with U+FFFD silently, so a `--payload` or a
/// name would not be what was typed. The first argument that is not UTF-8 is a usage error
/// naming it (1 is the first after the program name) and its first bad byte, located as
/// `JSONValue.parse` locates one.
func processArguments() throws(UsageError) -> [String] {
    var arguments: [String] = []
    for index in 1..<Int(CommandLine.argc) {
        guard let pointer = CommandLine.unsafeArgv[index] else { break }
        let bytes = UnsafeRawBufferPointer(start: pointer, count: strlen(pointer))
        if let error = JSONSyntaxError(invalidUTF8In: ArraySlice(bytes)) {
            throw UsageError("argument \(index) is not valid UTF-8 at byte \(error.offset)")
        }
        arguments.append(String(decoding: bytes, as: UTF8.self))
    }
    return arguments
}

/// Parsed arguments: positionals in order, options with their values (repeatable), flags.
struct Arguments {
    var positionals: [String] = []
    var values: [String: [String]] = [:]
    var flags: Set<String> = []

    /// The one tokenizer of modhostd's and modhostctl's command lines.
    ///
    /// `valueOptions` take a value (`--name VALUE` or `--name=VALUE`); `flagOptions` take
    /// none. `-h` means `--help`. Anything after `--` is positional. A word that starts
    /// with a single `-` (other than `-h`) is positional when `dashWordsArePositional`
    /// says so for the positionals read before it (`modhostctl call` passes negative
    /// numbers such as `-5` and `-inf` as arguments), and an unknown option otherwise.
    init(_ arguments: some Sequence<String>, valueOptions: Set<String>, flagOptions: Set<String>,
         dashWordsArePositional: (_ positionalsBefore: [String]) -> Bool = { _ in false }) throws(UsageError) {
        var iterator = arguments.makeIterator()
        var onlyPositionals = false
        while let argument = iterator.next() {
            let dashWord = !argument.hasPrefix("--") && argument != "-h"
            if onlyPositionals || !argument.hasPrefix("-") || argument == "-" || (dashWord && dashWordsArePositional(positionals)) {
                positionals.append(argument)
                continue
            }
            if argument == "--" { onlyPositionals = true; continue }
            if argument == "-h" || argument == "--help" { flags.insert("help"); continue }
            guard argument.hasPrefix("--") else { throw UsageError("unknown option \(shownArgument(argument))") }
            var name = String(argument.dropFirst(2))
            var inlineValue: String?
            if let equals = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            if flagOptions.contains(name) {
                guard inlineValue == nil else { throw UsageError("option \(shownArgument("--" + name)) takes no value") }
                flags.insert(name)
            } else if valueOptions.contains(name) {
                guard let value = inlineValue ?? iterator.next() else { throw UsageError("option \(shownArgument("--" + name)) needs a value") }
                values[name, default: []].append(value)
            } else {
                throw UsageError("unknown option \(shownArgument("--" + name))")
            }
        }
    }

    func value(_ name: String) -> String? { values[name]?.last }
    func has(_ flag: String) -> Bool { flags.contains(flag) }
}

/// Where command output goes; tests capture it.
public protocol CommandOutput: Sendable {
    func out(_ text: String)
    func err(_ text: String)
}

/// Standard output and standard error.
public struct StandardStreams: CommandOutput {
    public init() {}
    public func out(_ text: String) {
        var line = text
        if !line.hasSuffix("\n") { line += "\n" }
        print(line, terminator: "")
        fflush(nil)
    }
    public func err(_ text: String) { StandardError.write(text.hasSuffix("\n") ? text : text + "\n") }
}
