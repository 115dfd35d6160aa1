import DaemonKit
import ModuleKit
import PluginFormat

/// The plugin directory `modhostctl new` writes: plugin.json, one source file, a
/// three-line Makefile that includes plugin.mk, and a README line. It builds, verifies and
/// loads as written; the README's "Write your first plugin" shows these very files.
struct PluginScaffold: Sendable {
    var name: String
    var language: PluginBuildFlags.Language
    /// The SDK prefix the Makefile points at (`MODHOST_SDK ?= ...`).
    var sdk: String

    /// The one module's name: the plugin's name in lower case.
    var moduleName: String { name.lowercased() }

    /// `name` must follow the name grammar and also be a C and Swift identifier, since it
    /// names a type and functions in the source.
    init(name: String, language: PluginBuildFlags.Language, sdk: String) throws(UsageError) {
        if let problem = PluginName.problem(name) { throw UsageError("NAME: \(problem)") }
        let identifier = name.unicodeScalars.allSatisfy { $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "_") }
        guard identifier, let first = name.unicodeScalars.first, first.properties.isAlphabetic else {
            throw UsageError("NAME \"\(name)\" names a type and functions in the source: use ASCII letters, digits and '_', starting with a letter (e.g. Hello)")
        }
        if language == .swift, Self.takenSwiftNames().contains(name) {
            throw UsageError("NAME \"\(name)\" already names a module or library of ModuleKit or the Swift toolchain: a Swift plugin of that name does not build or does not load; choose another name (e.g. \(name)Plugin)")
        }
        self.name = name
        self.language = language
        self.sdk = sdk
    }

    /// The names a Swift plugin cannot take: a Swift plugin NAME is the module NAME in
    /// `libNAME.so`, and those of ModuleKit and of the toolchain's runtime directory (the
    /// one this process's `libswiftCore.so` comes from: its modules and its `lib*.so`) are
    /// taken. A few always are, should that directory not be found.
    static func takenSwiftNames() -> Set<String> {
        var names: Set<String> = ["ModuleKit", "CModuleHost", "Swift", "Foundation", "FoundationEssentials", "FoundationNetworking",
                                  "FoundationXML", "FoundationInternationalization", "Dispatch", "Glibc", "Synchronization",
                                  "Observation", "Distributed", "RegexBuilder", "XCTest", "Testing", "swiftCore", "dispatch", "BlocksRuntime"]
        let maps = (try? BoundedFile.read("/proc/self/maps", limit: 4 << 20)).map { String(decoding: $0, as: UTF8.self) } ?? ""
        guard let core = maps.split(separator: "\n").lazy.compactMap({ $0.split(separator: " ", omittingEmptySubsequences: true).last })
            .first(where: { $0.hasSuffix("/libswiftCore.so") }) else { return names }
        let directory = String(core.dropLast("/libswiftCore.so".count))
        for entry in (try? FileSystem.names(in: directory)) ?? [] {
            if entry.hasSuffix(".swiftmodule") { names.insert(String(entry.dropLast(".swiftmodule".count))) }
            if entry.hasPrefix("lib"), entry.hasSuffix(".so") { names.insert(String(entry.dropFirst(3).dropLast(3))) }
        }
        return names
    }

    /// File names and contents, in the order they are written.
    var files: [(name: String, text: String)] {
        [("plugin.json", manifest), language == .c ? ("\(moduleName).c", cSource) : ("\(name).swift", swiftSource),
         ("Makefile", makefile), ("README.md", readme)]
    }

    var manifest: String {
        """
        { "name": "\(name)", "version": "1.0.0", "description": "Says hello", "modules": ["\(moduleName)"] }

        """
    }

    var makefile: String {
        """
        PLUGIN = \(name)
        MODHOST_SDK ?= \(sdk)
        include $(MODHOST_SDK)/share/modulehost/plugin.mk

        """
    }

    var readme: String {
        """
        \(name): a ModuleHost plugin in \(language == .c ? "C" : "Swift"). `make` builds build/lib\(name).so, `modhostctl verify --load build/lib\(name).so` checks it (and loads it in a child process, as the daemon would), `modhostd --plugins build` runs it.

        """
    }

    var cSource: String {
        """
        #include <modulehost.h>

        static void *create(const modhost_host_api *host, const char *config_json) {
            (void)config_json;                         /* the module's "configuration", as JSON */
            host->log(MODHOST_LOG_INFO, "hello, world");
            return (void *)host;                       /* your instance state */
        }
        static void handle_event(void *instance, const char *event, const char *payload_json) {
            (void)payload_json;
            const modhost_host_api *host = instance;
            host->log(MODHOST_LOG_INFO, event);        /* "init", "start", ..., "deinit" */
        }
        static void destroy(void *instance) { (void)instance; }

        static const modhost_module modules[] = {{
            .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C,
            .name = "\(moduleName)", .version = "1.0.0",
            .create = create, .handle_event = handle_event, .destroy = destroy,
        }};
        static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(name)", modules);
        MODHOST_PLUGIN_ENTRY { return &plugin; }

        """
    }

    var swiftSource: String {
        """
        import ModuleKit

        public final class \(name)Module: PluginModule {
            public static let name = "\(moduleName)"
            public static let version = "1.0.0"

            public init?(host: isolated HostInstance, configuration: JSONValue) {}

            public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                host.logger(for: Self.name).info("hello: \\(event.name)")
            }
        }

        @_cdecl("modhost_plugin_entry_v1")
        public func modhostPluginEntry() -> UnsafeRawPointer? { PluginExport.plugin("\(name)", modules: [\(name)Module.self]) }

        """
    }
}

extension ControlCommand {
    static let newHelp = """
        USAGE: modhostctl new --swift|--c NAME [--dir DIR] [--prefix PREFIX]

        Writes a plugin directory DIR (default: ./NAME) holding plugin.json, one source file
        with one module (named NAME in lower case), a three-line Makefile that includes
        plugin.mk from PREFIX (default: the prefix of this modhostctl) and a README.md line.
        It builds with `make`, into build/libNAME.so. DIR must not exist or be empty; NAME
        is also a type name in the source, so ASCII letters, digits and '_', starting with
        a letter.
        """

    func newPlugin(_ operands: [String], _ parsed: Arguments) throws -> ExitCode {
        guard operands.count == 1 else { throw UsageError("new takes exactly one NAME") }
        // The Makefile carries the SDK path unquoted: `flags` checks it.
        guard let build = try pluginBuild("new", plugin: operands[0], parsed) else { return .failure }
        let scaffold = try PluginScaffold(name: operands[0], language: build.language, sdk: build.sdk)
        let directory = parsed.value("dir") ?? operands[0]
        let shownDirectory = JSONValue.escapingControlCharacters(directory)
        if let existing = try? FileSystem.names(in: directory), !existing.isEmpty {
            output.err("Error: \(shownDirectory) exists and is not empty; nothing was written. Fix: name a new directory with --dir")
            return .failure
        }
        do {
            try FileSystem.createDirectory(directory, parents: true)
            for file in scaffold.files {
                // Written whole, then renamed: an interrupted run leaves no half file.
                try AtomicFile.write(Array(file.text.utf8), to: directory + "/" + file.name, mode: 0o644)
            }
        } catch {
            output.err("Error: cannot write the plugin into \(shownDirectory): \(error)")
            return .osError
        }
        output.out("""
            wrote \(shownDirectory)/: \(scaffold.files.map(\.name).joined(separator: ", "))
            next: cd \(shownDirectory) && make && modhostctl verify --load build/lib\(scaffold.name).so
            """)
        return .success
    }
}
