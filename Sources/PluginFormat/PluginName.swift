import ModuleKit

/// The one grammar for plugin and module names (docs/plugins.md, "Names"): 1 to 64 bytes of
/// ASCII letters, digits, `-`, `_` and `.`, the first being a letter, a digit or `_`.
///
/// Names end up in file names (the daemon's private copies), log lines, control requests
/// and command lines, so the grammar excludes `/`, `..` as a whole name, white space,
/// control characters and escape sequences, and a leading `.` (hidden files) or `-` (read
/// as an option). Every place that takes a name from outside checks it here.
public enum PluginName {
    /// The longest name, in bytes.
    public static let maximumLength = 64

    /// The grammar in words, for error messages.
    public static let grammar =
        "names are 1 to \(maximumLength) ASCII letters, digits, '-', '_' or '.', starting with a letter, a digit or '_'"

    /// Whether `name` follows the grammar.
    public static func isValid(_ name: String) -> Bool {
        let bytes = name.utf8
        guard let first = bytes.first, bytes.count <= maximumLength, first != UInt8(ascii: "."), first != UInt8(ascii: "-")
        else { return false }
        return bytes.allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."):
                true
            default:
                false
            }
        }
    }

    /// nil when `name` follows the grammar, else one line saying so: `"a/b", not a name:
    /// names are ...`. The name is shown escaped (no control characters) and shortened.
    public static func problem(_ name: String) -> String? {
        isValid(name) ? nil : "\(shown(name)), not a name: \(grammar)"
    }

    /// `text` quoted for a one-line message (`JSONValue.quote`: quotes, backslashes and
    /// control characters escaped as in log lines), at most 80 characters.
    public static func shown(_ text: String) -> String {
        guard text.unicodeScalars.count > 80 else { return JSONValue.quote(text) }
        return String(JSONValue.quote(String(String.UnicodeScalarView(text.unicodeScalars.prefix(80)))).dropLast()) + "…\""
    }
}

/// The rule for versions, a plugin's in plugin.json and a module's in its descriptor:
/// free-form text of at most 64 bytes, shown with its control characters escaped.
public enum VersionText {
    /// The longest version, in bytes.
    public static let maximumLength = 64

    /// nil when `version` follows the rule, else one line saying so: `"1.0.0-…", 200
    /// bytes: versions are at most 64 bytes`.
    public static func problem(_ version: String) -> String? {
        let size = version.utf8.count
        return size <= maximumLength ? nil : "\(PluginName.shown(version)), \(size) bytes: versions are at most \(maximumLength) bytes"
    }
}
