import Foundation
import PluginFormat

/// Builds real plugin files for tests: C plugins compiled with the system C compiler
/// against the installed header, with a manifest embedded the way plugin.mk does it, and
/// variants broken on purpose.
public struct PluginFactory: Sendable {
    public let directory: String
    /// The SDK layout whose `include/modulehost.h` plugins are compiled against.
    public let sdk: String

    /// `sdk`: the SDK layout to compile against; the one `make` produced when nil.
    public init(directory: String, sdk: String? = nil) {
        self.directory = directory
        self.sdk = sdk ?? BuildProducts.directory
    }

    /// A C module descriptor and entry for a plugin providing `modules`; each module logs
    /// its events through the host. `entryBody` replaces the entry function's body.
    public static func cSource(plugin: String, modules: [String], abiMajor: String = "MODHOST_ABI_MAJOR",
                               entryBody: String? = nil, extra: String = "") -> String {
        let descriptors = modules.map { name in
            """
                {.struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "\(name)", .version = "1.0",
                 .notifications = notes, .create = create, .handle_event = handle, .destroy = destroy},
            """
        }.joined(separator: "\n")
        return """
            #include <modulehost.h>
            #include <stdio.h>
            #include <stdlib.h>
            typedef struct { const modhost_host_api *host; } instance;
            static const char *const notes[] = {"ping", NULL};
            static void *create(const modhost_host_api *host, const char *config) {
                instance *self = malloc(sizeof *self); self->host = host;
                char line[256]; snprintf(line, sizeof line, "create %s", config); host->log(MODHOST_LOG_INFO, line);
                return self;
            }
            static void handle(void *raw, const char *event, const char *payload) {
                instance *self = raw; char line[256];
                snprintf(line, sizeof line, "event %s %s", event, payload ? payload : "-");
                self->host->log(MODHOST_LOG_INFO, line);
            }
            static void destroy(void *raw) { free(raw); }
            static const modhost_module modules[] = {
            \(descriptors)
            };
            static const modhost_plugin plugin = {sizeof(modhost_plugin), \(abiMajor), MODHOST_ABI_MINOR,
                sizeof(modules) / sizeof(modules[0]), "\(plugin)", modules};
            \(extra)
            MODHOST_PLUGIN_ENTRY { \(entryBody ?? "return &plugin;") }
            """
    }

    /// The manifest JSON text for a C plugin.
    public static func manifest(plugin: String, modules: [String], dependencies: [String] = [], order: Int = 0,
                                exports: [(String, String)] = [], abi: String = "1.0") -> String {
        let exportList = exports.map { "{\"name\":\"\($0.0)\",\"signature\":\"\($0.1)\"}" }.joined(separator: ",")
        return """
            {"name":"\(plugin)","version":"1.0","description":"test plugin","abi":"\(abi)","language":"c",\
            "dependencies":[\(dependencies.map { "\"\($0)\"" }.joined(separator: ","))],"order":\(order),\
            "modules":[\(modules.map { "\"\($0)\"" }.joined(separator: ","))],"exports":[\(exportList)]}
            """
    }

    /// Compiles `source` into `lib<plugin>.so` in the factory's directory and embeds
    /// `manifest` (nil: no manifest section). `flags` go to the compiler (e.g. `-lA`).
    @discardableResult
    public func buildC(_ plugin: String, source: String, manifest: String?, flags: String = "",
                       fileName: String? = nil) throws -> String {
        let work = directory + "/.work-\(plugin)"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        try source.write(toFile: work + "/plugin.c", atomically: true, encoding: .utf8)
        let output = directory + "/" + (fileName ?? "lib\(plugin).so")
        try shell("cc -std=c11 -fPIC -shared -fvisibility=hidden -I '\(sdk)/include' -L '\(directory)' "
                  + "-Wl,-soname,lib\(plugin).so -Wl,-z,nodelete plugin.c \(flags) -o '\(work)/lib.so'", directory: work)
        if let manifest {
            try manifest.write(toFile: work + "/manifest.json", atomically: true, encoding: .utf8)
            try shell("objcopy --add-section .modhost.manifest=manifest.json --set-section-flags .modhost.manifest=readonly lib.so '\(output)'",
                      directory: work)
        } else {
            try shell("cp lib.so '\(output)'", directory: work)
        }
        try FileManager.default.removeItem(atPath: work)
        return output
    }

    /// Replaces the manifest of a copy of `source` with `manifest`; returns the copy's path.
    @discardableResult
    public func withManifest(_ source: String, _ manifest: String, as name: String) throws -> String {
        let output = directory + "/" + name
        let text = directory + "/.manifest-\(name).json"
        try manifest.write(toFile: text, atomically: true, encoding: .utf8)
        try shell("objcopy --update-section .modhost.manifest='\(text)' '\(source)' '\(output)' && chmod 644 '\(output)'")
        try FileManager.default.removeItem(atPath: text)
        return output
    }

    /// The manifest embedded in `file`, as text ("" when it has none).
    public static func embeddedManifest(_ file: String) throws -> String {
        let bytes = try ELFImage(path: file).manifestContents() ?? []
        return String(decoding: bytes, as: UTF8.self)
    }
}
