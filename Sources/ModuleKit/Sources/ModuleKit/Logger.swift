import Glibc
import Synchronization

/// A log level, ordered from the most to the least verbose.
public enum LogLevel: Int, Sendable, Comparable, CaseIterable, CustomStringConvertible {
    case debug = 0, info, warning, error

    public static func < (lhs: LogLevel, rhs: LogLevel) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String {
        switch self {
        case .debug: "debug"
        case .info: "info"
        case .warning: "warning"
        case .error: "error"
        }
    }

    /// Parses "debug", "info", "warning" (or "warn") and "error".
    public init?(name: String) {
        switch name.lowercased() {
        case "debug": self = .debug
        case "info": self = .info
        case "warning", "warn": self = .warning
        case "error": self = .error
        default: return nil
        }
    }
}

/// One log line as a backend receives it.
public struct LogRecord: Sendable {
    public var level: LogLevel
    public var label: String
    public var message: String
    /// Key/value context such as `plugin` and `module`, in insertion order.
    public var metadata: [(String, String)]
}

/// Where log records go. The application installs one with `LoggingSystem.bootstrap`.
/// `write` may be called from any thread, concurrently.
public protocol LogBackend: Sendable {
    func write(_ record: LogRecord)
}

/// The process-wide log backend and level. Libraries never bootstrap; the executable
/// does, once, before it creates loggers.
public enum LoggingSystem {
    private struct State: Sendable {
        var backend: any LogBackend
        var level: LogLevel
    }
    private static let state = Mutex(State(backend: StandardErrorBackend(), level: .info))

    /// Installs the backend and the minimum level for every logger in the process.
    public static func bootstrap(_ backend: any LogBackend, level: LogLevel) {
        state.withLock { $0 = State(backend: backend, level: level) }
    }

    /// Changes the minimum level, e.g. after a configuration reload.
    public static func setLevel(_ level: LogLevel) {
        state.withLock { $0.level = level }
    }

    static func emit(_ record: LogRecord) {
        let (backend, level) = state.withLock { ($0.backend, $0.level) }
        if record.level >= level { backend.write(record) }
    }

    static var level: LogLevel { state.withLock { $0.level } }
}

/// A value-type logger: a label plus metadata that every line it writes carries, written
/// through the backend `LoggingSystem` was bootstrapped with. Cheap to copy; safe to use
/// from any thread.
public struct Logger: Sendable {
    public var label: String
    public var metadata: [(String, String)] = []

    public init(label: String) { self.label = label }

    /// A copy of this logger whose lines also carry `key=value`.
    public func with(_ key: String, _ value: String) -> Logger {
        var copy = self
        copy.metadata.removeAll { $0.0 == key }
        copy.metadata.append((key, value))
        return copy
    }

    public func log(_ level: LogLevel, _ message: @autoclosure () -> String, _ extra: [(String, String)] = []) {
        guard level >= LoggingSystem.level else { return }
        LoggingSystem.emit(LogRecord(level: level, label: label, message: message(), metadata: metadata + extra))
    }

    public func debug(_ message: @autoclosure () -> String, _ extra: [(String, String)] = []) { log(.debug, message(), extra) }
    public func info(_ message: @autoclosure () -> String, _ extra: [(String, String)] = []) { log(.info, message(), extra) }
    public func warning(_ message: @autoclosure () -> String, _ extra: [(String, String)] = []) { log(.warning, message(), extra) }
    public func error(_ message: @autoclosure () -> String, _ extra: [(String, String)] = []) { log(.error, message(), extra) }
}

/// The default backend: `level label: message key=value ...` lines on standard error,
/// which journald records as they are. One record is one line: control characters in the
/// label, message, keys and values are escaped (`JSONValue.escapingControlCharacters`), so
/// text from a plugin (a file name, a message) can neither start a line of its own nor send
/// a terminal escape sequence. Values with a space are written as JSON strings.
public struct StandardErrorBackend: LogBackend {
    public init() {}

    public func write(_ record: LogRecord) {
        let text = JSONValue.escapingControlCharacters
        var line = "\(record.level) \(text(record.label)): \(text(record.message))"
        for (key, value) in record.metadata {
            line += " \(text(key))=\(value.contains(" ") ? JSONValue.quote(value) : text(value))"
        }
        line += "\n"
        StandardError.write(line)
    }
}

/// Writes whole lines to standard error with one write each, so lines from several
/// threads never interleave mid-line.
public enum StandardError {
    public static func write(_ text: String) {
        var text = text
        text.withUTF8 { bytes in
            var done = 0
            while done < bytes.count {
                let written = Glibc.write(2, bytes.baseAddress! + done, bytes.count - done)
                if written < 0 && errno == EINTR { continue }
                guard written > 0 else { return }  // standard error is closed or broken: the line is lost
                done += written
            }
        }
    }
}
