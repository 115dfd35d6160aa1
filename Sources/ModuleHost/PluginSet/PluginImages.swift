import CDynamicLoader
import DaemonKit
import Dispatch
import Glibc
import ModuleKit
import PluginFormat

/// The private images a plugin set loads plugins from, and the trial loads of them. Every
/// function here runs inside the set's serial change queue.
extension PluginSet {
    struct PrivateImage {
        var file: PluginFile
        var generation: Int
        /// The generation its names carry (1: the original names).
        var nameGeneration: Int
        var soname: String
        var originalSoname: String
        var size: Int64
    }

    /// Trial-loads `file` with the trial loader, if any, with the images of the plugins it
    /// depends on and then `extra` loaded first.
    func trialLoad(_ file: PluginFile, preloading extra: [String] = []) async throws(LoadFailure) {
        guard let trialLoader else { return }
        let preloads = file.manifest.dependencies.compactMap { records[$0]?.loaded.file.resolvedPath } + extra
        try await trialLoader.trialLoad(file, preloading: preloads)
    }

    /// Deletes the private copy `image` was loaded (or refused) from, or closes its memory
    /// file when no image was opened from it here. What is mapped stays mapped: the crash
    /// guard names a plugin by its file in the plugin directory and its content hash, never
    /// by its copy. Each loaded plugin keeps its current copy: a
    /// dependent's trial load preloads it, and a replacement of what it depends on reloads
    /// it from there under its next generation's name.
    func deleteImage(_ image: PluginFile) {
        if let fd = memoryImages[image.resolvedPath] {
            // An image this process opened keeps its descriptor, and so its path: glibc
            // would take a new image opened by the same path for the old one.
            guard !openedMemoryImages.contains(image.resolvedPath) else { return }
            memoryImages[image.resolvedPath] = nil
            close(fd)
            return
        }
        guard image.resolvedPath.hasPrefix(imagesDirectory + "/") else { return }
        if unlink(image.resolvedPath) != 0 && errno != ENOENT {
            logger.warning("cannot delete the private copy \(image.resolvedPath): \(SystemError.describe(errno))",
                           [("plugin", image.name), ("file", image.path)])
        }
    }

    /// Deletes the private copies (and unfinished ones) an earlier run of this images
    /// directory left: what it names `NAME-GENERATION.NAMEGENERATION-HASH.so` (`.so.tmp`). Called before
    /// the first scan loads anything.
    func deleteLeftoverImages() {
        guard let names = try? FileSystem.names(in: imagesDirectory) else { return }
        var deleted = 0
        for name in names where Self.isImageName(name) {
            let path = imagesDirectory + "/" + name
            var status = stat()
            guard lstat(path, &status) == 0, status.st_mode & S_IFMT == S_IFREG else { continue }
            if unlink(path) == 0 {
                deleted += 1
            } else {
                logger.warning("cannot delete the private copy \(path) an earlier run left: \(SystemError.describe(errno))")
            }
        }
        if deleted > 0 {
            logger.info("deleted \(deleted) private plugin \(deleted == 1 ? "copy" : "copies") an earlier run left in \(imagesDirectory)", [("directory", imagesDirectory)])
        }
    }

    /// Whether `name` is one `privateImage` writes: `NAME-GENERATION.NAMEGENERATION-HASH.so`
    /// (or, from an earlier version, `NAME-GENERATION-HASH.so`), or that with `.tmp`.
    static func isImageName(_ name: String) -> Bool {
        let stem: Substring
        if name.hasSuffix(".so.tmp") {
            stem = name.dropLast(7)
        } else if name.hasSuffix(".so") {
            stem = name.dropLast(3)
        } else {
            return false
        }
        let parts = stem.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count >= 3, let hash = parts.last, let generation = parts.dropLast().last else { return false }
        return PluginName.problem(String(parts.dropLast(2).joined(separator: "-"))) == nil
            && Self.isGenerationText(generation)
            && hash.count == 16 && hash.allSatisfy { $0.isASCII && $0.isHexDigit }
    }

    /// `GENERATION.NAMEGENERATION` (or `GENERATION`): one or two runs of ASCII digits.
    private static func isGenerationText(_ text: Substring) -> Bool {
        let numbers = text.split(separator: ".", omittingEmptySubsequences: false)
        return numbers.count <= 2 && numbers.allSatisfy { !$0.isEmpty && $0.allSatisfy { $0.isASCII && $0.isNumber } }
    }

