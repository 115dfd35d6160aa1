import Foundation
import Glibc
import Testing
import TestSupport

/// The daemon logs what an isolated plugin's worker logs with the plugin's name and the
/// worker's pid (docs/isolation.md). The worker's frames are the plugin's to write: what
/// they say about where a line comes from is not believed.
@Suite(.serialized)
struct IsolatedLogTests {
    /// A C plugin `Liar` whose module, on event `lie`, writes a log frame of its own on the
    /// worker's control socket (descriptor 3) that claims to come from plugin Honest's
    /// module, worker 1; on event `say`, logs through the host as it should.
    static func liar(in directory: String) throws -> String {
        let frame = #"{"op":"log","level":1,"label":"modhostd","message":"claimed line","metadata":[["plugin","Honest"],["module","honest"],["worker","1"],["request","7"]]}"#
        let source = """
            #include <modulehost.h>
            #include <string.h>
            #include <unistd.h>
            static const char frame[] = "\(frame.replacingOccurrences(of: "\"", with: "\\\""))";
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) {
                const modhost_host_api *host = instance;
                (void)payload;
                if (strcmp(event, "lie") == 0) {
                    unsigned long n = sizeof frame - 1;
                    unsigned char header[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n};
                    if (write(3, header, 4) != 4 || write(3, frame, n) != (long)n) {}
                }
                if (strcmp(event, "say") == 0) host->log(MODHOST_LOG_INFO, "honest line");
            }
            static void destroy(void *instance) { (void)instance; }
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "liar", "1.0",
                0, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Liar", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        return try PluginFactory(directory: directory).buildC("Liar", source: source,
                                                              manifest: PluginFactory.manifest(plugin: "Liar", modules: ["liar"]))
    }

    @Test("an isolated plugin cannot make its log lines another plugin's or another worker's", .timeLimit(.minutes(3)))
    func aWorkerCannotLogAsAnotherPlugin() async throws {
        let scratch = TemporaryDirectory("isolated-log")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try DaemonLifecycleTests.Harness(["Counter"], files: [liar],
                                                 config: #"{"plugins": {"Liar": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        #expect(try h.ctl("send", "say", "--to", "liar").status == 0)
        #expect(try h.ctl("send", "lie", "--to", "liar").status == 0)
        #expect(await h.waitFor("claimed line"), "\(h.daemon.text)")
        #expect(await h.waitFor("honest line"), "\(h.daemon.text)")
        let lines = h.daemon.text.split(separator: "\n")
        // A line logged through the host names its module, plugin and worker, once each.
        let honest = try #require(lines.first { $0.contains("honest line") })
        #expect(honest.contains("module=liar plugin=Liar worker=\(pid)"), "\(honest)")
        // What the plugin wrote itself keeps what it may say (its own metadata), not a
        // plugin, module or worker that is not its own.
        let claimed = try #require(lines.first { $0.contains("claimed line") })
        #expect(claimed.contains("plugin=Liar worker=\(pid)"), "\(claimed)")
        #expect(claimed.contains("request=7"), "\(claimed)")
        for lie in ["plugin=Honest", "module=honest", "worker=1 "] {
            #expect(!(claimed + " ").contains(lie), "\(claimed)")
        }
        h.daemon.send(SIGTERM)
        #expect(await h.daemon.wait() == 0, "\(h.daemon.text)")
    }
}
