import Foundation
import Glibc
@testable import ModuleHost
import ModuleKit
import PluginFormat
import Testing
import TestSupport

/// The plugin author's kit as a newcomer uses it, out of tree: `modhostctl new`, the
/// shipped plugin.mk, `modhostctl flags`, and what the README and docs/plugins.md show.
@Suite(.timeLimit(.minutes(5)), .serialized) struct OutOfTreeBuildTests {
    /// The SDK prefix `modhostctl` belongs to, as `new` writes it into the Makefile.
    static var sdk: String { realPath(BuildProducts.directory) ?? BuildProducts.directory }

    /// Runs `modhostctl new` into `directory`.
    func scaffold(_ language: String, _ name: String, in directory: String) throws {
        let result = try run(BuildProducts.modhostctl, ["new", "--\(language)", name, "--dir", directory])
        try #require(result.status == 0, "modhostctl new failed: \(result.standardError)")
        // Its next step checks the build as the daemon would load it.
        #expect(result.standardOutput.contains("make && modhostctl verify --load build/lib\(name).so"), "\(result.standardOutput)")
    }

    /// `make` in `directory` (with `arguments`), standard error joined to standard output,
    /// as an author runs it (not as a child of `make test`, whose jobserver it would find).
    func make(_ directory: String, _ arguments: String = "") throws -> ProcessResult {
        try run("/bin/bash", ["-c", "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory \(arguments) 2>&1"], directory: directory)
    }

    func text(_ path: String) throws -> String { try String(contentsOfFile: path, encoding: .utf8) }

    // MARK: the scaffold

    /// What the README's first plugin shows is what `modhostctl new` writes; it builds
    /// without a warning, verifies, loads, and `make` again replaces it in the running daemon.
    @Test(arguments: ["c", "swift"])
    func theScaffoldBuildsVerifiesLoadsAndIsReplaced(language: String) async throws {
        let root = TemporaryDirectory("scaffold")
        let dir = root.file("Hello")
        try scaffold(language, "Hello", in: dir)
        let source = dir + (language == "c" ? "/hello.c" : "/Hello.swift")
        let makefile = try text(dir + "/Makefile")
        #expect(makefile == "PLUGIN = Hello\nMODHOST_SDK ?= \(Self.sdk)\ninclude $(MODHOST_SDK)/share/modulehost/plugin.mk\n")
        #expect(try text(dir + "/README.md").split(separator: "\n").count == 1)

        let blocks = try MarkdownBlock.blocks(of: "README.md")
        #expect(try #require(blocks.first { $0.language == "json" }).body == (try text(dir + "/plugin.json")))
        #expect(try #require(blocks.first { $0.language == language }).body == (try text(source)))
        #expect(try #require(blocks.first { $0.language == "make" }).body
            .replacingOccurrences(of: "/path/to/modulehost/build", with: Self.sdk) == makefile)
        let commands = try #require(blocks.first { $0.language == "sh" && $0.body.contains("modhostctl new") }).body
        #expect(commands.contains("modhostctl new --\(language) Hello"))

        let build = try make(dir)
        #expect(build.status == 0, "\(build.standardOutput)")
        #expect(!build.standardOutput.contains("warning"), "\(build.standardOutput)")
        let library = dir + "/build/libHello.so"
        // The check the README's quick start runs: verify, and a trial load as the daemon's.
        #expect(commands.contains("modhostctl verify --load build/libHello.so"))
        let verify = try run(BuildProducts.modhostctl, ["verify", "--load", library])
        #expect(verify.status == 0, "\(verify.standardOutput)")
        let file = try Validator().validate(library)
        #expect(file.manifest.name == "Hello" && file.manifest.language.rawValue == language)
        #expect(file.dynamic.soname == "libHello.so")

        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", dir + "/build", "--state-dir", root.file("state"),
                                                                 "--socket", root.file("sock")])
        #expect(await daemon.waitFor("started 1 module: hello"))
        let startLine = daemon.text.split(separator: "\n").first { $0.contains(language == "c" ? ": start " : "hello: start") }
        #expect(startLine?.contains("module=hello") == true, "\(daemon.text)")

        // Hot replace: change what the module logs, `make` again into the watched directory.
        let (old, new) = language == "c" ? ("hello, world", "hello, replaced") : ("hello: ", "hello again: ")
        try (try text(source)).replacingOccurrences(of: old, with: new).write(toFile: source, atomically: true, encoding: .utf8)
        let rebuild = try make(dir)
        #expect(rebuild.status == 0, "\(rebuild.standardOutput)")
        #expect(await daemon.waitFor(language == "c" ? "hello, replaced" : "hello again: start"), "\(daemon.text)")
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0, "\(daemon.text)")

        // `make clean` leaves the directory as `new` wrote it.
        let clean = try make(dir, "clean")
        #expect(clean.status == 0, "\(clean.standardOutput)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).sorted() == ["Makefile", "README.md", "plugin.json", (source as NSString).lastPathComponent].sorted())
    }

    @Test func theScaffoldRefusesWhatItCannotWrite() throws {
        let root = TemporaryDirectory("scaffold-refusals")
        let taken = root.directory("Taken")
        try root.write("Taken/keep.txt", text: "mine\n")
        let cases: [([String], String)] = [
            (["new", "--c", "Hello", "--dir", taken], "exists and is not empty"),
            (["new", "--c", "../Hello", "--dir", root.file("x")], "not a name"),
            (["new", "--swift", "my-plugin", "--dir", root.file("y")], "letters, digits and '_'"),
            (["new", "Hello"], "one of --swift and --c"),
            // Outside attack: these wrote directories that did not build, or built a plugin
            // that did not load (libFoundation.so against the toolchain's).
            (["new", "--swift", "ModuleKit", "--dir", root.file("z1")], "already names a module or library of ModuleKit or the Swift toolchain"),
            (["new", "--swift", "Swift", "--dir", root.file("z2")], "already names a module or library"),
            (["new", "--swift", "Foundation", "--dir", root.file("z3")], "already names a module or library"),
            (["new", "--swift", "swiftCore", "--dir", root.file("z4")], "already names a module or library"),
        ]
        for (arguments, message) in cases {
            let result = try run(BuildProducts.modhostctl, arguments)
            #expect(result.status != 0, "\(arguments)")
            #expect(result.standardError.contains(message), "\(arguments): \(result.standardError)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: taken) == ["keep.txt"])
        #expect(!FileManager.default.fileExists(atPath: root.file("x")) && !FileManager.default.fileExists(atPath: root.file("y")))
    }

    // MARK: plugin.mk

    /// Two plugins sharing a PLUGIN_DIR (as a plugin and its dependent do) keep their own
    /// intermediate files, and the dependent rebuilds when the dependency's module changes.
    @Test func pluginsSharingAnOutputDirectoryStayApartAndDependentsRebuild() throws {
        let root = TemporaryDirectory("shared-plugin-dir")
        let out = root.directory("out")
        let ledger = root.file("Ledger"), auditor = root.file("Auditor")
        try scaffold("swift", "Ledger", in: ledger)
        try scaffold("swift", "Auditor", in: auditor)
        try "public func ledgerBalance() -> Int { 1 }\n".write(toFile: ledger + "/Balance.swift", atomically: true, encoding: .utf8)
        try """
            import Ledger
            public func auditedBalance() -> Int { ledgerBalance() }

            """.write(toFile: auditor + "/Audit.swift", atomically: true, encoding: .utf8)
        try #"{ "name": "Auditor", "version": "1.0.0", "modules": ["auditor"], "dependencies": ["Ledger"] }"#
            .write(toFile: auditor + "/plugin.json", atomically: true, encoding: .utf8)
        let shared = "PLUGIN_DIR=\(out)"
        for directory in [ledger, auditor] {
            let build = try make(directory, shared)
            try #require(build.status == 0, "\(build.standardOutput)")
        }
        #expect(try Validator().validate(out + "/libAuditor.so").manifest.name == "Auditor")
        #expect(try make(auditor, "-q " + shared).status == 0, "Auditor is up to date after its build")

        // A new Ledger (version and module): the plain `make` in Auditor rebuilds it.
        try (try text(ledger + "/plugin.json")).replacingOccurrences(of: "1.0.0", with: "1.1.0")
            .write(toFile: ledger + "/plugin.json", atomically: true, encoding: .utf8)
        try "public func ledgerBalance() -> Int { 2 }\npublic func ledgerEntries() -> Int { 0 }\n"
            .write(toFile: ledger + "/Balance.swift", atomically: true, encoding: .utf8)
        try #require(try make(ledger, shared).status == 0)
        #expect(try Validator().validate(out + "/libLedger.so").manifest.version == "1.1.0")
        #expect(try make(auditor, "-q " + shared).status != 0, "Auditor must rebuild when Ledger.swiftmodule changes")
        let rebuild = try make(auditor, shared)
        #expect(rebuild.status == 0 && rebuild.standardOutput.contains("swiftc"), "\(rebuild.standardOutput)")
        let auditorManifest = try Validator().validate(out + "/libAuditor.so").manifest
        #expect(auditorManifest.name == "Auditor" && auditorManifest.dependencies == ["Ledger"])
        let verify = try run(BuildProducts.modhostctl, ["verify", out])
        #expect(verify.status == 0, "\(verify.standardOutput)")
    }

    /// Optimized with debug information by default, `-Onone` with DEBUG=1, and a change of
    /// flags rebuilds.
    /// A Makefile that sets no MODHOST_SDK (the README's pkg-config form) builds: plugin.mk
    /// finds the SDK from its own path, on the first build and on a rebuild, when the
    /// dependency file plugin.mk includes is the makefile read last.
    @Test(arguments: ["c", "swift"])
    func pluginMkFindsTheSDKFromItsOwnPathOnEveryBuild(language: String) throws {
        let root = TemporaryDirectory("plugin-sdk-path")
        let dir = root.file("Found")
        try scaffold(language, "Found", in: dir)
        try "PLUGIN = Found\ninclude \(Self.sdk)/share/modulehost/plugin.mk\n"
            .write(toFile: dir + "/Makefile", atomically: true, encoding: .utf8)
        let first = try make(dir)
        #expect(first.status == 0, "\(first.standardOutput)")
        let source = dir + (language == "c" ? "/found.c" : "/Found.swift")
        try (try text(source) + "// changed\n").write(toFile: source, atomically: true, encoding: .utf8)
        let second = try make(dir)
        #expect(second.status == 0, "\(second.standardOutput)")
        #expect(try make(dir, "-q").status == 0, "the rebuild should leave nothing to do")
    }

    @Test(arguments: ["c", "swift"])
    func pluginsAreOptimizedByDefaultAndDebugIsAFlag(language: String) throws {
        let root = TemporaryDirectory("plugin-flags")
        let dir = root.file("Opt")
        try scaffold(language, "Opt", in: dir)
        let (optimized, debug) = language == "c" ? (" -O2 -g ", " -O0 -g ") : (" -O -g ", " -Onone -g ")
        let dryRun = try make(dir, "-n").standardOutput
        #expect(dryRun.contains(optimized) && !dryRun.contains(debug), "\(dryRun)")
        #expect(try make(dir, "-n DEBUG=1").standardOutput.contains(debug))
        try #require(try make(dir).status == 0)
        #expect(try make(dir, "-q").status == 0)
        #expect(try make(dir, "-q DEBUG=1").status != 0, "DEBUG=1 after a build must rebuild")
    }

    /// A function plugin.json exports but the file does not (a C function without
    /// MODHOST_EXPORT under -fvisibility=hidden, a Swift function without @_cdecl) stops
    /// the build with an error naming it and the fix.
    @Test(arguments: ["c", "swift"])
    func aDeclaredExportMissingFromTheFileStopsTheBuild(language: String) throws {
        let root = TemporaryDirectory("plugin-exports")
        let dir = root.file("Thermo")
        try scaffold(language, "Thermo", in: dir)
        try #"{ "name": "Thermo", "version": "1.0.0", "modules": ["thermo"], "exports": [{ "name": "thermo_set", "signature": "i32(i32)" }] }"#
            .write(toFile: dir + "/plugin.json", atomically: true, encoding: .utf8)
        let (file, hidden, exported, fix) = language == "c"
            ? ("set.c", "#include <modulehost.h>\nint32_t thermo_set(int32_t t) { return t; }\n",
               "#include <modulehost.h>\nMODHOST_EXPORT int32_t thermo_set(int32_t t) { return t; }\n", "MODHOST_EXPORT")
            : ("Set.swift", "public func thermoSet(_ t: Int32) -> Int32 { t }\n",
               "@_cdecl(\"thermo_set\")\npublic func thermoSet(_ t: Int32) -> Int32 { t }\n", "@_cdecl(\"thermo_set\")")
        try hidden.write(toFile: dir + "/" + file, atomically: true, encoding: .utf8)
        let refused = try make(dir)
        #expect(refused.status != 0)
        #expect(refused.standardOutput.contains("exports thermo_set, which is not exported in the file's dynamic symbol table"), "\(refused.standardOutput)")
        #expect(refused.standardOutput.contains("Fix: define it") && refused.standardOutput.contains(fix), "\(refused.standardOutput)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/build/libThermo.so"))

        try exported.write(toFile: dir + "/" + file, atomically: true, encoding: .utf8)
        let built = try make(dir)
        #expect(built.status == 0, "\(built.standardOutput)")
        #expect(try ELFImage(path: dir + "/build/libThermo.so").definedDynamicSymbols().contains("thermo_set"))
        #expect(try run(BuildProducts.modhostctl, ["verify", dir + "/build/libThermo.so"]).status == 0)
    }

    /// What the daemon would refuse in a file's symbols stops the build too, with the
    /// daemon's own check and fix, rather than leaving a file that builds and is refused:
    /// no entry point, an export signature outside the grammar, an export that is data.
    @Test(arguments: ["c", "swift"])
    func whatTheDaemonRefusesInTheSymbolsStopsTheBuild(language: String) throws {
        let root = TemporaryDirectory("plugin-symbols")
        let dir = root.file("Thermo")
        try scaffold(language, "Thermo", in: dir)
        let source = dir + (language == "c" ? "/thermo.c" : "/Thermo.swift")
        let original = try text(source)

        // The entry point without MODHOST_PLUGIN_ENTRY / @_cdecl.
        let withoutEntry = language == "c"
            ? original.replacingOccurrences(of: "MODHOST_PLUGIN_ENTRY {", with: "const modhost_plugin *modhost_plugin_entry_v1(void) {")
            : original.replacingOccurrences(of: "@_cdecl(\"modhost_plugin_entry_v1\")\n", with: "")
        try #require(withoutEntry != original)
        try withoutEntry.write(toFile: source, atomically: true, encoding: .utf8)
        let noEntry = try make(dir)
        #expect(noEntry.status != 0)
        #expect(noEntry.standardOutput.contains("entry symbol check failed: the file does not export modhost_plugin_entry_v1"), "\(noEntry.standardOutput)")
        #expect(noEntry.standardOutput.contains(language == "c" ? "MODHOST_PLUGIN_ENTRY { return &plugin; }" : "@_cdecl(\"modhost_plugin_entry_v1\")"),
                "\(noEntry.standardOutput)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/build/libThermo.so"))
        try original.write(toFile: source, atomically: true, encoding: .utf8)

        // An export whose signature is C, not the grammar of docs/calling.md.
        let (file, function) = language == "c"
            ? ("set.c", "#include <modulehost.h>\nMODHOST_EXPORT int32_t thermo_set(int32_t t) { return t; }\n")
            : ("Set.swift", "@_cdecl(\"thermo_set\")\npublic func thermoSet(_ t: Int32) -> Int32 { t }\n")
        try function.write(toFile: dir + "/" + file, atomically: true, encoding: .utf8)
        try #"{ "name": "Thermo", "version": "1.0.0", "modules": ["thermo"], "exports": [{ "name": "thermo_set", "signature": "int(int)" }] }"#
            .write(toFile: dir + "/plugin.json", atomically: true, encoding: .utf8)
        let badSignature = try make(dir)
        #expect(badSignature.status != 0)
        #expect(badSignature.standardOutput.contains("exports check failed: plugin Thermo: export thermo_set: invalid signature \"int(int)\""),
                "\(badSignature.standardOutput)")
        #expect(badSignature.standardOutput.contains("did you mean i32?"), "\(badSignature.standardOutput)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/build/libThermo.so"))

        // Fixed, it builds and verifies.
        try #"{ "name": "Thermo", "version": "1.0.0", "modules": ["thermo"], "exports": [{ "name": "thermo_set", "signature": "i32(i32)" }] }"#
            .write(toFile: dir + "/plugin.json", atomically: true, encoding: .utf8)
        let built = try make(dir)
        #expect(built.status == 0, "\(built.standardOutput)")
        #expect(try run(BuildProducts.modhostctl, ["verify", dir + "/build/libThermo.so"]).status == 0)

        guard language == "c" else { return }
        // An export that is a variable: in the dynamic symbol table, but not a function.
        try "#include <modulehost.h>\nMODHOST_EXPORT int32_t thermo_set = 3;\n".write(toFile: dir + "/" + file, atomically: true, encoding: .utf8)
        let data = try make(dir)
        #expect(data.status != 0)
        #expect(data.standardOutput.contains("exports check failed: declared export thermo_set is a global object with default visibility, not a function"),
                "\(data.standardOutput)")
    }

    /// plugin.mk's export check (`modhostctl manifest --library`) asks what the daemon asks
    /// of a declared export: in the dynamic symbol table *with default (or protected)
    /// visibility*. A file whose `.dynsym` lists the function as hidden (which the daemon
    /// refuses) does not pass it.
    @Test func anExportInTheDynamicSymbolTableWithHiddenVisibilityFailsTheBuildCheck() throws {
        let root = TemporaryDirectory("plugin-hidden-dynsym")
        let dir = root.file("Thermo")
        try scaffold("c", "Thermo", in: dir)
        try "#include <modulehost.h>\nMODHOST_EXPORT int32_t thermo_set(int32_t t) { return t; }\n"
            .write(toFile: dir + "/set.c", atomically: true, encoding: .utf8)
        try #"{ "name": "Thermo", "version": "1.0.0", "modules": ["thermo"], "exports": [{ "name": "thermo_set", "signature": "i32(i32)" }] }"#
            .write(toFile: dir + "/plugin.json", atomically: true, encoding: .utf8)
        try #require(try make(dir).status == 0)
        let unstamped = dir + "/build/obj/Thermo/libThermo.so"
        let check = ["manifest", "--language", "c", "--library", unstamped, dir + "/plugin.json"]
        #expect(try run(BuildProducts.modhostctl, check).status == 0)

        // st_other of thermo_set's .dynsym entry set to STV_HIDDEN, as a linker that kept a
        // hidden symbol in the table would leave it.
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: unstamped)))
        let image = try ELFImage(path: unstamped)
        let dynsym = try #require(image.section(named: ".dynsym"))
        let dynstr = try #require(image.section(named: ".dynstr"))
        let wanted = Array("thermo_set".utf8) + [0]
        var patched = false
        for entry in stride(from: Int(dynsym.offset) + 24, to: Int(dynsym.offset + dynsym.size), by: 24) {
            let nameOffset = Int(bytes[entry]) | Int(bytes[entry + 1]) << 8 | Int(bytes[entry + 2]) << 16 | Int(bytes[entry + 3]) << 24
            let start = Int(dynstr.offset) + nameOffset
            if Array(bytes[start..<start + wanted.count]) == wanted {
                bytes[entry + 5] = (bytes[entry + 5] & ~3) | 2  // st_other: STV_HIDDEN
                patched = true
            }
        }
        try #require(patched)
        try Data(bytes).write(to: URL(fileURLWithPath: unstamped))
        #expect(try ELFImage(path: unstamped).symbols(named: ["thermo_set"])["thermo_set"]?.visibility == 2)

        let refused = try run(BuildProducts.modhostctl, check)
        #expect(refused.status == 65, "\(refused.standardOutput)")
        #expect(refused.standardError.contains("plugin.json exports thermo_set, which is not exported in the file's dynamic symbol table"),
                "\(refused.standardError)")
        #expect(refused.standardError.contains("MODHOST_EXPORT"), "\(refused.standardError)")
    }

    /// The example plugins build without a warning under plugin.mk's own flags.
    @Test func theExamplePluginsBuildWithoutWarnings() throws {
        let root = TemporaryDirectory("example-plugins")
        let out = root.directory("out")
        // Welcome imports Greeting: build Greeting first.
        for name in ["Calculator", "Counter", "Greeting", "Welcome"] {
            let copy = root.file(name)
            try FileManager.default.copyItem(atPath: BuildProducts.packageRoot + "/Plugins/" + name, toPath: copy)
            let build = try make(copy, "MODHOST_SDK=\(BuildProducts.directory) PLUGIN_DIR=\(out)")
            #expect(build.status == 0 && !build.standardOutput.contains("warning"), "\(name):\n\(build.standardOutput)")
        }
    }

    /// Outside run: docs/calling.md tells authors to return `strdup(...)`, but under the
    /// flags' `-std=c11` glibc does not declare `strdup`: gcc only warned, took it for a
    /// function returning `int`, cut the pointer to 32 bits, and the first call crashed the
    /// daemon. The flags now declare what glibc offers by default (`_DEFAULT_SOURCE`) and
    /// make a call to an undeclared function an error.
    @Test func strdupAsTheDocsSayBuildsAndReturnsItsString() async throws {
        let root = TemporaryDirectory("strdup")
        let dir = root.file("Hello")
        try scaffold("c", "Hello", in: dir)
        let source = try text(dir + "/hello.c")
        try (source.replacingOccurrences(of: "#include <modulehost.h>\n", with: "#include <modulehost.h>\n#include <string.h>\n")
            + "\nMODHOST_EXPORT char *hello_copy(const char *text) { return strdup(text); }\n")
            .write(toFile: dir + "/hello.c", atomically: true, encoding: .utf8)
        try #"{ "name": "Hello", "version": "1.0.0", "modules": ["hello"], "exports": [{ "name": "hello_copy", "signature": "str(str)" }] }"#
            .write(toFile: dir + "/plugin.json", atomically: true, encoding: .utf8)
        let build = try make(dir)
        #expect(build.status == 0 && !build.standardOutput.contains("warning"), "\(build.standardOutput)")
        try #require(build.status == 0)
        let load = try await StartupLoad(directories: [dir + "/build"])
        let functions = try #require(await load.set.plugin(named: "Hello")?.functions, "\(load.refused)")
        #expect(try functions.call("hello_copy", texts: ["a string from the heap"]) == .string("a string from the heap"))
        await load.shutdown()

        // A function nobody declared is an error at build time, not a guess.
        try (source + "\nint guess(void) { return undeclared_function(); }\n").write(toFile: dir + "/hello.c", atomically: true, encoding: .utf8)
        let guessed = try make(dir)
        #expect(guessed.status != 0 && guessed.standardOutput.contains("error: implicit declaration of function")
                && guessed.standardOutput.contains("undeclared_function"),
                "\(guessed.standardOutput)")
    }

    // MARK: building without make

    /// docs/plugins.md's "Building without make" examples, run as written in a directory
    /// `modhostctl new` wrote, with the built tools first on PATH.
    @Test(arguments: ["c", "swift"])
    func buildingWithoutMakeWorksAsDocumented(language: String) throws {
        let blocks = try MarkdownBlock.blocks(of: "docs/plugins.md").filter { $0.language == "sh" && $0.body.contains("modhostctl flags") }
        let commands = try #require(blocks.first { $0.body.contains(language == "c" ? "cc $(modhostctl flags --c" : "swiftc $(modhostctl flags --swift") })
        let root = TemporaryDirectory("no-make")
        let dir = root.file("Hello")
        try scaffold(language, "Hello", in: dir)
        let script = "set -e\nexport PATH=\(BuildProducts.directory)/bin:$PATH\n" + commands.body
        let result = try run("/bin/bash", ["-c", script + " 2>&1"], directory: dir)
        #expect(result.status == 0, "\(commands.location):\n\(result.standardOutput)")
        #expect(result.standardOutput.contains("1 valid, 0 refused"), "\(result.standardOutput)")

        // The flags are those plugin.mk uses.
        let flags = try run(BuildProducts.modhostctl, ["flags", "--\(language)", "--plugin", "Hello"]).standardOutput
            .trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try make(dir, "-n").standardOutput.contains(flags))
        let file = try Validator().validate(dir + "/libHello.so")
        #expect(file.manifest.name == "Hello" && file.dynamic.soname == "libHello.so")
    }

    @Test func flagsRefusesWhatAShellWouldSplit() throws {
        let root = TemporaryDirectory("flags")
        let spaced = root.directory("sdk copy")
        _ = root.directory("sdk copy/include")
        try root.write("sdk copy/include/modulehost.h", text: "\n")
        let cases: [([String], String)] = [
            (["flags", "--c", "--swift"], "one of --swift and --c"),
            (["flags", "--c", "--plugin", "a b"], "not a name"),
            (["flags", "--c", "--prefix", root.file("none")], "no include/modulehost.h"),
            (["flags", "--c", "--prefix", spaced], "which a shell or make would split"),
        ]
        for (arguments, message) in cases {
            let result = try run(BuildProducts.modhostctl, arguments)
            #expect(result.status != 0)
            #expect(result.standardError.contains(message), "\(arguments): \(result.standardError)")
        }
    }
}