    /// Copies a plugin under a path no other version uses (glibc returns the old image for a
    /// path it has loaded, and a file overwritten in place crashes the code mapped from it).
    /// An image this process maps (`inMemory`) is a sealed memory file, named by the path
    /// `/proc/PID/fd/N` (no inode to allocate on disk, and nothing to delete), while
    /// `memoryImageBudget` allows; any other is a file in the state directory's images
    /// directory. From generation 2 on, its SONAME and its NEEDED entries for replaced
    /// plugins are renamed (`renames`) so dependents bind to the new version. The copy is
    /// made in bounded chunks from `file`'s image, which must still be `version` (the file
    /// validation read and hashed; nil: any), then the renamed strings are written at their
    /// offsets in the copy.
    func privateImage(of file: PluginFile, version: FileIdentity?, generation: Int, nameGeneration: Int, hash: String,
                      renames extra: [String: String] = [:], inMemory: Bool = false) throws(LoadFailure) -> PrivateImage {
        let source: ReadOnlyFile
        switch ReadOnlyFile.open(file.resolvedPath, followSymlinks: true) {
        case .success(let opened): source = opened
        case .failure(let error): throw unreadable(file, error)
        }
        if let version, FileIdentity(status: source.status) != version {
            throw LoadFailure(file: file.path, check: .fileType, problem: "the file changed while it was being loaded",
                              fix: "deploy by writing to a temporary name and renaming it; the new version is tried now")
        }
        let (original, soname, renames) = try names(of: file, nameGeneration: nameGeneration, renaming: extra)
        var patches: [DynamicStringPatch.Patch] = []
        if !renames.isEmpty {
            do {
                patches = try DynamicStringPatch.patches(renames, image: ELFImage(file: source))
            } catch {
                throw LoadFailure(file: file.path, check: .elf, problem: "cannot give the private copy its own names: \(error)",
                                  fix: "rebuild the plugin with plugin.mk")
            }
        }
        // One flat directory; the name says which plugin, generation and content it is. The
        // manifest parser already refused names outside the grammar; checked again here
        // because this is where a name becomes a path.
        if let problem = PluginName.problem(file.name) {
            throw LoadFailure(file: file.path, check: .manifest, problem: "plugin name \(problem)", fix: "correct plugin.json and rebuild")
        }
        // The name generation too: it is this process's, so no two copies this process maps
        // have one path (glibc returns an image already loaded from a path without reading
        // the file again: a set made on the same state directory after another was shut
        // down would get that one's images).
        let name = "\(file.name)-\(generation).\(nameGeneration)-\(hash).so"
        let copy = ImageCopy(source: source, patches: patches)
        let resolved: String
        if inMemory, memoryImages.count < memoryImageBudget, let memory = try memoryImage(named: name, copy, of: file) {
            resolved = memory
        } else {
            resolved = try diskImage(named: name, copy, of: file)
        }
        return PrivateImage(file: PluginFile(path: file.path, resolvedPath: resolved, manifest: file.manifest, dynamic: file.dynamic, warnings: []),
                            generation: generation, nameGeneration: nameGeneration, soname: soname, originalSoname: original,
                            size: Int64(source.size))
    }

    /// The original SONAME of `file`'s image, the one its copy of `nameGeneration` gets, and
    /// every name the copy renames: its own from generation 2 on, those of the plugins it
    /// depends on that were replaced (asked for by their current names), and `extra`.
    private func names(of file: PluginFile, nameGeneration: Int, renaming extra: [String: String])
        throws(LoadFailure) -> (original: String, soname: String, renames: [String: String]) {
        let original = file.dynamic.soname ?? "lib\(file.name).so"
        guard let soname = DynamicStringPatch.generationName(original, generation: nameGeneration) else {
            throw LoadFailure(file: file.path, check: .elf, problem: "the library name \(original) is too short to carry a generation",
                              fix: "give the plugin a SONAME of at least 4 characters (plugin.mk does)")
        }
        var renames = extra
        if nameGeneration > 1 { renames[file.dynamic.soname ?? original] = soname }
        for dependency in file.manifest.dependencies {
            // From generation 2 on, a rename `extra` gives wins.
            if let record = records[dependency], record.soname != record.originalSoname,
               nameGeneration == 1 || renames[record.originalSoname] == nil {
                renames[record.originalSoname] = record.soname
            }
        }
        return (original, soname, renames)
    }

    /// The bytes of a private image: the file's, with the renamed strings at their offsets.
    private struct ImageCopy {
        let source: ReadOnlyFile
        let patches: [DynamicStringPatch.Patch]

