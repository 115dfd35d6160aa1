import Glibc

/// The one way ModuleHost writes a wall-clock time: ISO 8601 in UTC, `2026-11-29T19:08:11Z`,
/// or with milliseconds `2026-11-29T19:08:11.042Z` (log lines). Used for log lines, crash
/// records (the fatal-signal recorder writes seconds since the epoch, formatted here when
/// the record is read) and anything else that shows a time. Pure computation, safe from any
/// thread; no Foundation formatter (which costs more than loading a plugin).
public enum UTCTimestamp {
    /// `seconds` since the epoch, with `milliseconds` (0...999) when given.
    public static func format(seconds: Int, milliseconds: Int? = nil) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        func pad(_ value: Int, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        var text = "\(pad(Int(parts.tm_year) + 1900, 4))-\(pad(Int(parts.tm_mon) + 1, 2))-\(pad(Int(parts.tm_mday), 2))"
            + "T\(pad(Int(parts.tm_hour), 2)):\(pad(Int(parts.tm_min), 2)):\(pad(Int(parts.tm_sec), 2))"
        if let milliseconds { text += "." + pad(milliseconds, 3) }
        return text + "Z"
    }

    /// Now, from the real-time clock.
    public static func now(milliseconds: Bool = false) -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return format(seconds: Int(now.tv_sec), milliseconds: milliseconds ? Int(now.tv_nsec) / 1_000_000 : nil)
    }
}
