import Glibc

/// Which process a pid stands for, beyond the number, which the kernel reuses: when the
/// process started, and in which boot. Read from /proc with bounded reads; nil when the
/// process is gone or /proc cannot be read.
public enum ProcessIdentity {
    /// This boot's id (`/proc/sys/kernel/random/boot_id`), which changes at every boot.
    public static var bootID: String? {
        guard let bytes = try? BoundedFile.read("/proc/sys/kernel/random/boot_id", limit: 128) else { return nil }
        let text = String(decoding: bytes, as: UTF8.self).filter { !$0.isWhitespace }
        return text.isEmpty ? nil : text
    }

    /// When process `pid` started, in clock ticks since the boot (field 22 of
    /// `/proc/PID/stat`); nil when there is no such process.
    public static func startTime(of pid: pid_t) -> UInt64? {
        guard pid > 0, let bytes = try? BoundedFile.read("/proc/\(pid)/stat", limit: 4096) else { return nil }
        // "PID (COMM) STATE ...": the name may hold spaces and parentheses; the fields
        // after the last ")" start with the third.
        guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        let fields = bytes[(close + 1)...].split(separator: UInt8(ascii: " "))
        guard fields.count > 19 else { return nil }
        return UInt64(String(decoding: fields[19], as: UTF8.self))
    }
}
