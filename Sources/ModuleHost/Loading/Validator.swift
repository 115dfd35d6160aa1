import DaemonKit
import Glibc
import ModuleKit
import PluginCall
import PluginFormat

/// The checks a plugin file must pass before the host lets `dlopen` touch it. None of
/// them runs code from the file.
public struct Validator: Sendable {
    /// Accept files and directories writable by others or owned by another user, with a
    /// warning (for development only).
    public var allowInsecure: Bool
    /// The SDK Swift plugins must match: the one given, else this process's
    /// (`HostSDK.current`, found when the first Swift plugin is checked).
    public var sdk: HostSDK {
        get { givenSDK ?? .current }
        set { givenSDK = newValue }
    }
    private var givenSDK: HostSDK?
    /// The user that may own plugin files besides root.
    public var trustedUID: uid_t

    public init(allowInsecure: Bool = false, sdk: HostSDK? = nil, trustedUID: uid_t = geteuid()) {
        self.allowInsecure = allowInsecure
        self.givenSDK = sdk
        self.trustedUID = trustedUID
    }

    /// Runs every check on one file in order and returns what the loader needs, or the
    /// first failure. `directory` is the plugin directory the file was found in (nil when
    /// the operator named the file directly): a symlink must not lead out of it.
    public func validate(_ path: String, in directory: String? = nil) throws(LoadFailure) -> PluginFile {
        try validate(path, in: directory, directoryStatus: directory.flatMap(Self.status(of:)))
    }

    /// The `stat` of a plugin directory, taken once for all its files.
    static func status(of directory: String) -> stat? {
        var status = stat()
        return stat(directory, &status) == 0 ? status : nil
    }

    /// The entry symbol, and what only a copy of ModuleKit defines, as `.dynsym` holds them.
    static let entrySymbol = ELFImage.SymbolNames([MODHOST_ENTRY_SYMBOL])
    static let sdkSymbolPrefixes = ELFImage.SymbolNames(["$s9ModuleKit", "modhost_abi_compatible"])

    func validate(_ path: String, in directory: String?, directoryStatus: stat?) throws(LoadFailure) -> PluginFile {
        try validateReading(path, in: directory, directoryStatus: directoryStatus).file
    }

    /// How a check of `validate` reports a refusal of the file it checks.
    typealias Fail = (LoadFailure.Check, String, String) -> LoadFailure

    /// `validate`, also returning the open file the checks read, for callers that need the
    /// file's contents (the daemon hashes and copies them) from the very file validated.
    /// The checks read only the headers and tables they need, never the whole file.
    func validateReading(_ path: String, in directory: String?, directoryStatus: stat?) throws(LoadFailure) -> (file: PluginFile, contents: ReadOnlyFile) {
        func fail(_ check: LoadFailure.Check, _ problem: String, _ fix: String) -> LoadFailure {
            LoadFailure(file: path, check: check, problem: problem, fix: fix)
        }
        let (resolved, contents) = try open(path, in: directory, fail)
        var warnings: [String] = []
        try checkOwnership(resolved, contents.status, &warnings, fail)
        if let directory, let directoryStatus {
            try checkOwnership(directory, directoryStatus, &warnings, fail)
            try checkPath(of: directory, &warnings, fail)
        }
        let image = try checkStructure(contents, fail)
        let manifest = try readManifest(image, fail)
        let dynamic = try checkLinkage(image, manifest, fail)
        return (PluginFile(path: path, resolvedPath: resolved, manifest: manifest, dynamic: dynamic, warnings: warnings), contents)
    }

    /// File type and location: the regular file at `path`, opened without following a
    /// symlink, or the one a symlink leads to inside `directory`; with its real path.
    private func open(_ path: String, in directory: String?, _ fail: Fail) throws(LoadFailure) -> (resolved: String, contents: ReadOnlyFile) {
        // One open that does not follow a symlink answers both.
        var resolved = path
        let contents: ReadOnlyFile
        func unreadable(_ error: ELFError) -> LoadFailure {
            fail(.fileType, "\(error)", "check the path exists and is readable")
        }
        do {
            contents = try ReadOnlyFile.opening(path, followSymlinks: false)
        } catch .cannotRead(_, ELOOP) {
            guard let target = realPath(path) else {
                let loop = errno == ELOOP
                let target = FileSystem.symlinkTarget(path).map { " (to \($0))" } ?? ""
                throw fail(.location, "\(loop ? "symlinks lead in a loop, or through more than 40 links" : "symlink leads nowhere")\(target)",
                           "point the symlink at an existing plugin file or remove it")
            }
            resolved = target
            // A link to the directory itself is not out of it: it is refused as a directory.
            if let directory, let base = realPath(directory), !target.hasPrefix(base + "/"), target != base {
                throw fail(.location, "symlink leads out of the plugin directory \(base) to \(target)",
                           "copy the plugin into the directory instead of linking to it")
            }
            do {
                contents = try ReadOnlyFile.opening(target, followSymlinks: true)
            } catch {
                throw unreadable(error)
            }
        } catch {
            throw unreadable(error)
        }
        let file = contents.status
        guard file.st_mode & S_IFMT == S_IFREG else {
            throw fail(.fileType, "not a regular file (\(fileTypeName(file.st_mode)))",
                       "plugin directories may only hold plugin .so files")
        }
        return (resolved, contents)
    }

