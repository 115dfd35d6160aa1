/// A path's parent and last component, read as text, for paths of any shape from outside
/// (the command line, the configuration): Foundation's `NSString.deletingLastPathComponent`
/// and `lastPathComponent` trap on a one-character relative path such as `s` or `s/`
/// (swift-corelibs-foundation, Swift 6.3), so ModuleHost splits paths only here.
///
/// Nothing is resolved: no symlink, `.` or `..` is looked at, and the file system is not read.
public enum PathText {
    /// `/a/b` -> `/a`, `/a` -> `/`, `a` -> `.`, `a/b/` -> `a`, `a//b` -> `a`; `/` and `.`
    /// are their own parents.
    public static func parent(of path: String) -> String {
        let trimmed = withoutTrailingSlashes(path)
        guard let slash = trimmed.lastIndex(of: "/") else { return trimmed.isEmpty && path.hasPrefix("/") ? "/" : "." }
        let parent = withoutTrailingSlashes(String(trimmed[..<slash]))
        return parent.isEmpty ? "/" : parent
    }

    /// `/a/b.so` -> `b.so`, `a/` -> `a`, `a` -> `a`, `/` -> `/`, `` -> ``.
    public static func lastComponent(of path: String) -> String {
        let trimmed = withoutTrailingSlashes(path)
        if trimmed.isEmpty { return path.hasPrefix("/") ? "/" : "" }
        guard let slash = trimmed.lastIndex(of: "/") else { return trimmed }
        return String(trimmed[trimmed.index(after: slash)...])
    }

    /// Why `path`, given from outside (a flag, a configuration field), cannot name a file or
    /// directory: it is empty, or holds a NUL byte (the system would read it cut there), or,
    /// with `absolute`, it is relative (to whatever the daemon's working directory is). Nil
    /// when it can.
    public static func problem(with path: String, absolute: Bool = false) -> String? {
        if path.isEmpty { return "is empty" }
        if path.utf8.contains(0) { return "holds a NUL byte" }
        if absolute && !path.hasPrefix("/") { return "is not an absolute path" }
        return nil
    }

    /// `path` as an absolute path: unchanged when it is one, else joined to
    /// `workingDirectory` (by default this process's), without a leading `./`.
    public static func absolute(_ path: String, in workingDirectory: String = FileSystem.currentDirectory) -> String {
        if path.hasPrefix("/") { return path }
        var relative = Substring(path)
        while relative.hasPrefix("./") { relative = relative.dropFirst(2) }
        let base = withoutTrailingSlashes(workingDirectory)
        if relative.isEmpty || relative == "." { return base.isEmpty ? "/" : base }
        return base + "/" + relative
    }

    private static func withoutTrailingSlashes(_ path: String) -> String {
        var text = Substring(path)
        while text.hasSuffix("/") { text = text.dropLast() }
        return String(text)
    }
}
