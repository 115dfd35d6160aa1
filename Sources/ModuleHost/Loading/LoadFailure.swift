import ModuleKit
import PluginFormat

/// Why a plugin file was refused: one line naming the file, the check that failed, what
/// was found against what was expected, and the fix.
public struct LoadFailure: Error, Sendable, Equatable, CustomStringConvertible {
    /// The checks, in the order the host runs them.
    public enum Check: String, Sendable, Codable, CaseIterable {
        case fileType = "file type"
        case location
        case permissions
        case fileSize = "file size"
        case elf = "ELF format"
        case machine
        case segments = "loadable segments"
        case manifestSize = "manifest size"
        case manifest
        case abi = "ABI version"
        case moduleKit = "ModuleKit version"
        case toolchain = "Swift toolchain"
        case sdkLinkage = "ModuleKit linkage"
        case duplicate = "duplicate name"
        case dependency
        case cycle = "dependency cycle"
        case dlopen
        case entrySymbol = "entry symbol"
        case descriptor
        case exports
        /// An isolated plugin's worker could not be started or did not get ready.
        case isolation
        case module
        case crashGuard = "crash guard"
        /// The daemon could not make its private copy of the file (its state directory is
        /// full or not writable): nothing is wrong with the file.
        case privateCopy = "private copy"
    }

    /// The plugin file, as found in the plugin directory.
    public var file: String
    public var check: Check
    /// What was found, against what was expected.
    public var problem: String
    /// What the operator or plugin author should do.
    public var fix: String
    /// Set when the file crashed or hung a trial load: how the trial ended (`signal 11
    /// (Segmentation fault)`, or `timeout`). Such a refusal is kept in the crash guard's
    /// records like a crash of the daemon, so that a start, which loads without a trial,
    /// refuses the file too.
    public var trialEnding: String?

    public init(file: String, check: Check, problem: String, fix: String, trialEnding: String? = nil) {
        self.file = file
        self.check = check
        self.problem = problem
        self.fix = fix
        self.trialEnding = trialEnding
    }

    public var description: String { "\(file): \(check.rawValue) check failed: \(problem). Fix: \(fix)" }

    /// The refusal of `file` for a name `NameClaims` refuses (check `duplicate`).
    public init(file: String, conflict: NameConflict) {
        self.init(file: file, check: .duplicate, problem: conflict.problem, fix: conflict.fix)
    }
}

/// The refusals both the validator (reading the file), the loader (after `dlopen`) and the
/// trial loader (in a child process) can give, built in one place so that each cause has
/// one problem text and one fix wherever it is found.
extension LoadFailure {
    /// How a plugin declares its entry point, in C and in Swift.
    static let entryDeclaration =
        "declare the entry point in the plugin: MODHOST_PLUGIN_ENTRY { return &plugin; } in C (from modulehost.h), "
        + "or @_cdecl(\"\(MODHOST_ENTRY_SYMBOL)\") public func modhostPluginEntry() -> UnsafeRawPointer? { PluginExport.plugin(...) } in Swift"

    /// The file does not export the entry symbol; `detail` says what it has instead.
    static func entryMissing(_ file: String, detail: String? = nil) -> LoadFailure {
        LoadFailure(file: file, check: .entrySymbol,
                    problem: "the file does not export \(MODHOST_ENTRY_SYMBOL)" + (detail.map { " (\($0))" } ?? ""),
                    fix: entryDeclaration)
    }

    /// The entry symbol the loader found belongs to another file (`owner`, nil: to no file).
    static func entryForeign(_ file: String, owner: String?) -> LoadFailure {
        LoadFailure(file: file, check: .entrySymbol,
                    problem: owner.map { "\(MODHOST_ENTRY_SYMBOL) resolves from \($0), not from this file" }
                        ?? "\(MODHOST_ENTRY_SYMBOL) resolves to an address in no loaded object, not in this file",
                    fix: "define the entry point in this plugin itself: " + entryDeclaration)
    }

    /// `plugin` (in `file`) needs `dependency`, which was refused by check `check`: the one
    /// wording of the daemon's load, its dependency order and `modhostctl verify`.
    public static func dependencyRefused(_ file: String, plugin: String, dependency: String, check: Check) -> LoadFailure {
        LoadFailure(file: file, check: .dependency, problem: "plugin \(plugin) needs \(dependency), which was refused (\(check.rawValue))",
                    fix: "fix plugin \(dependency) first")
    }

    /// The entry function returned NULL.
    static func entryReturnedNull(_ file: String) -> LoadFailure {
        LoadFailure(file: file, check: .descriptor, problem: "\(MODHOST_ENTRY_SYMBOL) returned NULL",
                    fix: "return the plugin descriptor from the entry function")
    }

    /// `dlopen` refused the file with `message` (dlerror's text).
    static func dlopenFailed(_ file: String, message: String) -> LoadFailure {
        let fix = message.contains("undefined symbol")
            ? "link the library that defines the symbol (or define it in the plugin), or rebuild the plugin against this host's SDK"
            : message.contains("Too many open files")
            ? "raise the open-files limit (for an isolated plugin, its limits.openFiles in modhostd's configuration; else modhostd's LimitNOFILE)"
            : message.contains("Cannot allocate memory") || message.contains("failed to map")
            ? "raise the address-space limit (for an isolated plugin, its limits.addressSpaceBytes in modhostd's configuration)"
            : message.contains("cannot open shared object") ? "install the missing library or the plugin it depends on"
            : "rebuild the plugin with plugin.mk"
        return LoadFailure(file: file, check: .dlopen, problem: "dlopen failed: \(message)", fix: fix)
    }

    /// The descriptor names another plugin than the manifest.
    static func descriptorNamesAnotherPlugin(_ file: String, described: String, manifest: String) -> LoadFailure {
        LoadFailure(file: file, check: .descriptor,
                    problem: "the entry symbol describes plugin \(described), the manifest says \(manifest)",
                    fix: "use the same name in the code and in plugin.json")
    }

    /// The descriptor's modules differ from the manifest's.
    static func modulesDiffer(_ file: String, described: [String], manifest: [String]) -> LoadFailure {
        LoadFailure(file: file, check: .descriptor,
                    problem: "the entry symbol describes modules [\(described.joined(separator: ", "))], the manifest lists [\(manifest.joined(separator: ", "))]",
                    fix: "list the same modules, in the same order, in plugin.json's \"modules\"")
    }
}
