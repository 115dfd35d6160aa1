import ControlProtocol
import Foundation
import Glibc
import ModuleHost
import ModuleKit
import Testing
import TestSupport

/// `modhostctl metrics` (docs/daemon.md, "Metrics"): exact counts of what a real daemon did,
/// in an exposition a strict parser of the Prometheus text format accepts, and the textfile
/// collector recipe of the document.
@Suite("metrics", .timeLimit(.minutes(5)), .serialized)
struct MetricsTests {
    // MARK: Event names in labels

    /// Counts what it receives; listens to the notification `note`.
    final class Listener: Module {
        let moduleName: String
        var notifications: Set<String> { ["note"] }
        var info: ModuleInfo { ModuleInfo(name: moduleName, version: "1.0") }
        init(name: String) { moduleName = name }

        static func factory(_ name: String) -> ModuleFactory {
            ModuleFactory(name: name, version: "1.0", plugin: "Test") { _, _ in Listener(name: name) }
        }
    }

    @Test("event names from module code are bounded and escaped in the exposition")
    func eventNamesAreBoundedAndEscaped() async throws {
        let host = HostInstance(name: "metrics-test")
        await host.add([Listener.factory("listener")])
        await host.start()
        let hostile = "quote\" backslash\\ newline\n end"
        let control = "esc\u{1B}[31m rlo\u{202E}txt"
        let long = String(repeating: "é", count: 100)  // 200 UTF-8 bytes
        await host.perform { host in
            host.send(.custom(name: hostile, payload: .null))
            host.send(.custom(name: long, payload: .null))
            host.send(.custom(name: control, payload: .null))
            // The same name but for another control character: the same series.
            host.send(.custom(name: control.replacingOccurrences(of: "\u{202E}", with: "\u{7}"), payload: .null))
            for index in 0..<100 { host.send(.custom(name: "e\(index)", payload: .null)) }
            host.post(notification: "note")
        }
        let snapshot = host.metrics.snapshot()
        let report = MetricsReport(
            daemon: .init(pluginsLoaded: 0, modulesRunning: 1, filesRefused: 0, pluginsAdded: 0, pluginsReplaced: 0,
                          pluginsRemoved: 0, refusals: 0, reloads: 0, imagesMapped: 0, imagesMappedBytes: 0, imagesRetired: 0,
                          imagesRetiredBytes: 0, imagesPrivate: 0, imagesPrivateBytes: 0, residentBytes: 0, mappings: 0,
                          uptimeSeconds: 0),
            modules: snapshot.modules.map(MetricsReport.Module.init),
            events: snapshot.eventDeliveries.map { .init(event: $0.event, deliveries: $0.deliveries) }, calls: [], workers: [])
        let text = report.prometheusText
        let parsed = try PrometheusText(text)
        let events = try #require(parsed.family("modhost_event_deliveries_total")).samples
        // 64 names counted apart (the hostile one, the long one cut, the one with control
        // characters, e0...e60), the rest as (other).
        #expect(events.count == HostMetrics.maximumEventNames + 1)
        #expect(parsed.value("modhost_event_deliveries_total", ["event": hostile]) == 1)
        #expect(parsed.value("modhost_event_deliveries_total", ["event": String(repeating: "é", count: 32)]) == 1)
        #expect(parsed.value("modhost_event_deliveries_total", ["event": "e60"]) == 1)
        #expect(parsed.value("modhost_event_deliveries_total", ["event": "e61"]) == nil)
        // e61...e99 and the notification "note", past the bound.
        #expect(parsed.value("modhost_event_deliveries_total", ["event": HostMetrics.otherEventName]) == 40)
        // Control characters, which the format cannot escape, are replaced.
        #expect(parsed.value("modhost_event_deliveries_total", ["event": "esc\u{FFFD}[31m rlo\u{FFFD}txt"]) == 2)
        #expect(!text.unicodeScalars.contains { $0 != "\n" && JSONValue.isControlCharacter($0) })
        #expect(text.contains(#"event="quote\" backslash\\ newline\n end""#))
        #expect(events.allSatisfy { $0.labels["event"]!.utf8.count <= HostMetrics.maximumEventNameLength })
        // init, start, 104 custom events, 1 notification.
        #expect(parsed.value("modhost_module_events_delivered_total", ["module": "listener", "plugin": "Test"]) == 107)
        // Synchronous deliveries are timed one in 64: the 1st and the 65th.
        #expect(parsed.value("modhost_module_handler_seconds_count", ["module": "listener"]) == 2)
        await host.shutdown()
    }

