#if canImport(Glibc)
import Glibc
#endif
import DaemonKit
import ModuleKit

/// Where a log backend puts its finished lines. Each call receives one complete line,
/// ending in `\n`; it may be called from any thread concurrently.
public typealias LogLineSink = @Sendable (String) -> Void

/// Writes each line to standard error with a single `write(2)` (retried for partial
/// writes), so concurrent lines never interleave mid-line (lines up to `PIPE_BUF` are
/// atomic on pipes, which is what journald and most supervisors use).
public let standardErrorSink: LogLineSink = { line in
    var bytes = Array(line.utf8)
    var offset = 0
    while offset < bytes.count {
        let count = bytes.withUnsafeMutableBytes { Glibc.write(2, $0.baseAddress! + offset, $0.count - offset) }
        if count > 0 {
            offset += count
        } else if count < 0 && Glibc.errno == EINTR {
            continue
        } else {
            return
        }
    }
}

/// The `<N>` prefix that gives journald a line's syslog priority: `<3>` error, `<4>`
/// warning, `<6>` info, `<7>` debug (sd-daemon(3)).
public func journalPriority(_ level: LogLevel) -> String {
    switch level {
    case .error: "<3>"
    case .warning: "<4>"
    case .info: "<6>"
    case .debug: "<7>"
    @unknown default: "<5>"  // a level added to ModuleKit later: notice
    }
}

/// Plain text log lines, friendly to journald and terminals:
/// `[2024-05-01T12:00:00.123Z ]level label: message key=value key="value with spaces"`.
///
/// - Timestamps are off by default (journald adds its own); turn them on for files.
/// - One record is always one line: newlines and other control characters in the message
///   and values are escaped (`\n`, `\t`, `\u{1b}`...). Values containing spaces, `"`, `=`,
///   or nothing are written as JSON strings.
/// - The message is written as it is unless it contains `=` or starts with `"`: then it is
///   written as a JSON string. So the pairs start after the closing quote of a quoted
///   message, or at the first word with an `=` of one that is not: a message (a plugin's
///   text) cannot pass for metadata (`innocent plugin=Other` is written `"innocent
///   plugin=Other"`). Likewise a label that is empty or contains a space, `:`, `=`, `"` or a
///   control character (it could hold `: ` and a message of its own).
/// - A key is written as it is only when it is made of ASCII letters, digits, `_`, `.` and
///   `-`; every other byte of it is written `%XX` (its UTF-8 bytes in hex, so `%` itself is
///   `%25`), and an empty key is `%`. A key can therefore never contain a space, `=` or `"`:
///   it cannot end its pair early and fake other `key=value` pairs (say `plugin=Other`).
/// - `write` is thread-safe; output goes to `sink` (default standard error).
public struct TextLogBackend: LogBackend {
    /// Whether each line starts with an ISO 8601 UTC timestamp with milliseconds.
    public var timestamps: Bool
    /// Whether each line starts with its syslog priority, `<N>` (`journalPriority`), which
    /// journald reads as the line's priority and removes.
    public var priorityPrefixes: Bool
    private let sink: LogLineSink

    /// Creates a backend writing to `sink`.
    public init(timestamps: Bool = false, priorityPrefixes: Bool = false, sink: @escaping LogLineSink = standardErrorSink) {
        self.timestamps = timestamps
        self.priorityPrefixes = priorityPrefixes
        self.sink = sink
    }

    /// Formats `record` as one line and hands it to the sink.
    public func write(_ record: LogRecord) {
        sink(format(record))
    }

    /// The line `write` would emit for `record`, including the newline.
    public func format(_ record: LogRecord) -> String {
        format(level: record.level, label: record.label, message: record.message, metadata: record.metadata)
    }

