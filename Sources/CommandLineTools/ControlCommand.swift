import ControlProtocol
import DaemonKit
import ModuleHost
import ModuleKit
import PluginFormat

/// `modhostctl`: inspects plugin files and controls a running modhostd.
public struct ControlCommand: Sendable {
    public static let usage = "modhostctl [--json] [--socket PATH] [--timeout SECONDS] <command> [arguments]"

    public static let help = """
        OVERVIEW: Inspect ModuleHost plugin files and control a running modhostd.

        USAGE: \(usage)

        COMMANDS:
          list                      List modules and refused plugin files, like lsmod
          status                    Show the daemon's counters and paths
          version                   Show this tool's and the daemon's release, ABI and compiler
          metrics                   Print the daemon's metrics for Prometheus (text exposition format)
          info                      Show every running module's name, version and metadata
          enable NAME               Enable a module at run time
          disable NAME              Disable a module at run time
          reload                    Re-read the configuration and rescan the plugin directories (as SIGHUP)
          send EVENT [--payload JSON] [--to NAME] [--await]
                                    Send an event directly to every module, or to one
          post NAME [--payload JSON]
                                    Post a notification to the modules that listen to it
          call PLUGIN FUNCTION ARG...
                                    Call a function a loaded plugin exports and print its result
          inspect FILE              Print a plugin's manifest and validation verdict, without loading it
          verify [--load] [--with DIR] DIR|FILE...
                                    Check plugin files as modhostd would, without loading them
                                    (--load: also trial-load each in a child process); exit 1 if any is refused
          manifest [options] FILE   Complete and check a plugin.json (used by plugin.mk)
          new --swift|--c NAME [--dir DIR]
                                    Write a plugin directory that builds, verifies and loads as is
          flags --swift|--c [--plugin NAME]
                                    Print the compiler and linker flags a plugin needs (builds without make)

        OPTIONS:
          --json                    Print JSON instead of text
          --socket PATH             The daemon's control socket (default: $MODHOST_SOCKET, else \(RuntimePaths().socketPath))
          --timeout SECONDS         How long to wait for the daemon's reply (0.001 to 86400; default: 30)
          --allow-insecure-plugins  Report insecure permissions as warnings, as modhostd would with it
          --version                 Print the release, the C ABI, ModuleKit's version and the
                                    Swift compiler, and exit
          -h, --help                Show help information

        EXIT CODES:
          0 success, 1 a plugin was refused, the daemon refused the request, or new found its
          directory not empty, 64 usage error,
          65 invalid input data, 69 modhostd not reachable (not running, or another socket),
          77 the process on the socket runs as another user than root or you (not trusted)

        See 'modhostctl <command> --help' for a command's options.
        """

    let output: any CommandOutput

    public init(output: any CommandOutput = StandardStreams()) { self.output = output }

    /// Runs this process's command line and returns the exit code; an argument that is
    /// not UTF-8 is a usage error giving the offset of its first bad byte.
    public func runProcessArguments() async -> ExitCode {
        await run { () throws(UsageError) in try processArguments() }
    }

    /// Runs the command line (without the program name) and returns the exit code.
    public func run(_ arguments: [String]) async -> ExitCode {
        await run { arguments }
    }

    private func run(_ arguments: () throws(UsageError) -> [String]) async -> ExitCode {
        do {
            return try await dispatch(try arguments())
        } catch let error as UsageError {
            output.err("Error: \(error.message)\nUsage: \(Self.usage)\nSee 'modhostctl --help'.")
            return .usage
        } catch {
            output.err("Error: \(error)")
            return .failure
        }
    }