    @Test("the parser of the tests refuses what Prometheus refuses")
    func parserRefusesBrokenExpositions() throws {
        let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n"
        #expect(throws: Never.self) { try PrometheusText(good) }
        for broken in [
            "# HELP a A.\n# TYPE a counter\na 2\n",  // a counter without _total
            "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\n\"} 2\n",  // raw newline in a label
            "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"\\q\"} 2\n",  // unknown escape
            "a_total 2\n",  // no TYPE
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_sum 1\nh_count 2\n",  // no +Inf bucket
            "# HELP a_total A.\n# TYPE a_total counter\na_total 1\na_total 2\n",  // duplicate series
        ] {
            #expect(throws: PrometheusText.Invalid.self, "\(broken)") { try PrometheusText(broken) }
        }
    }

    // MARK: A real daemon

    /// A modhostd on a copy of the example plugins, and a modhostctl wrapper bound to it.
    final class Daemon {
        let root = TemporaryDirectory("metrics")
        let process: RunningProcess
        var socket: String { root.file("modhostd.sock") }
        var modhostctl: String { root.file("bin/modhostctl") }

        init(configuration: String? = nil) async throws {
            let plugins = root.directory("plugins")
            for name in try FileManager.default.contentsOfDirectory(atPath: BuildProducts.pluginDirectory).sorted()
            where name.hasSuffix(".so") {
                try root.copy(BuildProducts.pluginDirectory + "/" + name, as: "plugins/" + name)
            }
            try root.write("plugins/libBroken.so", text: "this is not a plugin\n")
            _ = root.directory("bin")
            let socket = root.file("modhostd.sock")
            try root.write("bin/modhostctl", text: "#!/bin/sh\nexec '\(BuildProducts.modhostctl)' --socket '\(socket)' \"$@\"\n",
                           mode: 0o755)
            var config: String?
            if let configuration { config = try root.write("modhostd.json", text: configuration) }
            process = try RunningProcess(BuildProducts.modhostd, [
                "--plugins", plugins, "--state-dir", root.file("state"), "--socket", socket,
            ] + (config.map { ["--config", $0] } ?? []))
            guard await process.waitFor("control socket ready") else { throw Failure("modhostd did not start:\n\(process.text)") }
        }

        /// Runs modhostctl with `arguments`; throws unless it exits `status`.
        @discardableResult
        func ctl(_ arguments: [String], status: Int32 = 0) throws -> String {
            let result = try run(modhostctl, arguments)
            guard result.status == status else {
                throw Failure("modhostctl \(arguments.joined(separator: " ")) exited \(result.status), not \(status): \(result.standardOutput)\(result.standardError)")
            }
            return result.standardOutput
        }

        func stop() async {
            process.send(SIGTERM)
            let status = await process.wait()
            #expect(status == 0, "modhostd exited \(status):\n\(process.text)")
        }
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    @Test("a daemon counts the events and calls it ran, exactly, in text and in JSON", .timeLimit(.minutes(3)))
    func daemonCountsEventsAndCalls() async throws {
        let daemon = try await Daemon()
        let before = try PrometheusText(daemon.ctl(["metrics"]))
        let modules = try #require(before.family("modhost_module_events_delivered_total")).samples.map { $0.labels["module"]! }
        #expect(Set(modules) == ["calculator", "counter", "greeting", "welcome"])
        // Every module got init and start, nothing else yet.
        for module in modules { #expect(before.value("modhost_module_events_delivered_total", ["module": module]) == 2) }
        #expect(before.value("modhost_plugins_loaded") == 4)
        #expect(before.value("modhost_plugin_files_refused") == 1)
        #expect(before.value("modhost_plugin_changes_total", ["change": "added"]) == 4)
        #expect(before.value("modhost_plugin_changes_total", ["change": "refused"]) == 1)
        // In process, every image is a memory file: none is a copy on disk.
        #expect(before.value("modhost_images_private") == 0)
        #expect(before.value("modhost_images_mapped") == 4)
        #expect(before.value("modhost_images_retired") == 0)
        #expect(before.value("modhost_reloads_total") == 0)
        #expect((before.value("modhost_resident_memory_bytes") ?? 0) > 1_000_000)
        #expect((before.value("modhost_memory_mappings") ?? 0) > 10)
        // The standard names, and what the daemon is.
        #expect(before.value("process_resident_memory_bytes") == before.value("modhost_resident_memory_bytes"))
        let now = Double(time(nil))
        #expect((before.value("process_start_time_seconds") ?? 0) > now - 3600 && (before.value("process_start_time_seconds") ?? 0) <= now + 1)
        #expect(before.value("modhost_build_info", ["release": HostSDK.release, "abi": "\(HostSDK.abiMajor).\(HostSDK.abiMinor)",
                                                    "modulekit": HostSDK.current.moduleKit, "swift": HostSDK.current.compilerVersion]) == 1)