    /// Ownership and permissions (sudo/sshd style) of a plugin file or its directory:
    /// refused, or accepted with a warning under `allowInsecure`.
    private func checkOwnership(_ what: String, _ status: stat, _ warnings: inout [String], _ fail: Fail) throws(LoadFailure) {
        let problems = FileSystem.trustProblems(status, trustedUID: trustedUID)
        guard !problems.isEmpty else { return }
        let problem = problems.map { "\(what) is \($0)" }.joined(separator: "; ")
        if !allowInsecure {
            throw fail(.permissions, problem,
                       "chmod go-w and chown root (or the daemon's user); --allow-insecure-plugins accepts it for development")
        }
        warnings.append("insecure plugin accepted because of --allow-insecure-plugins: \(problem)")
    }

    /// Every component of the path to plugin directory `directory`, as sshd and sudo check
    /// the path to what they trust: refused, or accepted with a warning under
    /// `allowInsecure`, when one is not held by root or the trusted uid alone
    /// (`pathProblem`).
    private func checkPath(of directory: String, _ warnings: inout [String], _ fail: Fail) throws(LoadFailure) {
        guard let problem = Self.pathProblem(directory, trustedUID: trustedUID) else { return }
        if !allowInsecure {
            throw fail(.permissions, "on the path to plugin directory \(directory), \(problem)",
                       "make every directory and link on the path owned by root (or the daemon's user) and writable by no one else, or name the real directory; --allow-insecure-plugins accepts it for development")
        }
        warnings.append("insecure plugin accepted because of --allow-insecure-plugins: on the path to plugin directory \(directory), \(problem)")
    }

    /// What lets another user change what `directory` (absolute, or relative to the working
    /// directory) leads to, walking its path from the root and following its symlinks: a
    /// component owned by neither root nor `trustedUID` (a link included: it could be made
    /// to lead anywhere), or a directory writable by group or others without the sticky bit
    /// (they could rename what it holds; a sticky one, such as /tmp, lets them remove or
    /// rename only what they own, and its entries are checked in turn). Nil when nothing
    /// does; a component that does not exist is left to the listing, which says so.
    static func pathProblem(_ directory: String, trustedUID: uid_t) -> String? {
        var pending = directory.hasPrefix("/") ? [] : FileSystem.currentDirectory.split(separator: "/").map(String.init)
        pending += directory.split(separator: "/").map(String.init)
        var resolved: [String] = []
        var links = 0
        func check(_ path: String, _ status: stat) -> String? {
            FileSystem.trustProblems(status, trustedUID: trustedUID, stickyAllowed: true).first.map { "\(path) is \($0)" }
        }
        var root = stat()
        if lstat("/", &root) == 0, let problem = check("/", root) { return problem }
        while !pending.isEmpty {
            let name = pending.removeFirst()
            if name.isEmpty || name == "." { continue }
            if name == ".." {
                _ = resolved.popLast()
                continue
            }
            let path = "/" + (resolved + [name]).joined(separator: "/")
            var status = stat()
            guard lstat(path, &status) == 0 else { return nil }
            if let problem = check(path, status) { return problem }
            guard status.st_mode & S_IFMT == S_IFLNK else {
                resolved.append(name)
                continue
            }
            links += 1
            guard links <= 40, let target = FileSystem.symlinkTarget(path) else {
                return "\(path) is a symlink that cannot be followed"
            }
            if target.hasPrefix("/") { resolved = [] }
            pending = target.split(separator: "/").map(String.init) + pending
        }
        return nil
    }

