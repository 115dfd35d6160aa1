/// The one "did you mean" rule for names a user types (manifest fields, configuration
/// fields): the closest known name by edit distance, when it is close enough to be a typo.
public enum Spelling {
    /// The known name nearest to `word`: equal ignoring case, or at most two insertions,
    /// deletions, substitutions or swaps of neighbours away (one for words of four letters
    /// or fewer). Ties go to the first in `known`. Nil when none is that close.
    public static func suggestion(for word: String, among known: [String]) -> String? {
        let typed = Array(word.lowercased().unicodeScalars)
        // A word much longer than any name cannot be a typo of one; keep the cost bounded.
        guard typed.count <= 64 else { return nil }
        var best: (name: String, distance: Int)?
        for name in known {
            let candidate = Array(name.lowercased().unicodeScalars)
            let limit = min(typed.count, candidate.count) <= 4 ? 1 : 2
            let distance = Self.distance(typed, candidate)
            if distance <= limit, distance < (best?.distance ?? Int.max) { best = (name, distance) }
        }
        return best?.name
    }

    /// Optimal string alignment distance: insertions, deletions, substitutions and swaps of
    /// adjacent letters each cost 1.
    static func distance(_ a: [Unicode.Scalar], _ b: [Unicode.Scalar]) -> Int {
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var before = [Int](repeating: 0, count: b.count + 1)
        var previous = Array(0...b.count)
        var current = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            current[0] = i
            for j in 1...b.count {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                var value = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] { value = min(value, before[j - 2] + 1) }
                current[j] = value
            }
            (before, previous, current) = (previous, current, before)
        }
        return previous[b.count]
    }
}
