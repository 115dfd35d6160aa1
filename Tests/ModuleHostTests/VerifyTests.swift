import DaemonKit
import Foundation
import Glibc
@testable import ModuleHost
import PluginFormat
import Testing
import TestSupport

/// `modhostctl verify` says what the daemon would say: each case is a plugin
/// the daemon refuses at load time, which verify refuses with the same check and fix,
/// statically or with `--load`; and `plugin.json` is strict.
@Suite(.timeLimit(.minutes(5))) struct VerifyTests {
    let dir = TemporaryDirectory("verify")
    var factory: PluginFactory { PluginFactory(directory: dir.path) }

    /// A C plugin `name` with one module, its source changed by `edit`.
    @discardableResult
    func cPlugin(_ name: String, modules: [String]? = nil, manifestModules: [String]? = nil, dependencies: [String] = [],
                 exports: [(String, String)] = [], extra: String = "", fileName: String? = nil,
                 edit: (String) -> String = { $0 }) throws -> String {
        let modules = modules ?? [name.lowercased()]
        return try factory.buildC(name, source: edit(PluginFactory.cSource(plugin: name, modules: modules, extra: extra)),
                                  manifest: PluginFactory.manifest(plugin: name, modules: manifestModules ?? modules,
                                                                   dependencies: dependencies, exports: exports),
                                  fileName: fileName)
    }

    /// The entry point written without MODHOST_PLUGIN_ENTRY: hidden under -fvisibility=hidden.
    static func withoutEntryMacro(_ source: String) -> String {
        source.replacingOccurrences(of: "MODHOST_PLUGIN_ENTRY", with: "const modhost_plugin *modhost_plugin_entry_v1(void)")
    }

    func verify(_ arguments: [String]) throws -> ProcessResult {
        try run(BuildProducts.modhostctl, ["verify"] + arguments)
    }

    /// The daemon's validation of `path` (what it runs before dlopen).
    func daemonRefusal(_ path: String) -> LoadFailure? {
        do {
            _ = try Validator().validate(path, in: dir.path)
            return nil
        } catch {
            return error
        }
    }

    // MARK: static checks

    @Test func aMissingEntrySymbolIsRefusedNamingTheMacroAndTheCdeclLine() throws {
        let path = try cPlugin("NoEntry", edit: Self.withoutEntryMacro)
        let result = try verify([path])
        #expect(result.status == 1, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("entry symbol check failed: the file does not export modhost_plugin_entry_v1 (it is defined but hidden"),
                "\(result.standardOutput)")
        #expect(result.standardOutput.contains("MODHOST_PLUGIN_ENTRY { return &plugin; }"), "\(result.standardOutput)")
        #expect(result.standardOutput.contains("@_cdecl(\"modhost_plugin_entry_v1\")"), "\(result.standardOutput)")
        #expect(!result.standardOutput.contains("rebuild"), "\(result.standardOutput)")
        // The daemon refuses it with the same line, before dlopen.
        let failure = try #require(daemonRefusal(path))
        #expect(result.standardOutput.contains("\(failure.check.rawValue) check failed: \(failure.problem). Fix: \(failure.fix)"))
    }

    @Test func anEntryPointThatIsNotThereAtAllIsRefused() throws {
        let path = try cPlugin("Bare") { $0.replacingOccurrences(of: "MODHOST_PLUGIN_ENTRY {", with: "static const modhost_plugin *unused(void) {") }
        let failure = try #require(daemonRefusal(path))
        #expect(failure.check == .entrySymbol)
        #expect(failure.problem == "the file does not export modhost_plugin_entry_v1")
        #expect(failure.fix.contains("MODHOST_PLUGIN_ENTRY"))
    }

    @Test func aHiddenExportIsRefusedNamingTheFunction() throws {
        // What plugin.mk's -fvisibility=hidden does to a function with no export attribute.
        let path = try cPlugin("Thermo", exports: [("thermo_set", "i32(i32)")], extra: "int thermo_set(int x) { return x; }")
        let result = try verify([path])
        #expect(result.status == 1, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("exports check failed: declared export thermo_set is not exported by this file: it is defined but hidden"),
                "\(result.standardOutput)")
        #expect(result.standardOutput.contains("Fix: define it with MODHOST_EXPORT from modulehost.h"), "\(result.standardOutput)")
        #expect(daemonRefusal(path)?.check == .exports)
        // Exported, it passes.
        let fixed = try cPlugin("Thermo2", exports: [("thermo_set", "i32(i32)")],
                                extra: "__attribute__((visibility(\"default\"))) int thermo_set(int x) { return x; }")
        #expect(try verify([fixed]).status == 0)
    }

    @Test func anExportThatIsDataOrAbsentIsRefused() throws {
        let data = try cPlugin("Data", exports: [("thermo_level", "i32()")],
                               extra: "__attribute__((visibility(\"default\"))) int thermo_level = 3;")
        #expect(daemonRefusal(data)?.problem == "declared export thermo_level is a global object with default visibility, not a function")
        let absent = try cPlugin("Absent", exports: [("nowhere_fn", "i32()")])
        #expect(daemonRefusal(absent)?.problem == "declared export nowhere_fn is not exported by this file: the file does not define it")
    }

    @Test func aDependencyThatExistsNowhereIsRefusedAndOneGivenWithWithPasses() throws {
        let plugins = dir.directory("plugins")
        let dependent = try PluginFactory(directory: plugins).buildC(
            "Auditor", source: PluginFactory.cSource(plugin: "Auditor", modules: ["auditor"]),
            manifest: PluginFactory.manifest(plugin: "Auditor", modules: ["auditor"], dependencies: ["Ledger"]))
        let result = try verify([dependent])
        #expect(result.status == 1, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("dependency check failed: plugin Auditor needs Ledger: dependency Ledger is not available"),
                "\(result.standardOutput)")
        // Verified together, or found in a --with directory: it passes.
        let installed = dir.directory("installed")
        let ledger = try PluginFactory(directory: installed).buildC(
            "Ledger", source: PluginFactory.cSource(plugin: "Ledger", modules: ["ledger"]),
            manifest: PluginFactory.manifest(plugin: "Ledger", modules: ["ledger"]))
        #expect(try verify([dependent, ledger]).status == 0)
        let with = try verify(["--with", installed, dependent])
        #expect(with.status == 0, "\(with.standardOutput)")
        #expect(!with.standardOutput.contains("Ledger"), "\(with.standardOutput)")
        #expect(try verify(["--load", "--with", installed, dependent]).status == 0)
    }

    @Test func namesAreUniqueAmongValidFilesOnly() throws {
        // The first file by path is refused (no entry point): it holds no name, so the
        // second is not its duplicate.
        let refused = try cPlugin("Same", fileName: "libA.so", edit: Self.withoutEntryMacro)
        let valid = try cPlugin("Same", fileName: "libB.so")
        let result = try verify([dir.path])
        #expect(result.standardOutput.contains("refused  \(refused): entry symbol check failed"), "\(result.standardOutput)")
        #expect(result.standardOutput.contains("ok       \(valid) (Same 1.0)"), "\(result.standardOutput)")
        #expect(!result.standardOutput.contains("duplicate"), "\(result.standardOutput)")
    }

    // MARK: --load

    @Test func loadComparesTheEntrysModulesWithTheManifest() throws {
        let path = try cPlugin("Mismatch", modules: ["alpha", "gamma"], manifestModules: ["alpha", "beta"])
        #expect(try verify([path]).status == 0)  // nothing static tells
        let result = try verify(["--load", path])
        #expect(result.status == 1, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("descriptor check failed: the entry symbol describes modules [alpha, gamma], the manifest lists [alpha, beta]"),
                "\(result.standardOutput)")
    }

    @Test func loadFindsAnUnresolvedSymbolWithTheRightFix() throws {
        let path = try cPlugin("Unresolved", extra: "extern int not_defined_anywhere(void); __attribute__((used)) static int use(void) { return not_defined_anywhere(); }")
        #expect(try verify([path]).status == 0)
        let result = try verify(["--load", path])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("dlopen check failed: dlopen failed: ") && result.standardOutput.contains("undefined symbol: not_defined_anywhere"),
                "\(result.standardOutput)")
        #expect(result.standardOutput.contains("Fix: link the library that defines the symbol"), "\(result.standardOutput)")
    }

    @Test func loadPreloadsWhatAPluginDependsOn() throws {
        let base = try cPlugin("Base", extra: "__attribute__((visibility(\"default\"))) int base_value(void) { return 7; }")
        let user = try cPlugin("User", dependencies: ["Base"],
                               extra: "extern int base_value(void); __attribute__((used)) static int use(void) { return base_value(); }")
        // Linked without -lBase, User only loads when Base is loaded first, as the daemon does.
        let result = try verify(["--load", user, base])
        #expect(result.status == 0, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("2 valid, 0 refused"), "\(result.standardOutput)")
    }

    @Test func aPluginThatCrashesWhenLoadedIsRefusedByLoadNotByVerify() throws {
        let path = try cPlugin("Crash", edit: { $0.replacingOccurrences(of: "return &plugin;", with: "*(volatile int *)0 = 1; return &plugin;") })
        #expect(try verify([path]).status == 0)
        let result = try verify(["--load", path])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("crash guard check failed: the plugin crashed a trial load in a child process (signal 11"),
                "\(result.standardOutput)")
    }

    /// docs/plugins.md says, for every check the daemon can refuse a file by, which run of
    /// verify reports it.
    @Test func theDocsSayWhichVerifyReportsEveryCheck() throws {
        let text = try String(contentsOfFile: BuildProducts.packageRoot + "/docs/plugins.md", encoding: .utf8)
        let section = try #require(text.components(separatedBy: "## Checking a plugin: verify").dropFirst().first?
            .components(separatedBy: "\n## ").first)
        var documented: [String] = []
        for line in section.split(separator: "\n") where line.hasPrefix("| `") {
            let cell = line.dropFirst(2).prefix { $0 != "|" }
            // The names are the backquoted parts: every other piece between backquotes.
            documented += cell.split(separator: "`", omittingEmptySubsequences: false).enumerated()
                .filter { $0.offset % 2 == 1 }.map { String($0.element) }
        }
        #expect(documented.sorted() == LoadFailure.Check.allCases.map(\.rawValue).sorted())
    }

    // MARK: the trial loader's replies and their fixes

    /// Each cause modhost-trial reports becomes the refusal the daemon's own loader gives for
    /// it, with that cause's fix.
    @Test(arguments: [
        ("entry-missing: modhost_plugin_entry_v1", LoadFailure.Check.entrySymbol, "MODHOST_PLUGIN_ENTRY { return &plugin; }"),
        ("entry-foreign: /usr/lib/libother.so", .entrySymbol, "define the entry point in this plugin itself"),
        ("entry-nowhere: modhost_plugin_entry_v1", .entrySymbol, "define the entry point in this plugin itself"),
        ("entry-null: modhost_plugin_entry_v1", .descriptor, "return the plugin descriptor from the entry function"),
        ("dlopen: /x/libA.so: undefined symbol: f", .dlopen, "link the library that defines the symbol"),
        ("dlopen: libz9.so: cannot open shared object file: No such file or directory", .dlopen, "install the missing library"),
        ("preload: libB.so: cannot open shared object file", .dlopen, "fix or rebuild the plugins in its dependencies first"),
        ("plugin-name: Other", .descriptor, "use the same name in the code and in plugin.json"),
        ("descriptor: the plugin descriptor has ABI major version 2, this host 1", .descriptor, "MODHOST_PLUGIN_INIT"),
    ])
    func aTrialRefusalHasTheFixOfItsCause(reply: String, check: LoadFailure.Check, fix: String) throws {
        let file = PluginFile(path: "/p/libA.so", resolvedPath: "/p/libA.so",
                              manifest: Manifest(name: "A", version: "1", abi: "1.0", language: .c, modules: ["a"]),
                              dynamic: DynamicInfo(), warnings: [])
        let failure = ProcessTrialLoader.refusal(reply, file)
        #expect(failure.check == check)
        #expect(failure.fix.contains(fix), "\(failure)")
        #expect(!failure.problem.contains("trial load refused it"), "\(failure)")
    }

    // MARK: strict plugin.json

    @Test(arguments: [
        (#"{"name":"T","version":"1","modules":["t"],"dependecies":["X"]}"#, #"unknown field "dependecies" (did you mean "dependencies"?)"#,
         #"rename "dependecies" to "dependencies""#),
        (#"{"name":"T","version":"1","modules":["t"],"Order":3}"#, #"unknown field "Order" (did you mean "order"?)"#, #"rename "Order" to "order""#),
        (#"{"name":"T","version":"1","modules":["t"],"exports":[{"name":"f","signature":"i32()","nmae":"g"}]}"#,
         #"unknown field "exports[0].nmae" (did you mean "name"?)"#, #"rename "nmae" to "name""#),
        // A typo of a required field: the field is missing, and the typo says why.
        (#"{"name":"T","version":"1","modules":["t"],"exports":[{"name":"f","signatur":"i32()"}]}"#,
         #"required field "exports[0].signature" is missing; unknown field "exports[0].signatur" (did you mean "signature"?)"#,
         "correct"),
        (#"{"name":"T","version":"1","modules":["t"],"colour":"red"}"#, #"unknown field "colour""#,
         #"remove "colour" from"#),
    ])
    func anUnknownPluginJSONFieldIsAnErrorWithAFix(json: String, problem: String, fix: String) throws {
        let path = try dir.write("plugin.json", Array(json.utf8))
        let result = try run(BuildProducts.modhostctl, ["manifest", "--language", "c", path])
        #expect(result.status == ExitCode.dataError.rawValue, "\(result.standardOutput)")
        #expect(result.standardError.contains("Error: \(path): \(problem). Fix: \(fix)"), "\(result.standardError)")
    }

    @Test func aTrailingCommaInPluginJSONIsRefusedAtItsByte() throws {
        let path = try dir.write("plugin.json", Array(#"{"name":"T","version":"1","modules":["t"],}"#.utf8))
        let result = try run(BuildProducts.modhostctl, ["manifest", "--language", "c", path])
        #expect(result.status == ExitCode.dataError.rawValue)
        #expect(result.standardError.contains("\(path): not valid JSON at byte 42"), "\(result.standardError)")
        #expect(result.standardError.contains("Fix: correct \(path)"), "\(result.standardError)")
    }

    @Test func anEmbeddedManifestWithAnUnknownFieldIsRefusedByTheDaemonsCheck() throws {
        let path = try factory.buildC(
            "Typo", source: PluginFactory.cSource(plugin: "Typo", modules: ["typo"]),
            manifest: #"{"name":"Typo","version":"1.0","abi":"1.0","language":"c","modules":["typo"],"dependecies":["X"]}"#)
        let failure = try #require(daemonRefusal(path))
        #expect(failure.check == .manifest)
        #expect(failure.problem == #"the manifest has an unknown field "dependecies" (did you mean "dependencies"?)"#)
        #expect(failure.fix == #"rename "dependecies" to "dependencies" in plugin.json and rebuild with plugin.mk"#)
    }
}
