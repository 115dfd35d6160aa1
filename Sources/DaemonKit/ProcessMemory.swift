import Glibc

/// A process's memory as the kernel reports it in /proc, read with bounded reads: resident
/// bytes (`statm`) and the number of memory mappings (lines of `maps`, which
/// `vm.max_map_count` bounds). Nil when the process is gone or /proc cannot be read.
public enum ProcessMemory {
    /// The resident set size of process `pid` (this process by default), in bytes.
    public static func residentBytes(pid: Int32? = nil) -> Int64? {
        // statm: size resident shared text lib data dt, in pages.
        guard let statm = try? BoundedFile.read(directory(pid) + "/statm", limit: 4096) else { return nil }
        let fields = String(decoding: statm, as: UTF8.self).split(separator: " ")
        guard fields.count > 1, let pages = Int64(fields[1]) else { return nil }
        let (bytes, overflow) = pages.multipliedReportingOverflow(by: Int64(sysconf(Int32(_SC_PAGESIZE))))
        return overflow ? nil : bytes
    }

    /// The number of memory mappings of process `pid` (this process by default).
    public static func mappings(pid: Int32? = nil) -> Int? {
        // One line per mapping, about 100 bytes each: 64 MiB holds far more than the
        // default vm.max_map_count (65530).
        guard let maps = try? BoundedFile.read(directory(pid) + "/maps", limit: 64 << 20) else { return nil }
        return maps.reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
    }

    private static func directory(_ pid: Int32?) -> String { pid.map { "/proc/\($0)" } ?? "/proc/self" }
}