        /// Writes the copy to `fd`, in bounded chunks: the errors of reading and of writing, if any.
        func write(to fd: Int32) -> (read: ELFError?, write: Int32?) {
            var writeError: Int32?
            do {
                try source.forEachChunk { chunk in
                    if writeError == nil, !writeAll(fd, chunk, at: nil) { writeError = errno }
                }
            } catch {
                return (error, writeError)
            }
            for patch in patches where writeError == nil {
                if !patch.bytes.withUnsafeBytes({ writeAll(fd, $0, at: patch.fileOffset) }) { writeError = errno }
            }
            return (nil, writeError)
        }
    }

    /// `copy` in a sealed memory file, kept open; its path `/proc/PID/fd/N`, or nil when no
    /// memory file could be had or written (a kernel without them, out of memory).
    private func memoryImage(named name: String, _ copy: ImageCopy, of file: PluginFile) throws(LoadFailure) -> String? {
        let fd = modhost_memory_file(name)
        guard fd >= 0 else { return nil }
        let (readError, writeError) = copy.write(to: fd)
        if readError == nil, writeError == nil, modhost_seal_memory_file(fd) == 0 {
            let path = "/proc/\(getpid())/fd/\(fd)"
            memoryImages[path] = fd
            return path
        }
        close(fd)
        if let readError { throw unreadable(file, readError) }
        return nil
    }

    /// `copy` in a file of the images directory, written under a temporary name and renamed;
    /// its path.
    private func diskImage(named name: String, _ copy: ImageCopy, of file: PluginFile) throws(LoadFailure) -> String {
        /// A copy that could not be written: the state directory's fault, not the file's.
        func cannotWrite(_ path: String, _ code: Int32) -> LoadFailure {
            let room = code == ENOSPC || code == EDQUOT ? "free space in \(imagesDirectory)" : "make \(imagesDirectory) writable by the daemon's user"
            return LoadFailure(file: file.path, check: .privateCopy, problem: "cannot write \(path): \(SystemError.describe(code))",
                               fix: "\(room), then reload (modhostctl reload): the file is not tried again until it changes or a reload")
        }
        let target = imagesDirectory + "/" + name
        let temporary = target + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw cannotWrite(temporary, errno) }
        let written = copy.write(to: fd)
        let readError = written.read
        var writeError = written.write
        let closeError: Int32? = close(fd) == 0 ? nil : errno
        // A full disk may show only when the file is closed (delayed allocation).
        if writeError == nil, readError == nil { writeError = closeError }
        if let readError {
            unlink(temporary)
            throw unreadable(file, readError)
        }
        if let writeError {
            unlink(temporary)
            throw cannotWrite(target, writeError)
        }
        guard rename(temporary, target) == 0 else {
            let code = errno
            unlink(temporary)
            throw cannotWrite(target, code)
        }
        return target
    }

    /// `file` could not be read to make its private copy.
    private func unreadable(_ file: PluginFile, _ error: some Error) -> LoadFailure {
        LoadFailure(file: file.path, check: .fileType, problem: "cannot read the file to make a private copy: \(error)",
                    fix: "check the file is still there and readable")
    }

    /// The name generation the next image of plugin `name` gets: the next unused one when it
    /// is to be mapped in this process (refused past `nameGenerationLimit`), and 1 (its
    /// original names) when it runs in a worker, a process of its own.
    func nameGeneration(of name: String, path: String, inThisProcess: Bool) throws(LoadFailure) -> Int {
        guard inThisProcess else { return 1 }
        let next = (Self.namesMapped.withLock { $0[name] } ?? 0) + 1
        guard next <= nameGenerationLimit else {
            throw LoadFailure(file: path, check: .dependency,
                              problem: "plugin \(name) has been loaded \(next - 1) times in this process, the most it can tell apart",
                              fix: "restart the process (modhostd), or run the plugin isolated (docs/isolation.md), which has no such limit")
        }
        return next
    }
}

extension LoadFailure {
    /// The same failure reported against `path` (the file in the plugin directory rather
    /// than its private copy).
    func relocated(to path: String) -> LoadFailure {
        var copy = self
        copy.file = path
        return copy
    }
}

/// Writes all of `bytes` to `fd`, at `offset` (pwrite) or at the current position; false
/// with errno set when the system refuses.
private func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, at offset: UInt64?) -> Bool {
    var done = 0
    while done < bytes.count {
        let n = offset.map { pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t($0) + off_t(done)) }
            ?? write(fd, bytes.baseAddress! + done, bytes.count - done)
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { return false }
        done += n
    }
    return true
}
