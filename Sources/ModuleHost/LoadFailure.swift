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
    }

    /// The plugin file, as found in the plugin directory.
    public var file: String
    public var check: Check
    /// What was found, against what was expected.
    public var problem: String
    /// What the operator or plugin author should do.
    public var fix: String

    public init(file: String, check: Check, problem: String, fix: String) {
        self.file = file
        self.check = check
        self.problem = problem
        self.fix = fix
    }

    public var description: String { "\(file): \(check.rawValue) check failed: \(problem). Fix: \(fix)" }

    /// The refusal of `file` for a name `NameClaims` refuses (check `duplicate`).
    public init(file: String, conflict: NameConflict) {
        self.init(file: file, check: .duplicate, problem: conflict.problem, fix: conflict.fix)
    }
}