        for _ in 0..<3 { try daemon.ctl(["send", "beat"]) }
        for _ in 0..<2 { try daemon.ctl(["send", "--to", "counter", "--await", "beat"]) }
        for index in 0..<4 { #expect(try daemon.ctl(["call", "Calculator", "calc_add", "\(index)", "40"]) == "\(index + 40)\n") }
        try daemon.ctl(["call", "Calculator", "calc_add", "forty", "2"], status: 1)
        try daemon.ctl(["call", "Calculator", "no_such_function"], status: 1)
        try daemon.ctl(["reload"])

        let after = try PrometheusText(daemon.ctl(["metrics"]))
        // counter: init, start, 3 beats, 2 awaited beats; its handler time: the init (the
        // 1st synchronous delivery) and both awaited beats.
        #expect(after.value("modhost_module_events_delivered_total", ["module": "counter", "plugin": "Counter"]) == 7)
        #expect(after.value("modhost_module_handler_seconds_count", ["module": "counter"]) == 3)
        #expect(after.value("modhost_module_handler_seconds_bucket", ["module": "counter", "le": "+Inf"]) == 3)
        for module in modules where module != "counter" {
            #expect(after.value("modhost_module_events_delivered_total", ["module": module]) == 5)
            #expect(after.value("modhost_module_handler_seconds_count", ["module": module]) == 1)
        }
        #expect(after.value("modhost_module_deadline_overruns_total", ["module": "counter"]) == 0)
        #expect(after.value("modhost_module_errors_total", ["module": "counter", "error": "not_delivered"]) == 0)
        #expect(after.value("modhost_event_deliveries_total", ["event": "beat"]) == Double(3 * 4 + 2))
        let add = ["plugin": "Calculator", "function": "calc_add"]
        #expect(after.value("modhost_calls_total", add) == 5)
        #expect(after.value("modhost_call_seconds_count", add) == 5)
        #expect(after.value("modhost_call_errors_total", add.merging(["code": "invalid_arguments"]) { $1 }) == 1)
        let undeclared = ["plugin": "Calculator", "function": "(undeclared)"]
        #expect(after.value("modhost_calls_total", undeclared) == 1)
        #expect(after.value("modhost_call_errors_total", undeclared.merging(["code": "unknown_function"]) { $1 }) == 1)
        #expect(after.value("modhost_reloads_total") == 1)

        // The same data as JSON.
        let json = try JSONValue.parse(Array(daemon.ctl(["--json", "metrics"]).utf8))
        let report = try json.decode(MetricsReport.self)
        let counter = try #require(report.modules.first { $0.module == "counter" })
        #expect(counter.eventsDelivered == 7)
        #expect(counter.handlerSeconds.count == 3)
        #expect(report.calls.first { $0.function == "calc_add" }?.calls == 5)
        #expect(report.daemon.pluginsLoaded == 4)
        #expect(report.daemon.reloads == 1)
        await daemon.stop()
    }

