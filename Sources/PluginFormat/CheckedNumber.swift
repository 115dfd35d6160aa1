/// Conversions of numbers from outside (JSON documents, command-line flags) to the types
/// the host computes with. Each checks the value against an allowed range before
/// converting and returns nil when it is outside, so a hostile or careless number becomes a
/// refusal with a message, never a trap.
public enum CheckedNumber {
    /// `value` as an `Int` when it is a whole number within `range`; nil for fractions,
    /// NaN, infinities and anything outside `range`.
    public static func integer(_ value: Double, in range: ClosedRange<Int>) -> Int? {
        guard value.isFinite, value == value.rounded(), value >= Double(range.lowerBound), value <= Double(range.upperBound),
              let result = Int(exactly: value), range.contains(result)
        else { return nil }
        return result
    }

    /// `seconds` as a `Duration` when it is a finite number of seconds within `range` (whose
    /// bounds must lie within ±9e9 s); nil otherwise. Kept to the millisecond.
    public static func duration(seconds: Double, in range: ClosedRange<Double>) -> Duration? {
        guard seconds.isFinite, range.contains(seconds) else { return nil }
        return .milliseconds(Int64((seconds * 1000).rounded()))
    }

    /// A number of seconds typed on a command line, within `range`: at most 15 decimal
    /// digits with an optional fraction (`5`, `0.25`). No sign, exponent, hexadecimal form,
    /// `inf` or `nan`, which `Double` would read as something other than the text shows
    /// (`-1e-400` as 0, `0x1p3` as 8); and no more digits than a `Double` holds, past which
    /// `3600.000000000000000001` would read as 3600.
    public static func duration(secondsText text: String, in range: ClosedRange<Double>) -> Duration? {
        let parts = text.utf8.split(separator: UInt8(ascii: "."), maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.allSatisfy({ !$0.isEmpty && $0.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") } }),
              parts.reduce(0, { $0 + $1.count }) <= 15
        else { return nil }
        return Double(text).flatMap { duration(seconds: $0, in: range) }
    }

    /// The range in words, for messages: "from -1000 to 1000".
    public static func describe(_ range: ClosedRange<Int>) -> String { "from \(range.lowerBound) to \(range.upperBound)" }

    /// The range in words, for messages: "from 0.001 to 3600" (whole numbers without ".0").
    public static func describe(_ range: ClosedRange<Double>) -> String {
        func text(_ value: Double) -> String {
            if let whole = integer(value, in: -1_000_000_000_000...1_000_000_000_000) { return String(whole) }
            return String(value)
        }
        return "from \(text(range.lowerBound)) to \(text(range.upperBound))"
    }
}