    /// The line for a record with these fields, including the newline.
    public func format(level: LogLevel, label: String, message: String, metadata: [(String, String)]) -> String {
        var line = priorityPrefixes ? journalPriority(level) : ""
        if timestamps { line += UTCTimestamp.now(milliseconds: true) + " " }
        line += "\(level) \(Self.labelText(label)): \(Self.messageText(message))"
        for (key, value) in metadata {
            line += " \(Self.keyText(key))="
            line += Self.needsQuotes(value) ? JSONValue.quote(value) : value
        }
        return line + "\n"
    }

    private static func keyText(_ key: String) -> String {
        if key.isEmpty { return "%" }
        var text = ""
        for byte in key.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "-"):
                text.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let hex = String(byte, radix: 16, uppercase: true)
                text += byte < 0x10 ? "%0" + hex : "%" + hex
            }
        }
        return text
    }

    private static func needsQuotes(_ value: String) -> Bool {
        value.isEmpty || value.unicodeScalars.contains { $0 == " " || $0 == "\"" || $0 == "=" } || JSONValue.hasControlCharacters(value)
    }

    /// The message, with control characters escaped so that it stays on its line; a JSON
    /// string when it contains `=` or starts with `"` (it could be taken for pairs).
    private static func messageText(_ message: String) -> String {
        message.first == "\"" || message.contains("=") ? JSONValue.quote(message) : JSONValue.escapingControlCharacters(message)
    }

    /// The label as it is, or a JSON string when it is empty or contains a space, `:`, `=`,
    /// `"` or a control character (it could end early and fake a message).
    private static func labelText(_ label: String) -> String {
        label.contains(":") || needsQuotes(label) ? JSONValue.quote(label) : label
    }
}

/// JSON log lines for log shippers, one object per line:
/// `{"time":"2024-05-01T12:00:00.123Z","level":"info","label":"modhostd","message":"loaded","plugin":"a.so"}`.
///
/// - Fixed keys come first in this order: `time` (if enabled), `level`, `label`, `message`;
///   metadata follows in its order as string members. A metadata key that collides with a
///   fixed key or an earlier metadata key is written with a `_` prefix, so no key repeats.
/// - `write` is thread-safe; output goes to `sink` (default standard error).
public struct JSONLogBackend: LogBackend {
    /// Whether each object has a `time` member (ISO 8601 UTC, milliseconds).
    public var timestamps: Bool
    /// Whether each line starts with its syslog priority, `<N>` (`journalPriority`), which
    /// journald reads as the line's priority and removes, leaving the JSON object.
    public var priorityPrefixes: Bool
    private let sink: LogLineSink

    /// Creates a backend writing to `sink`.
    public init(timestamps: Bool = true, priorityPrefixes: Bool = false, sink: @escaping LogLineSink = standardErrorSink) {
        self.timestamps = timestamps
        self.priorityPrefixes = priorityPrefixes
        self.sink = sink
    }

    /// Formats `record` as one JSON line and hands it to the sink.
    public func write(_ record: LogRecord) {
        sink(format(record))
    }

    /// The line `write` would emit for `record`, including the newline.
    public func format(_ record: LogRecord) -> String {
        format(level: record.level, label: record.label, message: record.message, metadata: record.metadata)
    }

    /// The line for a record with these fields, including the newline.
    public func format(level: LogLevel, label: String, message: String, metadata: [(String, String)]) -> String {
        var used: Set<String> = ["level", "label", "message"]
        var line = (priorityPrefixes ? journalPriority(level) : "") + "{"
        if timestamps {
            used.insert("time")
            line += "\"time\":\(JSONValue.quote(UTCTimestamp.now(milliseconds: true))),"
        }
        line += "\"level\":\(JSONValue.quote(level.description)),"
        line += "\"label\":\(JSONValue.quote(label)),"
        line += "\"message\":\(JSONValue.quote(message))"
        for (key, value) in metadata {
            var name = key
            while used.contains(name) { name = "_" + name }
            used.insert(name)
            line += ",\(JSONValue.quote(name)):\(JSONValue.quote(value))"
        }
        return line + "}\n"
    }
}

