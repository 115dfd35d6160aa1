import DaemonKit
import Glibc
import PluginFormat

/// A plugin file that passed the checks that need no code from it: its path, manifest and
/// the facts about its ELF image the later checks use.
///
/// Immutable, and a class so that the loader's lists (candidates, load order, loaded
/// plugins) share one copy of it instead of copying its strings and arrays.
public final class PluginFile: Sendable {
    /// The path as found in the plugin directory.
    public let path: String
    /// Where the bytes actually are (the symlink target, if any).
    public let resolvedPath: String
    public let manifest: Manifest
    public let dynamic: DynamicInfo
    /// Problems tolerated because of `allowInsecure` (permissions), to be logged.
    public let warnings: [String]
    /// The name plugins are known by.
    public var name: String { manifest.name }

    init(path: String, resolvedPath: String, manifest: Manifest, dynamic: DynamicInfo, warnings: [String]) {
        self.path = path
        self.resolvedPath = resolvedPath
        self.manifest = manifest
        self.dynamic = dynamic
        self.warnings = warnings
    }

    /// The same file, its bytes read from `resolvedPath` (e.g. a private copy).
    public func resolving(to resolvedPath: String) -> PluginFile {
        PluginFile(path: path, resolvedPath: resolvedPath, manifest: manifest, dynamic: dynamic, warnings: warnings)
    }
}

/// Lists the candidate plugin files of a directory (`isPluginFileName`), sorted by name.
public func pluginCandidates(in directory: String) throws(LoadFailure) -> [String] {
    guard let dir = opendir(directory) else {
        throw LoadFailure(
            file: directory, check: .fileType, problem: "cannot open the plugin directory (\(SystemError.describe(errno)))",
            fix: "create it or correct the --plugins path")
    }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
        if isPluginFileName(name) { names.append(name) }
    }
    let prefix = directory.hasSuffix("/") ? directory : directory + "/"
    return names.sorted().map { prefix + $0 }
}

/// True for names the host treats as plugins: `*.so` that the one ignored-name rule
/// (`DirectoryWatcher.isIgnoredName`: dotfiles and the temporary names of a copy in
/// progress) does not ignore. The scan and the watcher agree on every name through it.
public func isPluginFileName(_ name: String) -> Bool {
    name.hasSuffix(".so") && !DirectoryWatcher.isIgnoredName(name)
}
