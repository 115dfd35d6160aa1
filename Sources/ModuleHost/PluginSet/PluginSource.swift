import DaemonKit
import Glibc
import PluginFormat

/// Where a plugin set's plugins come from: the candidate files of its directories, what
/// each file holds, and the code it runs. What the set decides (which files load, in which
/// order, which are refused and why, what replaces or removes what, and what the host
/// runs) is its own and the same whatever the source. `DirectoryPluginSource` reads the
/// plugin directories, validates and copies the files and maps their images; tests give a
/// set a source whose files are made up and whose modules are Swift types of the test
/// process, so that the set's logic runs without a file being compiled or mapped.
///
/// What the set relies on, which every source must give:
/// - **Threading.** The set calls a source on its actor, inside its serial change queue:
///   one call at a time, in the order of the scan.
/// - **Identity.** `identity` changes whenever what `read` would return changes: the set
///   reads a file again only when its identity changed (or when its refusal depends on
///   other files).
/// - **Failures.** Every refusal is a `LoadFailure` naming the file (`read`: the path in
///   the plugin directory; `open`: the image's, which the set reports against the file).
/// - **Agreement.** `open` returns a plugin whose modules are those of the manifest `read`
///   returned, in its order, each made by a factory naming the plugin.
protocol PluginSource: Sendable {
    /// The candidate files of `directories` (path to its directory, each read once), each
    /// directory's `stat`, and a failure for each directory that cannot be read.
    func candidates(in directories: [String]) -> (present: [String: String], directoryStatus: [String: stat], unreadable: [LoadFailure])

    /// What identifies the version of the file at `path` now (in `directory`, whose `stat`
    /// is `directoryStatus`); nil when the file is gone. Throws the refusal of a file that
    /// is listed but cannot be identified (a dangling symlink).
    func identity(of path: String, in directory: String, directoryStatus: stat?,
                  validator: Validator) throws(LoadFailure) -> FileIdentity?

    /// The file at `path`, checked by `validator` without running its code: the checked
    /// file, the version its checks read (what its image must be made from), and the hash
    /// of that content (what the crash guard knows it by).
    func read(_ path: String, in directory: String, directoryStatus: stat?,
              validator: Validator) throws(LoadFailure) -> (file: PluginFile, version: FileIdentity, hash: String)

    /// The manifest the file at `path` holds, read without any check: what the row of a
    /// file `read` refused shows; nil when none can be read.
    func manifest(of path: String) -> Manifest?

    /// The image `file` is loaded from, made for `set` (`PluginSet.privateImage`: a private
    /// copy under names of its own generation, made from `version` when given).
    func image(of file: PluginFile, version: FileIdentity?, generation: Int, nameGeneration: Int, hash: String,
               renames: [String: String], inMemory: Bool, for set: isolated PluginSet) throws(LoadFailure) -> PluginSet.PrivateImage

    /// Opens `image` in this process for `set`: its code is mapped and its entry point
    /// describes its modules (`PluginLoader.open`). Nothing is registered.
    func open(_ image: PluginSet.PrivateImage, for set: isolated PluginSet) throws(LoadFailure) -> LoadedPlugin
}

/// The plugin source of a running plugin set: the plugin directories as the file system
/// has them, checked by the `Validator`, copied into private images and opened with
/// `dlopen` (`PluginLoader`).
struct DirectoryPluginSource: PluginSource {
    func candidates(in directories: [String]) -> (present: [String: String], directoryStatus: [String: stat], unreadable: [LoadFailure]) {
        PluginSet.candidates(in: directories)
    }

    func identity(of path: String, in directory: String, directoryStatus: stat?,
                  validator: Validator) throws(LoadFailure) -> FileIdentity? {
        if let identity = FileIdentity(path: path, directory: directoryStatus) { return identity }
        // Listed, but stat cannot follow it: validation names why (a dangling symlink is
        // refused by name). One removed since the listing is simply gone.
        var entry = stat()
        if lstat(path, &entry) == 0 { _ = try validator.validateReading(path, in: directory, directoryStatus: directoryStatus) }
        return nil
    }

    func read(_ path: String, in directory: String, directoryStatus: stat?,
              validator: Validator) throws(LoadFailure) -> (file: PluginFile, version: FileIdentity, hash: String) {
        // The file the checks read is the one hashed, in chunks.
        let (checked, contents) = try validator.validateReading(path, in: directory, directoryStatus: directoryStatus)
        let hash: String
        do {
            hash = try contentHash(of: contents)
        } catch {
            throw LoadFailure(file: path, check: .fileType, problem: "cannot read the file to fingerprint it: \(error)",
                              fix: "check the file is readable and not being rewritten in place")
        }
        return (checked, FileIdentity(status: contents.status), hash)
    }

    func manifest(of path: String) -> Manifest? { Manifest.embedded(in: path) }

    func image(of file: PluginFile, version: FileIdentity?, generation: Int, nameGeneration: Int, hash: String,
               renames: [String: String], inMemory: Bool, for set: isolated PluginSet) throws(LoadFailure) -> PluginSet.PrivateImage {
        try set.privateImage(of: file, version: version, generation: generation, nameGeneration: nameGeneration, hash: hash,
                             renames: renames, inMemory: inMemory)
    }

    func open(_ image: PluginSet.PrivateImage, for set: isolated PluginSet) throws(LoadFailure) -> LoadedPlugin {
        set.mapped(image.file.name, nameGeneration: image.nameGeneration, image: image.file)
        return try PluginLoader(workers: set.workers, metrics: set.metrics).open(image.file)
    }
}
