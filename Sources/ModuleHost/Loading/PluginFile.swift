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
            file: directory, check: .fileType, problem: "cannot open the plugin directory (\(String(cString: strerror(errno))))",
            fix: "create it or correct the --plugins path")
    }
    defer { closedir(dir) }
    // ASCII names (nearly all) stay C strings: the name rule is checked on their bytes, they
    // sort by their bytes, which for ASCII is the order `<` gives, with qsort and strcmp (no
    // generic sort, whose first use in a process sets up types at run time), and each
    // becomes a String once, as its path. Any other name goes through the rule as written.
    var bytes: [UnsafeMutablePointer<CChar>] = []
    var others: [String] = []
    defer { for name in bytes { free(name) } }
    while let entry = readdir(dir) {
        let ascii = withUnsafeBytes(of: entry.pointee.d_name) { raw -> Bool? in
            let count = raw.firstIndex(of: 0) ?? raw.count
            guard raw[..<count].allSatisfy({ $0 < 0x80 }) else { return nil }
            // isPluginFileName's rule for ASCII names.
            guard count > 3, raw[0] != UInt8(ascii: "."), raw[count - 3] == UInt8(ascii: "."),
                  raw[count - 2] == UInt8(ascii: "s"), raw[count - 1] == UInt8(ascii: "o") else { return false }
            guard let copy = strndup(raw.baseAddress!.assumingMemoryBound(to: CChar.self), count) else { return nil }
            bytes.append(copy)
            return true
        }
        guard ascii == nil else { continue }
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
        if isPluginFileName(name) { others.append(name) }
    }
    let prefix = directory.hasSuffix("/") ? directory : directory + "/"
    guard others.isEmpty else { return (bytes.map { String(cString: $0) } + others).sorted().map { prefix + $0 } }
    qsort(&bytes, bytes.count, MemoryLayout<UnsafeMutablePointer<CChar>>.stride) { a, b in
        strcmp(a!.load(as: UnsafePointer<CChar>.self), b!.load(as: UnsafePointer<CChar>.self))
    }
    var prefixBytes = prefix
    return prefixBytes.withUTF8 { head in
        bytes.map { name in
            let length = strlen(name)
            return String(unsafeUninitializedCapacity: head.count + length) { buffer in
                UnsafeMutableRawBufferPointer(buffer).copyMemory(from: UnsafeRawBufferPointer(head))
                UnsafeMutableRawPointer(buffer.baseAddress! + head.count).copyMemory(from: name, byteCount: length)
                return head.count + length
            }
        }
    }
}

/// True for names the host treats as plugins: `*.so` that the one ignored-name rule
/// (`DirectoryWatcher.isIgnoredName`: dotfiles and the temporary names of a copy in
/// progress) does not ignore. The scan and the watcher agree on every name through it.
public func isPluginFileName(_ name: String) -> Bool {
    // An ASCII name (nearly all) is read byte by byte: there, every character is one byte
    // (CR LF, the one pair that forms a character, is not part of any rule here). A name
    // that ends in ".so" ends in none of the ignored suffixes, so only a leading dot
    // remains to check. Any other name goes through the rules as written.
    var name = name
    if let quick = name.withUTF8({ bytes -> Bool? in
        guard bytes.allSatisfy({ $0 < 0x80 }) else { return nil }
        let count = bytes.count
        return count > 3 && bytes[0] != UInt8(ascii: ".")
            && bytes[count - 3] == UInt8(ascii: ".") && bytes[count - 2] == UInt8(ascii: "s") && bytes[count - 1] == UInt8(ascii: "o")
    }) {
        return quick
    }
    return name.hasSuffix(".so") && !DirectoryWatcher.isIgnoredName(name)
}