    private func dispatch(_ arguments: [String]) async throws -> ExitCode {
        let valueOptions: Set<String> = ["language", "sdk", "library", "swift-version", "socket", "timeout", "payload", "to",
                                          "plugin", "prefix", "dir", "with"]
        // After `call`, "-5" and "-inf" are the function's arguments, not options.
        let parsed = try Arguments(arguments, valueOptions: valueOptions,
                                   flagOptions: ["json", "allow-insecure-plugins", "await", "swift", "c", "load", "version"],
                                   dashWordsArePositional: { $0.first == "call" })
        guard let command = parsed.positionals.first else {
            if parsed.has("help") { output.out(Self.help); return .success }
            if parsed.has("version") { output.out(HostSDK.versionLine("modhostctl")); return .success }
            throw UsageError("missing command")
        }
        let operands = Array(parsed.positionals.dropFirst())
        let json = parsed.has("json")
        let validator = Validator(allowInsecure: parsed.has("allow-insecure-plugins"))
        switch command {
        case "inspect":
            if parsed.has("help") { output.out("USAGE: modhostctl inspect [--json] FILE\n\nPrints the embedded manifest and the validation verdict without running plugin code."); return .success }
            guard operands.count == 1 else { throw UsageError("inspect takes exactly one FILE") }
            return inspect(operands[0], validator: validator, json: json)
        case "verify":
            if parsed.has("help") { output.out(Self.verifyHelp); return .success }
            guard !operands.isEmpty else { throw UsageError("verify needs at least one DIR or FILE") }
            return await verify(operands, with: parsed.values["with"] ?? [], load: parsed.has("load"), validator: validator, json: json)
        case "manifest":
            if parsed.has("help") { output.out("USAGE: modhostctl manifest --language swift|c [--sdk LIBMODULEKIT] [--swift-version TEXT] [--library FILE] plugin.json\n\nPrints the manifest plugin.mk embeds: plugin.json completed with the ABI version, the language and, for Swift, the compiler and the ModuleKit version of LIBMODULEKIT (default: the libModuleKit.so of this modhostctl's prefix). With --library, the built plugin FILE must export every function plugin.json lists in \"exports\"."); return .success }
            guard operands.count == 1 else { throw UsageError("manifest takes exactly one plugin.json") }
            return try manifest(operands[0], parsed)
        case "new":
            if parsed.has("help") { output.out(Self.newHelp); return .success }
            return try newPlugin(operands, parsed)
        case "flags":
            if parsed.has("help") { output.out(Self.flagsHelp); return .success }
            return try flags(operands, parsed)
        case _ where Self.daemonCommands.contains(command):
            return try await daemonCommand(command, operands, parsed)
        default:
            throw UsageError("unknown command \(shownArgument(command))")
        }
    }

    // MARK: inspect and verify

    struct Verdict: Codable {
        var file: String
        var valid: Bool
        var check: String?
        var problem: String?
        var fix: String?
        var warnings: [String]
        var manifest: Manifest?
    }

    func verdict(_ path: String, directory: String?, validator: Validator) -> Verdict {
        do {
            let file = try validator.validate(path, in: directory)
            return Verdict(file: path, valid: true, warnings: file.warnings, manifest: file.manifest)
        } catch {
            return refusedVerdict(error)
        }
    }

    /// A refused file's verdict, with whatever manifest can still be read from it.
    func refusedVerdict(_ failure: LoadFailure) -> Verdict {
        let manifest = Manifest.embedded(in: failure.file)
        return Verdict(file: failure.file, valid: false, check: failure.check.rawValue, problem: failure.problem, fix: failure.fix,
                       warnings: [], manifest: manifest)
    }