    /// Size, then ELF structure: a shared object for this machine whose segments and
    /// sections lie in the file and that the dynamic loader can map without reading outside it.
    private func checkStructure(_ contents: ReadOnlyFile, _ fail: Fail) throws(LoadFailure) -> ELFImage {
        let image: ELFImage
        do {
            image = try ELFImage(file: contents)
        } catch .tooLarge(_, let size, let limit) {
            throw fail(.fileSize, "the file is \(size) bytes, plugins may be at most \(limit) bytes",
                       "check this is a plugin built with plugin.mk; plugin files are a few MiB at most")
        } catch {
            throw fail(.elf, error.description, "deploy a shared object built with plugin.mk; a half-copied file is retried when it changes")
        }
        guard image.machine == ELFImage.hostMachine else {
            throw fail(.machine, "built for ELF machine \(image.machine), this host is \(ELFImage.hostMachine)",
                       "build the plugin for this architecture")
        }
        guard image.fileType == ELFImage.typeSharedObject, !image.isExecutable else {
            let found = image.fileType == ELFImage.typeSharedObject
                ? "a position-independent executable"
                : "ELF type \(image.fileType)\(image.fileType == 2 ? " (an executable)" : image.fileType == 1 ? " (an object file)" : "")"
            throw fail(.elf, "\(found), expected a shared object (ET_DYN without an interpreter)",
                       "build with -shared (plugin.mk does)")
        }
        if let (index, end) = image.loadSegmentPastEnd {
            throw fail(.segments, "loadable segment \(index) ends at byte \(end) but the file has \(image.fileSize) bytes (truncated copy)",
                       "copy the complete file again, by writing to a temporary name and renaming it")
        }
        if let error = image.sectionError {
            throw fail(.elf, error.description, "rebuild the plugin with plugin.mk; a half-copied file is retried when it changes")
        }
        // What dlopen would follow out of the image (it would crash the process).
        let outside: String?
        do {
            outside = try image.loaderAddressProblem()
        } catch {
            throw fail(.segments, error.description, "copy the complete file again, by writing to a temporary name and renaming it")
        }
        if let outside {
            throw fail(.segments, outside, "rebuild the plugin with plugin.mk; the dynamic loader would crash on this file")
        }
        return image
    }

    /// The manifest, its ABI, what a Swift plugin was built with, and no unknown field.
    private func readManifest(_ image: ELFImage, _ fail: Fail) throws(LoadFailure) -> Manifest {
        let manifest: Manifest
        do {
            guard let bytes = try image.manifestContents() else {
                throw fail(.manifest, "no \(MODHOST_MANIFEST_SECTION) section",
                           "build the plugin with plugin.mk, which embeds the manifest")
            }
            manifest = try Manifest.parse(bytes)
        } catch let error as LoadFailure {
            throw error
        } catch ELFError.tooLarge(let what, let size, let limit) {
            throw fail(.manifestSize, "the \(what) is \(size) bytes, manifests may be at most \(limit) bytes",
                       "keep plugin.json small (long texts belong in the plugin's documentation) and rebuild with plugin.mk")
        } catch let error as ManifestError {
            throw fail(.manifest, "manifest is garbled: \(error.reason)", "correct plugin.json and rebuild with plugin.mk")
        } catch {
            throw fail(.manifest, "manifest cannot be read: \(error)", "rebuild the plugin with plugin.mk")
        }

        // ABI.
        let abi = manifest.abiVersion!
        if abi.major != HostSDK.abiMajor || abi.minor > HostSDK.abiMinor {
            throw fail(.abi, "plugin \(manifest.name) was built for ABI \(manifest.abi), this host provides ABI \(HostSDK.abiMajor).\(HostSDK.abiMinor)",
                       abi.major != HostSDK.abiMajor
                        ? "rebuild the plugin against this host's modulehost.h"
                        : "upgrade the host, or rebuild the plugin against ABI \(HostSDK.abiMajor).\(HostSDK.abiMinor)")
        }

        // What a Swift plugin was built against and with.
        if manifest.language == .swift {
            try checkToolchain(manifest, fail)
        }
        // Fields no manifest has: a typo in plugin.json (e.g. "dependecies") would otherwise
        // drop what the author meant. After the ABI check, which names a newer plugin's cause.
        if let unknown = manifest.unknownField {
            throw fail(.manifest, "the manifest has an \(unknown.problem)", unknown.fix(in: "plugin.json") + " and rebuild with plugin.mk")
        }
        return manifest
    }

