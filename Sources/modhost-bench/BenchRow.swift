import Foundation

/// One result: the host's figure, the baseline measured in the same run, their ratio and
/// the ratio to beat (none for rows that only report a figure).
struct BenchRow: Encodable {
    var name: String
    var value: Double
    var unit: String
    var baseline_value: Double
    var ratio: Double
    var target: Double?
    /// What the baseline is, in words.
    var baseline: String

    init(name: String, value: Double, unit: String, baseline: Double, baselineDescription: String, target: Double?) {
        self.name = name
        self.value = value
        self.unit = unit
        self.baseline_value = baseline
        self.ratio = baseline > 0 ? value / baseline : 0
        self.target = target
        self.baseline = baselineDescription
    }

    var met: Bool { target.map { ratio <= $0 } ?? true }

    /// Foundation on Linux ignores a width given to `%@`: text columns are padded here.
    private static func column(_ text: String, _ width: Int, right: Bool = false) -> String {
        let padding = String(repeating: " ", count: max(0, width - text.count))
        return right ? padding + text : text + padding
    }

    static let header = column("name", 48) + column("value", 11, right: true) + column("baseline", 15, right: true)
        + column("ratio", 13, right: true) + column("target", 9, right: true) + "  met"

    var line: String {
        let target = target.map { String(format: "%8.2f", $0) } ?? String(repeating: " ", count: 7) + "-"
        let met = self.target == nil ? "report" : met ? "yes" : "NO"
        let unit = Self.column(unit, 3)
        return Self.column(name, 48) + String(format: " %10.3f %@ %10.3f %@ %8.2f %@  %@", value, unit as NSString, baseline_value,
                                              unit as NSString, ratio, target as NSString, met as NSString)
    }
}

/// Nanoseconds of the monotonic clock.
func monotonicNanoseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
}

/// Runs `body` and returns the elapsed seconds.
func seconds(_ body: () throws -> Void) rethrows -> Double {
    let start = monotonicNanoseconds()
    try body()
    return Double(monotonicNanoseconds() - start) / 1e9
}

/// Runs a shell command; throws with its output when it fails.
func shell(_ command: String) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/bash")
    process.arguments = ["-c", command]
    try process.run()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw NSError(domain: "bench", code: Int(process.terminationStatus), userInfo: [NSLocalizedDescriptionKey: "failed: \(command)"])
    }
}
