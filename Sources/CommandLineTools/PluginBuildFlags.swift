import DaemonKit
import ModuleKit
import PluginFormat

/// The compiler and linker flags a plugin needs, for one SDK layout (`make install`'s
/// prefix or a checkout's `build/`): what `plugin.mk` passes and what `modhostctl flags`
/// prints for builds without make (CMake, SwiftPM, a shell script).
///
/// The flags are the host's requirements only: the SDK's header, module and library
/// paths, the plugin's module name and SONAME, `-z nodelete` and position-independent
/// shared output. Optimization and warnings are the author's choice.
struct PluginBuildFlags: Sendable {
    enum Language: String, Sendable { case swift, c }

    /// The SDK prefix: it holds `include/modulehost.h`, `lib/libModuleKit.so` and
    /// `lib/modulehost/swift/`.
    var sdk: String
    var plugin: String
    var language: Language

    /// Checks the plugin name against the name grammar and the SDK path against what a
    /// shell word and a make variable can carry unquoted.
    init(sdk: String, plugin: String, language: Language) throws(UsageError) {
        if let problem = PluginName.problem(plugin) { throw UsageError("the plugin name is \(problem)") }
        let unsafe = sdk.unicodeScalars.first { scalar in
            !(scalar.properties.isAlphabetic || ("0"..."9").contains(scalar) || "/._-+@%,:=".unicodeScalars.contains(scalar))
        }
        if let unsafe {
            throw UsageError("the SDK path \(JSONValue.escapingControlCharacters(sdk)) holds \(JSONValue.escapingControlCharacters(String(unsafe))), which a shell or make would split or expand; install ModuleHost under a plain path")
        }
        self.sdk = sdk.count > 1 && sdk.hasSuffix("/") ? String(sdk.dropLast()) : sdk
        self.plugin = plugin
        self.language = language
    }

    /// Flags for one compile-and-link step producing `libPLUGIN.so`.
    var arguments: [String] {
        switch language {
        case .c:
            // C11 with what glibc declares by default (strdup, which docs/calling.md has
            // results made with, is not in C11 itself); a call to a function nobody declared
            // is an error: C would take it for one returning int and cut a pointer result.
            return ["-std=c11", "-D_DEFAULT_SOURCE", "-Werror=implicit-function-declaration",
                    "-fPIC", "-shared", "-fvisibility=hidden", "-I", sdk + "/include",
                    "-Wl,-soname,lib\(plugin).so", "-Wl,-z,nodelete", "-Wl,-z,defs"]
        case .swift:
            // include/modulehost holds the C ABI's module map: the compiler needs it when it
            // builds ModuleKit from its .swiftinterface (an SDK from another compiler build).
            return ["-emit-library", "-parse-as-library", "-swift-version", "6",
                    "-module-name", plugin, "-module-link-name", plugin,
                    "-I", sdk + "/lib/modulehost/swift", "-I", sdk + "/include/modulehost",
                    "-L", sdk + "/lib", "-lModuleKit",
                    "-Xlinker", "-soname=lib\(plugin).so", "-Xlinker", "-z", "-Xlinker", "nodelete"]
        }
    }

    /// The SDK this `modhostctl` belongs to: the prefix its executable is installed under
    /// (`PREFIX/bin/modhostctl`), when that prefix holds the SDK library.
    static func defaultSDK() -> String? {
        guard let executable = FileSystem.executablePath else { return nil }
        let prefix = PathText.parent(of: PathText.parent(of: executable))
        return FileSystem.exists(prefix + "/lib/libModuleKit.so") ? prefix : nil
    }
}

extension ControlCommand {
    static let flagsHelp = """
        USAGE: modhostctl flags --swift|--c [--plugin NAME] [--prefix PREFIX]

        Prints, on one line, the compiler and linker flags a plugin named NAME (default
        MyPlugin) needs for one compile-and-link step into libNAME.so, as plugin.mk passes
        them: `swiftc $(modhostctl flags --swift --plugin NAME) -O -g *.swift -o libNAME.so`
        or `cc $(modhostctl flags --c --plugin NAME) -O2 -g *.c -o libNAME.so`. Then embed the
        manifest (docs/plugins.md, "Building without make"). PREFIX is where ModuleHost is
        installed (default: the prefix of this modhostctl).
        """

    /// The language (`--swift` or `--c`) and the SDK prefix (`--prefix`, else this
    /// modhostctl's) of `flags` and `new`, checked: `PluginBuildFlags` for `plugin`.
    /// Prints the error and returns nil when there is no usable SDK.
    func pluginBuild(_ command: String, plugin: String, _ parsed: Arguments) throws(UsageError) -> PluginBuildFlags? {
        let language: PluginBuildFlags.Language
        switch (parsed.has("swift"), parsed.has("c")) {
        case (true, false): language = .swift
        case (false, true): language = .c
        case (true, true): throw UsageError("\(command) takes one of --swift and --c, not both")
        case (false, false): throw UsageError("\(command) needs one of --swift and --c")
        }
        guard let sdk = parsed.value("prefix") ?? PluginBuildFlags.defaultSDK() else {
            output.err("Error: no SDK next to this modhostctl (no lib/libModuleKit.so under its prefix). Fix: pass --prefix PREFIX, the directory ModuleHost is installed in")
            return nil
        }
        guard FileSystem.exists(sdk + "/include/modulehost.h") else {
            output.err("Error: \(JSONValue.escapingControlCharacters(sdk)) holds no include/modulehost.h. Fix: pass --prefix, the prefix ModuleHost is installed in (or a checkout's build/)")
            return nil
        }
        return try PluginBuildFlags(sdk: sdk, plugin: plugin, language: language)
    }

    func flags(_ operands: [String], _ parsed: Arguments) throws -> ExitCode {
        guard operands.isEmpty else { throw UsageError("flags takes no operands") }
        guard let flags = try pluginBuild("flags", plugin: parsed.value("plugin") ?? "MyPlugin", parsed) else { return .failure }
        output.out(flags.arguments.joined(separator: " "))
        return .success
    }
}