    func inspect(_ path: String, validator: Validator, json: Bool) -> ExitCode {
        let result = verdict(path, directory: nil, validator: validator)
        if json {
            output.out(encodeJSON(result))
        } else {
            if let manifest = result.manifest {
                var lines = [
                    "file:         \(shown(path))",
                    "name:         \(shown(manifest.name))",
                    "version:      \(shown(manifest.version))",
                    "description:  \(shown(manifest.description))",
                    "language:     \(manifest.language.rawValue)",
                    "abi:          \(shown(manifest.abi))",
                    "order:        \(manifest.order)",
                    "modules:      \(shown(manifest.modules.joined(separator: ", ")))",
                    "dependencies: \(manifest.dependencies.isEmpty ? "none" : shown(manifest.dependencies.joined(separator: ", ")))",
                    "isolation:    \(manifest.isolation.map(shown) ?? "not set (the daemon's configuration decides)")",
                ]
                if let toolchain = manifest.toolchain {
                    lines.append("toolchain:    \(shown(toolchain.swift))")
                    lines.append("modulekit:    \(shown(toolchain.moduleKit))")
                }
                lines.append("exports:      \(manifest.exports.isEmpty ? "none" : "")")
                lines += manifest.exports.map { "  \(shown($0.name)): \(shown($0.signature))" }
                output.out(lines.joined(separator: "\n"))
            } else {
                output.out("file:         \(shown(path))\nmanifest:     unreadable")
            }
            for warning in result.warnings { output.out("warning:      \(shown(warning))") }
            if result.valid {
                output.out("verdict:      valid")
            } else {
                output.out("verdict:      refused by the \(result.check!) check: \(shown(result.problem!))\nfix:          \(shown(result.fix!))")
            }
        }
        return result.valid ? .success : .failure
    }

    static let verifyHelp = """
        USAGE: modhostctl verify [--json] [--allow-insecure-plugins] [--load] [--with DIR]... DIR|FILE...

        Checks every plugin file of the DIRs and every FILE as modhostd would before loading it,
        without running plugin code: the file, its manifest, the entry symbol and every declared
        export in its dynamic symbol table, names unique among the valid files, dependencies
        present among them (or in a --with DIR) and without cycles. Exits 1 if any is refused.

        OPTIONS:
          --load                    Also load each valid file in a child process (modhost-trial, as
                                    modhostd does), after what it depends on, and compare the modules
                                    its entry point describes with its manifest
          --with DIR                Plugins in DIR count as present for dependencies (e.g. the
                                    daemon's plugin directory); they are not reported
        """

    func verify(_ operands: [String], with others: [String], load: Bool, validator: Validator, json: Bool) async -> ExitCode {
        func split(_ operands: [String]) -> (directories: [String], files: [String]) {
            var directories: [String] = [], files: [String] = []
            for operand in operands {
                if FileSystem.isDirectory(operand) {
                    directories.append(operand)
                } else {
                    files.append(operand)
                }
            }
            return (directories, files)
        }
        // What a daemon's start would load, without running any plugin code: the set's own
        // listing, checks, names and dependency order; then, with --load, its trial loads.
        let (directories, files) = split(operands)
        var present: [String: PluginFile] = [:]
        for file in others.flatMap({ PluginPlan(directories: [$0], validator: validator).ordered }) where present[file.name] == nil {
            present[file.name] = file
        }
        var plan = PluginPlan(directories: directories, files: files, validator: validator, present: Set(present.keys))
        if load {
            await plan.trialLoad(with: ProcessTrialLoader(), present: Array(present.values))
        }
        let (valid, refused) = (plan.ordered, plan.refused)
        let results = (valid.map { Verdict(file: $0.path, valid: true, warnings: $0.warnings, manifest: $0.manifest) }
            + refused.map(refusedVerdict)).sorted { $0.file < $1.file }
        if json {
            output.out(encodeJSON(results))
        } else {
            for result in results {
                if result.valid {
                    output.out("ok       \(shown(result.file)) (\(shown(result.manifest?.name ?? "?")) \(shown(result.manifest?.version ?? "")))")
                    for warning in result.warnings { output.out("warning  \(shown(result.file)): \(shown(warning))") }
                } else {
                    output.out("refused  \(shown(result.file)): \(result.check!) check failed: \(shown(result.problem!)). Fix: \(shown(result.fix!))")
                }
            }
            let refused = results.filter { !$0.valid }.count
            output.out("\(results.count - refused) valid, \(refused) refused")
        }
        return results.allSatisfy(\.valid) ? .success : .failure
    }

    /// Text from a plugin file (or its name) for the terminal: control characters escaped,
    /// so a hostile manifest can neither break a line nor send an escape sequence.
    private func shown(_ text: String) -> String { JSONValue.escapingControlCharacters(text) }

    // MARK: manifest (plugin.mk)

    func manifest(_ path: String, _ parsed: Arguments) throws -> ExitCode {
        guard let language = parsed.value("language").flatMap(Manifest.Language.init(rawValue:)) else {
            throw UsageError("--language must be swift or c")
        }
        let data: [UInt8]
        do {
            // What would not fit in the manifest section is refused here already.
            data = try BoundedFile.read(path, limit: Int(PluginLimits.maximumManifestSize))
        } catch {
            output.err("Error: cannot read \(path): \(error)")
            return .dataError
        }
        let document: JSONValue
        do {
            document = try JSONValue.parse(data)
        } catch {
            output.err("Error: \(path): \(error). Fix: correct \(path)")
            return .dataError
        }
        guard case .object(var fields) = document else {
            output.err("Error: \(path): not a JSON object. Fix: write the manifest as {\"name\": ..., \"version\": ..., \"modules\": [...]}")
            return .dataError
        }
        fields["abi"] = .string("\(HostSDK.abiMajor).\(HostSDK.abiMinor)")
        fields["language"] = .string(language.rawValue)
        if language == .swift {
            guard let sdk = parsed.value("sdk") ?? PluginBuildFlags.defaultSDK().map({ $0 + "/lib/libModuleKit.so" }) else {
                throw UsageError("a Swift plugin needs --sdk PATH/libModuleKit.so (no SDK next to this modhostctl)")
            }
            // The ModuleKit version comes from the library the plugin links, not from this
            // process's, which may be another build.
            guard let version = (try? ELFImage(path: sdk).moduleKitABIVersion()) ?? nil else {
                output.err("Error: \(sdk): no ModuleKit ABI version found (section .modhost.modulekit). Fix: point --sdk at the libModuleKit.so the plugin links against")
                return .dataError
            }
            let swift = parsed.value("swift-version") ?? ""
            guard Manifest.Toolchain.compilerVersion(of: swift) != nil else {
                output.err("Error: --swift-version \"\(swift)\" names no Swift version. Fix: pass the first line of `swiftc --version` (plugin.mk does)")
                return .dataError
            }
            fields["toolchain"] = ["swift": .string(swift), "moduleKit": .string("\(version.major).\(version.minor)")]
        }
        let manifest: Manifest
        do {
            manifest = try Manifest(json: .object(fields))
        } catch {
            output.err("Error: \(path): \(error.reason). Fix: correct \(path)")
            return .dataError
        }
        if let unknown = manifest.unknownField {
            output.err("Error: \(path): \(unknown.problem). Fix: \(unknown.fix(in: path))")
            return .dataError
        }
        if let library = parsed.value("library") {
            if let problem = missingExports(manifest, library: library, language: language) {
                output.err("Error: \(problem)")
                return .dataError
            }
            // The rest of what the daemon checks in the file's symbols before loading it:
            // the entry point, the export signatures, an export that is data.
            do {
                try Validator().checkSymbols(ofBuiltLibrary: library, manifest: manifest)
            } catch {
                output.err("Error: \(error)")
                return .dataError
            }
        }
        output.out(manifest.jsonText())
        return .success
    }

    /// What is wrong when `library` does not export every function the manifest declares
    /// (defined in the file, global, with default or protected visibility in its dynamic
    /// symbol table, as the daemon requires): a function compiled with hidden visibility
    /// (plugin.mk's `-fvisibility=hidden` without `MODHOST_EXPORT`) is absent from the
    /// table, and the host would refuse the plugin at load time.
    func missingExports(_ manifest: Manifest, library: String, language: Manifest.Language) -> String? {
        guard !manifest.exports.isEmpty else { return nil }
        let symbols: [String: ELFImage.SymbolFacts]
        do {
            symbols = try ELFImage(path: library).symbols(named: Set(manifest.exports.map(\.name)))
        } catch {
            return "cannot read the dynamic symbol table of \(library): \(error)"
        }
        let missing = manifest.exports.map(\.name).filter { symbols[$0]?.isExported != true }
        guard let first = missing.first else { return nil }
        let names = missing.map { JSONValue.escapingControlCharacters($0) }.joined(separator: ", ")
        return "\(library): plugin.json exports \(names), which \(missing.count == 1 ? "is" : "are") not exported in the file's dynamic symbol table (undefined, or defined with hidden or internal visibility), so the host could not call \(missing.count == 1 ? "it" : "them"). Fix: \(Validator.exportFix(first, language: language))"
    }
}

/// Pretty JSON with sorted keys (`JSONValue.prettyJSONText`).
func encodeJSON(_ value: some Encodable) -> String {
    (try? JSONValue(encoding: value))?.prettyJSONText ?? "null"
}