    @Test("an isolated plugin's worker restarts, crashes and RSS, and its calls", .timeLimit(.minutes(3)))
    func isolatedWorkerSeries() async throws {
        let daemon = try await Daemon(configuration: #"{"plugins": {"Calculator": {"isolation": "process"}}}"#)
        for _ in 0..<2 { #expect(try daemon.ctl(["call", "Calculator", "calc_add", "40", "2"]) == "42\n") }
        try daemon.ctl(["call", "Calculator", "calc_add", "forty", "2"], status: 1)
        func calculator() throws -> JSONValue? {
            let rows = try JSONValue.parse(Array(daemon.ctl(["--json", "list"]).utf8))["modules"]
            guard case .array(let list)? = rows else { return nil }
            return list.first { $0["module"] == "calculator" }
        }
        guard case .number(let pid)? = try calculator()?["workerPid"] else {
            Issue.record("no worker pid for calculator: \(daemon.process.text)")
            return
        }
        let before = try PrometheusText(daemon.ctl(["metrics"]))
        #expect(before.value("modhost_worker_restarts_total", ["plugin": "Calculator"]) == 0)
        #expect(before.value("modhost_worker_crashes_total", ["plugin": "Calculator"]) == 0)
        #expect((before.value("modhost_worker_resident_memory_bytes", ["plugin": "Calculator"]) ?? 0) > 100_000)
        #expect(before.value("modhost_worker_up", ["plugin": "Calculator"]) == 1)
        #expect(before.value("modhost_worker_quarantined", ["plugin": "Calculator"]) == 0)
        // Only the in-process plugins are mapped in the daemon.
        #expect(before.value("modhost_images_mapped") == 3)

        kill(Int32(pid), SIGKILL)
        let deadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < deadline {
            if let row = try calculator(), row["restarts"] == 1, row["state"] == "running" { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(try daemon.ctl(["call", "Calculator", "calc_add", "1", "2"]) == "3\n")
        let after = try PrometheusText(daemon.ctl(["metrics"]))
        #expect(after.value("modhost_worker_restarts_total", ["plugin": "Calculator"]) == 1)
        #expect(after.value("modhost_worker_crashes_total", ["plugin": "Calculator"]) == 1)
        #expect((after.value("modhost_worker_resident_memory_bytes", ["plugin": "Calculator"]) ?? 0) > 100_000)
        #expect(after.value("modhost_worker_up", ["plugin": "Calculator"]) == 1)
        let add = ["plugin": "Calculator", "function": "calc_add"]
        #expect(after.value("modhost_calls_total", add) == 4)
        #expect(after.value("modhost_call_seconds_count", add) == 4)
        #expect(after.value("modhost_call_errors_total", add.merging(["code": "invalid_arguments"]) { $1 }) == 1,
                "\(after.family("modhost_call_errors_total")?.samples ?? [])")

        // A new version of the plugin runs in a new worker; the counters go on (docs/daemon.md).
        let file = daemon.root.file("plugins/libCalculator.so")
        guard case .object(var manifest) = try JSONValue.parse(Array(PluginFactory.embeddedManifest(file).utf8)) else {
            Issue.record("libCalculator.so has no manifest object")
            return
        }
        manifest["version"] = .string("9.9.9")
        try PluginFactory(directory: daemon.root.directory("next")).withManifest(file, JSONValue.object(manifest).jsonText, as: "libCalculator.so")
        #expect(rename(daemon.root.file("next/libCalculator.so"), file) == 0)
        #expect(await daemon.process.waitFor("by 9.9.9"), "\(daemon.process.text)")
        #expect(try daemon.ctl(["call", "Calculator", "calc_add", "1", "2"]) == "3\n")
        let replaced = try PrometheusText(daemon.ctl(["metrics"]))
        #expect(replaced.value("modhost_worker_restarts_total", ["plugin": "Calculator"]) == 1)
        #expect(replaced.value("modhost_worker_crashes_total", ["plugin": "Calculator"]) == 1)
        await daemon.stop()
    }

    /// Outside run: a C module that lists a notification name C must never see (here one
    /// that breaks the name grammar) was counted as given it each time another module
    /// posted it, in its `eventsDelivered` and the name's deliveries, although it refused
    /// it (one `not_delivered` error and one warning per post). Such a name is now no name
    /// it listens to: said once when it is created, never counted.
    @Test("a notification a C module refuses by name is not counted as delivered to it", .timeLimit(.minutes(3)),
          arguments: ["in-process", "process"])
    func aNotificationRefusedByNameIsNotCounted(isolation: String) async throws {
        let scratch = TemporaryDirectory("refused-notification")
        let deaf = try PluginFactory(directory: scratch.directory("deaf")).buildC(
            "Deaf", source: PluginFactory.cSource(plugin: "Deaf", modules: ["deaf"]).replacingOccurrences(
                of: #"notes[] = {"ping", NULL}"#, with: #"notes[] = {"bad name", "heard", NULL}"#),
            manifest: PluginFactory.manifest(plugin: "Deaf", modules: ["deaf"]))
        let poster = try PluginFactory(directory: scratch.directory("poster")).buildC("Poster", source: """
            #include <modulehost.h>
            #include <string.h>
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) {
                const modhost_host_api *host = instance;
                (void)payload;
                if (strcmp(event, "shout") != 0) return;
                host->post_notification("bad name", NULL);
                host->post_notification("heard", NULL);
            }
            static void destroy(void *instance) { (void)instance; }
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "poster", "1.0",
                NULL, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Poster", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """, manifest: PluginFactory.manifest(plugin: "Poster", modules: ["poster"]))
        let h = try DaemonLifecycleTests.Harness([], files: [deaf, poster],
                                                 config: #"{"plugins": {"Deaf": {"isolation": "\#(isolation)"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let before = try PrometheusText(h.ctl("metrics").standardOutput)
        let delivered = try #require(before.value("modhost_module_events_delivered_total", ["module": "deaf"]), "\(h.daemon.text)")
        #expect(try h.ctl("send", "shout", "--to", "poster").status == 0)
        // Delivered in the order posted: once heard is, the first post is behind it.
        #expect(await h.waitFor("event heard -"), "\(h.daemon.text)")
        let after = try PrometheusText(h.ctl("metrics").standardOutput)
        #expect(after.value("modhost_module_events_delivered_total", ["module": "deaf"]) == delivered + 1,
                "\(after.family("modhost_module_events_delivered_total")?.samples ?? [])")
        #expect(after.value("modhost_event_deliveries_total", ["event": "heard"]) == 1)
        #expect(after.value("modhost_event_deliveries_total", ["event": "bad name"]) == nil,
                "\(after.family("modhost_event_deliveries_total")?.samples ?? [])")
        #expect(after.value("modhost_module_errors_total", ["module": "deaf", "error": "not_delivered"]) ?? 0 == 0)
        // Said once, at its creation, naming the module and the name.
        let said = h.daemon.text.split(separator: "\n").filter { $0.contains(#""bad name""#) }
        #expect(said.count == 1 && said[0].contains("module=deaf") && said[0].contains("never delivered"), "\(h.daemon.text)")
        #expect(await h.stop() == 0)
    }

    // MARK: The textfile collector recipe

    @Test("the documented systemd and cron command lines leave a file the textfile collector accepts", .timeLimit(.minutes(3)))
    func textfileCollectorRecipe() async throws {
        let document = try String(contentsOfFile: BuildProducts.packageRoot + "/docs/daemon.md", encoding: .utf8)
        let lines = document.split(separator: "\n").map(String.init)
        let service = try #require(lines.first { $0.hasPrefix("ExecStart=/bin/sh -c '") && $0.contains("modhostctl metrics") })
        let cron = try #require(lines.first { $0.hasPrefix("* * * * * root ") && $0.contains("modhostctl metrics") })
        let commands = [
            String(service.dropFirst("ExecStart=/bin/sh -c '".count).dropLast()),
            String(cron.dropFirst("* * * * * root ".count)),
        ]
        #expect(commands[0] == commands[1], "the systemd unit and the cron line should run the same command")
        let daemon = try await Daemon()
        let collector = daemon.root.directory("textfile_collector")
        for command in commands {
            let local = command.replacingOccurrences(of: "/usr/local/bin/modhostctl", with: daemon.modhostctl)
                .replacingOccurrences(of: "/var/lib/node_exporter/textfile_collector", with: collector)
            #expect(local != command)
            let result = try run("/bin/sh", ["-c", local])
            #expect(result.status == 0, "\(local): \(result.standardError)")
            // Only the final file is left, whole.
            #expect(try FileManager.default.contentsOfDirectory(atPath: collector) == ["modhostd.prom"])
            let parsed = try PrometheusText(String(contentsOfFile: collector + "/modhostd.prom", encoding: .utf8))
            #expect(parsed.value("modhost_plugins_loaded") == 4)
            #expect(parsed.family("modhost_module_handler_seconds")?.type == "histogram")
        }
        // The daemon gone, the command fails and keeps the last file rather than truncate it.
        await daemon.stop()
        let local = commands[0].replacingOccurrences(of: "/usr/local/bin/modhostctl", with: daemon.modhostctl)
            .replacingOccurrences(of: "/var/lib/node_exporter/textfile_collector", with: collector)
        let failed = try run("/bin/sh", ["-c", local])
        #expect(failed.status == 69)
        #expect(try PrometheusText(String(contentsOfFile: collector + "/modhostd.prom", encoding: .utf8)).value("modhost_plugins_loaded") == 4)
    }
}
