import Foundation

/// A strict reader of the Prometheus text exposition format 0.0.4, for tests: it accepts
/// only what a Prometheus server (or a node exporter's textfile collector) accepts, and
/// checks the conventions ModuleHost promises on top (counters end in `_total`, every
/// family has HELP and TYPE before its samples, histograms are complete and consistent).
public struct PrometheusText: Sendable {
    public struct Sample: Sendable, Equatable {
        public var name: String
        public var labels: [String: String]
        public var value: Double
    }

    public struct Family: Sendable {
        public var name: String
        public var type: String
        public var help: String
        public var samples: [Sample]
    }

    public struct Invalid: Error, CustomStringConvertible {
        public var line: Int
        public var problem: String
        public var description: String { "line \(line): \(problem)" }
    }

    /// Families by name, in document order.
    public private(set) var families: [Family] = []

    public init(_ text: String) throws {
        var lineNumber = 0
        var seenSeries: Set<String> = []
        var closed: Set<String> = []
        func fail(_ problem: String) -> Invalid { Invalid(line: lineNumber, problem: problem) }
        guard text.isEmpty || text.hasSuffix("\n") else { throw Invalid(line: 0, problem: "the text does not end with a line feed") }
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).dropLast() {
            lineNumber += 1
            if line.isEmpty { continue }
            if line.hasPrefix("#") {
                let parts = line.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false)
                guard parts.count >= 3, parts[0] == "#", parts[1] == "HELP" || parts[1] == "TYPE" else { continue }
                let name = String(parts[2])
                guard Self.isMetricName(name) else { throw fail("invalid metric name \(name)") }
                let rest = parts.count > 3 ? String(parts[3]) : ""
                if let index = families.firstIndex(where: { $0.name == name }) {
                    guard index == families.count - 1, families[index].samples.isEmpty else {
                        throw fail("\(parts[1]) of \(name) after its samples or another family")
                    }
                    if parts[1] == "HELP" {
                        guard families[index].help.isEmpty else { throw fail("second HELP for \(name)") }
                        families[index].help = try Self.unescape(rest, quotes: false) ?? { throw fail("bad escape in HELP") }()
                    } else {
                        guard families[index].type.isEmpty else { throw fail("second TYPE for \(name)") }
                        families[index].type = rest
                    }
                } else {
                    guard !closed.contains(name) else { throw fail("family \(name) appears twice") }
                    if let last = families.last { closed.insert(last.name) }
                    families.append(Family(name: name, type: parts[1] == "TYPE" ? rest : "",
                                           help: parts[1] == "HELP" ? (try Self.unescape(rest, quotes: false) ?? { throw fail("bad escape in HELP") }()) : "",
                                           samples: []))
                }
                if parts[1] == "TYPE", !["counter", "gauge", "histogram", "summary", "untyped"].contains(rest) {
                    throw fail("unknown type \(rest)")
                }
                continue
            }
            let sample = try Self.sample(String(line)) ?? { throw fail("not a sample line: \(line)") }()
            guard let index = families.indices.last, Self.belongs(sample.name, to: families[index]) else {
                throw fail("sample \(sample.name) is not of the family declared just before it")
            }
            let series = sample.name + "|" + sample.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")
            guard seenSeries.insert(series).inserted else { throw fail("duplicate series \(series)") }
            families[index].samples.append(sample)
        }
        for family in families {
            guard !family.type.isEmpty, !family.help.isEmpty else {
                throw Invalid(line: 0, problem: "family \(family.name) lacks HELP or TYPE")
            }
            if family.type == "counter", !family.name.hasSuffix("_total") {
                throw Invalid(line: 0, problem: "counter \(family.name) does not end in _total")
            }
            for sample in family.samples where family.type == "counter" && (sample.value < 0 || sample.value.isNaN) {
                throw Invalid(line: 0, problem: "counter \(sample.name) has value \(sample.value)")
            }
            if family.type == "histogram" { try Self.checkHistogram(family) }
        }
    }

    /// The family named `name`.
    public func family(_ name: String) -> Family? { families.first { $0.name == name } }

    /// The value of the sample `name` whose labels include `labels`; nil when none or
    /// several match.
    public func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        let matches = families.flatMap(\.samples).filter { sample in
            sample.name == name && labels.allSatisfy { sample.labels[$0.key] == $0.value }
        }
        return matches.count == 1 ? matches[0].value : nil
    }

    // MARK: Reading

    static func isMetricName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, first == "_" || first == ":" || ("a"..."z").contains(first) || ("A"..."Z").contains(first)
        else { return false }
        return name.unicodeScalars.allSatisfy { $0 == "_" || $0 == ":" || ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) }
    }

    static func isLabelName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, first == "_" || ("a"..."z").contains(first) || ("A"..."Z").contains(first) else { return false }
        return name.unicodeScalars.allSatisfy { $0 == "_" || ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) }
    }

    /// `\\`, `\n` and (in label values) `\"` are the only escapes.
    static func unescape(_ text: String, quotes: Bool) -> String? {
        var out = String.UnicodeScalarView()
        var iterator = text.unicodeScalars.makeIterator()
        while let scalar = iterator.next() {
            guard scalar == "\\" else {
                out.append(scalar)
                continue
            }
            switch iterator.next() {
            case "\\": out.append("\\")
            case "n": out.append("\n")
            case "\"" where quotes: out.append("\"")
            default: return nil
            }
        }
        return String(out)
    }

    /// `name{label="value",...} value [timestamp]`.
    static func sample(_ line: String) -> Sample? {
        let scalars = Array(line.unicodeScalars)
        var index = 0
        var name = ""
        while index < scalars.count, scalars[index] != "{", scalars[index] != " " {
            name.unicodeScalars.append(scalars[index])
            index += 1
        }
        guard isMetricName(name) else { return nil }
        var labels: [String: String] = [:]
        if index < scalars.count, scalars[index] == "{" {
            index += 1
            while index < scalars.count, scalars[index] != "}" {
                var label = ""
                while index < scalars.count, scalars[index] != "=" {
                    label.unicodeScalars.append(scalars[index])
                    index += 1
                }
                guard isLabelName(label), labels[label] == nil, index + 1 < scalars.count, scalars[index + 1] == "\"" else { return nil }
                index += 2
                var raw = ""
                while index < scalars.count, scalars[index] != "\"" {
                    if scalars[index] == "\n" { return nil }
                    raw.unicodeScalars.append(scalars[index])
                    if scalars[index] == "\\", index + 1 < scalars.count {
                        index += 1
                        raw.unicodeScalars.append(scalars[index])
                    }
                    index += 1
                }
                guard index < scalars.count, let value = unescape(raw, quotes: true) else { return nil }
                labels[label] = value
                index += 1
                if index < scalars.count, scalars[index] == "," { index += 1 }
            }
            guard index < scalars.count else { return nil }
            index += 1
        }
        guard index < scalars.count, scalars[index] == " " else { return nil }
        let rest = String(String.UnicodeScalarView(scalars[(index + 1)...])).split(separator: " ")
        guard rest.count == 1 || rest.count == 2, let value = number(String(rest[0])) else { return nil }
        if rest.count == 2, Int64(rest[1]) == nil { return nil }
        return Sample(name: name, labels: labels, value: value)
    }

    static func number(_ text: String) -> Double? {
        switch text {
        case "+Inf", "Inf": return .infinity
        case "-Inf": return -.infinity
        case "NaN": return .nan
        default: return Double(text)
        }
    }

    static func belongs(_ sample: String, to family: Family) -> Bool {
        if family.type == "histogram" {
            return [family.name + "_bucket", family.name + "_sum", family.name + "_count"].contains(sample)
        }
        if family.type == "summary" {
            return [family.name, family.name + "_sum", family.name + "_count"].contains(sample)
        }
        return sample == family.name
    }

    static func checkHistogram(_ family: Family) throws {
        func fail(_ problem: String) -> Invalid { Invalid(line: 0, problem: "histogram \(family.name): \(problem)") }
        var series: [[String: String]: (buckets: [(Double, Double)], sum: Double?, count: Double?)] = [:]
        for sample in family.samples {
            var labels = sample.labels
            if sample.name.hasSuffix("_bucket") {
                guard let le = labels.removeValue(forKey: "le"), let bound = number(le) else { throw fail("bucket without le") }
                series[labels, default: ([], nil, nil)].buckets.append((bound, sample.value))
            } else if sample.name.hasSuffix("_sum") {
                series[labels, default: ([], nil, nil)].sum = sample.value
            } else {
                series[labels, default: ([], nil, nil)].count = sample.value
            }
        }
        for (labels, entry) in series {
            guard let count = entry.count, entry.sum != nil else { throw fail("\(labels) lacks _sum or _count") }
            guard let last = entry.buckets.last, last.0 == .infinity, last.1 == count else {
                throw fail("\(labels): the last bucket must be le=\"+Inf\" with the _count")
            }
            for (previous, next) in zip(entry.buckets, entry.buckets.dropFirst()) where !(previous.0 < next.0 && previous.1 <= next.1) {
                throw fail("\(labels): buckets are not in increasing order with non-decreasing counts")
            }
        }
    }
}