    /// ModuleKit linkage, and the symbols the loader will look up: one pass over the
    /// dynamic symbol table answers both.
    private func checkLinkage(_ image: ELFImage, _ manifest: Manifest, _ fail: Fail) throws(LoadFailure) -> DynamicInfo {
        let dynamic: DynamicInfo
        let symbols: (facts: [ELFImage.SymbolFacts?], defined: [String])
        do {
            dynamic = try image.dynamicInfo()
            symbols = try image.dynamicSymbols(
                named: manifest.exports.isEmpty ? Self.entrySymbol : ELFImage.SymbolNames([MODHOST_ENTRY_SYMBOL] + manifest.exports.map(\.name)),
                definedWithPrefixes: Self.sdkSymbolPrefixes)
        } catch {
            throw fail(.elf, error.description, "rebuild the plugin with plugin.mk")
        }
        let ownSDK = symbols.defined
        if !ownSDK.isEmpty {
            throw fail(.sdkLinkage, "the file carries its own copy of ModuleKit (defines \(ownSDK.count) ModuleKit symbols, e.g. \(ownSDK[0]))",
                       "link against the shared libModuleKit.so (-lModuleKit, as plugin.mk does), never statically")
        }
        if let other = dynamic.needed.first(where: { $0.contains("libModuleKit") && $0 != "libModuleKit.so" }) {
            throw fail(.sdkLinkage, "links ModuleKit as \(other), the host provides libModuleKit.so",
                       "link with -lModuleKit against the host's SDK (plugin.mk does)")
        }
        if manifest.language == .swift {
            guard dynamic.needed.contains("libModuleKit.so") else {
                throw fail(.sdkLinkage, "a Swift plugin that does not link libModuleKit.so",
                           "link with -lModuleKit (plugin.mk does)")
            }
        }
        try checkSymbols(image, manifest, symbols.facts, fail)
        return dynamic
    }
}

extension Validator {
    /// The symbol checks of `validate` on a freshly built, not yet stamped plugin file,
    /// against the manifest it will carry (`modhostctl manifest --library`, which plugin.mk
    /// runs): so that `make` stops on what the daemon would refuse for the file's symbols
    /// (entry point, exports, signatures) rather than leaving the author a file it refuses.
    public func checkSymbols(ofBuiltLibrary path: String, manifest: Manifest) throws(LoadFailure) {
        func fail(_ check: LoadFailure.Check, _ problem: String, _ fix: String) -> LoadFailure {
            LoadFailure(file: path, check: check, problem: problem, fix: fix)
        }
        let image: ELFImage
        let facts: [ELFImage.SymbolFacts?]
        do {
            image = try ELFImage(path: path)
            facts = try image.dynamicSymbols(named: ELFImage.SymbolNames([MODHOST_ENTRY_SYMBOL] + manifest.exports.map(\.name)),
                                             definedWithPrefixes: ELFImage.SymbolNames([])).facts
        } catch {
            throw fail(.elf, error.description, "rebuild the plugin")
        }
        try checkSymbols(image, manifest, facts, fail)
    }

    /// The symbols the loader will look up, read from the dynamic symbol table without
    /// loading the file: the entry symbol and every declared export must be defined in the
    /// file itself, global, with default (or protected) visibility (what `dlsym` finds), and each export
    /// must be a function with a name and a signature of the grammar (docs/calling.md).
    /// A symbol missing from `.dynsym` but present in `.symtab` is named as hidden.
    ///
    /// `facts` are `.dynsym`'s facts (`ELFImage.dynamicSymbols(named:)`) of the entry symbol
    /// and then of each of the manifest's exports, in its order.
    func checkSymbols(_ image: ELFImage, _ manifest: Manifest, _ facts: [ELFImage.SymbolFacts?],
                      _ fail: Fail) throws(LoadFailure) {
        let exports: [(name: String, signature: Signature)]
        do {
            exports = try SymbolOwnership.parseExports(manifest.exports, plugin: manifest.name)
        } catch {
            throw fail(.exports, "\(error)", "correct the export in plugin.json (the name is the C symbol, the signature follows docs/calling.md) and rebuild")
        }
        // parseExports keeps the manifest's names and order, and refuses a name given twice.
        func dynamicFacts(_ name: String) -> ELFImage.SymbolFacts? {
            if name == MODHOST_ENTRY_SYMBOL { return facts[0] }
            return exports.firstIndex { $0.name == name }.flatMap { facts[$0 + 1] }
        }
        // Only asked when something is missing: a non-stripped file says whether it is hidden.
        var all: [String: ELFImage.SymbolFacts]?
        func whyNotExported(_ name: String) -> String? {
            if let facts = dynamicFacts(name) { return facts.isExported ? nil : "it is \(facts.summary)" }
            if all == nil { all = (try? image.symbols(named: Set([MODHOST_ENTRY_SYMBOL] + exports.map(\.name)), in: ".symtab")) ?? [:] }
            if let facts = all?[name], facts.defined { return "it is defined but hidden: \(facts.summary), not in the dynamic symbol table" }
            return nil
        }
        if let facts = facts[0], !facts.defined {
            throw LoadFailure.entryForeign(image.path, owner: "another file (this one only refers to it)").at(fail)
        }
        if facts[0]?.isExported != true {
            throw LoadFailure.entryMissing(image.path, detail: whyNotExported(MODHOST_ENTRY_SYMBOL)).at(fail)
        }
        for (index, export) in exports.enumerated() {
            let facts = facts[index + 1]
            if facts?.isExported == true, let facts, facts.type != ELFImage.SymbolFacts.typeFunction, facts.type != 10 /* STT_GNU_IFUNC */ {
                throw fail(.exports, "declared export \(export.name) is \(facts.summary), not a function",
                           "export a function named \(export.name), or remove it from plugin.json's exports")
            }
            guard facts?.isExported != true else { continue }
            let why = facts.map { $0.defined ? "it is \($0.summary)" : "the file only refers to it (defined in another file)" }
                ?? whyNotExported(export.name) ?? "the file does not define it"
            throw fail(.exports, "declared export \(export.name) is not exported by this file: \(why)",
                       Self.exportFix(export.name, language: manifest.language))
        }
    }
}

extension Validator {
    /// How to export `name` so that the host finds it, in the plugin's language: in C,
    /// `MODHOST_EXPORT` (plugin.mk compiles with -fvisibility=hidden, which hides an
    /// unmarked function); in Swift, a top-level `@_cdecl` public function.
    public static func exportFix(_ name: String, language: Manifest.Language) -> String {
        let name = JSONValue.escapingControlCharacters(name)
        switch language {
        case .c:
            return "define it with MODHOST_EXPORT from modulehost.h (`MODHOST_EXPORT int32_t \(name)(...) { ... }`), "
                + "which keeps it visible under plugin.mk's -fvisibility=hidden; or remove it from plugin.json's exports"
        case .swift:
            return "define it as `@_cdecl(\"\(name)\") public func ...` at the top level of a plugin source; or remove it from plugin.json's exports"
        }
    }
}

extension LoadFailure {
    /// This refusal made by `fail` (for the file the validator was given).
    fileprivate func at(_ fail: Validator.Fail) -> LoadFailure {
        fail(check, problem, fix)
    }
}

extension Validator {
    /// The compatibility rule for Swift plugins (docs/abi.md, "Swift plugin
    /// compatibility"): the ModuleKit the plugin was built against has this host's major
    /// and a minor at most this host's, and its compiler this host's major.minor.
    func checkToolchain(_ manifest: Manifest, _ fail: Fail) throws(LoadFailure) {
        // The manifest check made sure both versions parse.
        let toolchain = manifest.toolchain!
        let plugin = toolchain.moduleKitVersion!, host = sdk.moduleKitVersion
        if plugin.major != host.major {
            throw fail(.moduleKit, "plugin \(manifest.name) was built against ModuleKit \(toolchain.moduleKit), this host runs ModuleKit \(sdk.moduleKit)",
                       plugin.major < host.major
                        ? "rebuild the plugin against this host's SDK (ModuleKit \(host.major).x changed the binary interface)"
                        : "upgrade the host to ModuleKit \(plugin.major).x, or rebuild the plugin against this host's SDK")
        }
        if plugin.minor > host.minor {
            throw fail(.moduleKit, "plugin \(manifest.name) was built against ModuleKit \(toolchain.moduleKit), newer than this host's ModuleKit \(sdk.moduleKit)",
                       "upgrade the host to ModuleKit \(toolchain.moduleKit) or later, or rebuild the plugin against this host's SDK")
        }
        let compiler = toolchain.compilerVersion!
        if compiler != sdk.compilerVersion {
            throw fail(.toolchain, "plugin \(manifest.name) was compiled by Swift \(compiler) (\(toolchain.swift)), this host's ModuleKit by Swift \(sdk.compilerVersion)",
                       "rebuild the plugin with a Swift \(sdk.compilerVersion) toolchain against this host's SDK")
        }
    }
}

private func fileTypeName(_ mode: mode_t) -> String {
    switch mode & S_IFMT {
    case S_IFDIR: "a directory"
    case S_IFLNK: "a symlink"
    case S_IFIFO: "a FIFO"
    case S_IFSOCK: "a socket"
    case S_IFCHR, S_IFBLK: "a device"
    default: "not a regular file"
    }
}
