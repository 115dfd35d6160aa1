import Foundation
@testable import ModuleHost
import ModuleKit
import Testing
import TestSupport

/// A C module is given a custom event or a notification only when its name is within the
/// name grammar and is not a lifecycle name (which only the host itself sends), however
/// often it was given an admitted name before: the check is skipped for a name it admitted
/// last, never for another.
@Suite(.timeLimit(.minutes(5))) struct CModuleAdmissionTests {
    let dir = TemporaryDirectory("c-admission")
    var eventsFile: String { dir.file("events.txt") }

    /// A C module "listener" that appends "EVENT" to `eventsFile` for every event.
    var source: String {
        """
        #include <modulehost.h>
        #include <stdio.h>
        static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
        static void handle(void *self, const char *event, const char *payload) {
            (void)self; (void)payload;
            FILE *out = fopen("\(eventsFile)", "a");
            if (out) { fprintf(out, "%s\\n", event); fclose(out); }
        }
        static void destroy(void *self) { (void)self; }
        static const modhost_module modules[] = {{
            .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "listener", .version = "1.0",
            .create = create, .handle_event = handle, .destroy = destroy,
        }};
        static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Listener", modules);
        MODHOST_PLUGIN_ENTRY { return &plugin; }
        """
    }

    @Test func aLifecycleOrInvalidNameIsRefusedRightAfterAnAdmittedOne() async throws {
        _ = try PluginFactory(directory: dir.path).buildC("Listener", source: source,
                                                          manifest: PluginFactory.manifest(plugin: "Listener", modules: ["listener"]))
        let load = try await StartupLoad(directories: [dir.path], host: HostInstance(name: "c-admission"))
        try #require(load.loaded == ["Listener"], "\(load.refused)")
        let host = load.host
        await load.set.start()
        // Through the host instance (CModule.handle) and from an isolated plugin's ordered
        // thread (CModule.Delivery.deliverHere): each refused name right after "tick" was
        // admitted, and "tick" again after each refusal.
        let refused = ["deinit", "start", "bad name", "tick\u{0}x", "init"]
        // The host's own start was the last event it was given.
        await host.send(ModuleEvent.custom(name: "start", payload: .null), to: "listener")
        for name in refused {
            await host.send(ModuleEvent.custom(name: "tick", payload: .null), to: "listener")
            await host.send(ModuleEvent.custom(name: name, payload: .null), to: "listener")
        }
        let delivery = try #require(await host.perform { ($0.module(named: "listener") as? CModule)?.delivery })
        for name in refused {
            #expect(delivery.deliverHere(.notification(name: "tock", payload: .null)) == nil)
            #expect(delivery.deliverHere(.notification(name: name, payload: .null)) == nil)
            #expect(delivery.deliverHere(.custom(name: name, payload: .null)) == nil)
        }
        let notDelivered = host.metrics.module(named: "listener").snapshot().errors[.notDelivered]
        await load.shutdown()
        let events = try String(contentsOfFile: eventsFile, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(events == ["init", "start"] + Array(repeating: "tick", count: 5) + Array(repeating: "tock", count: 5) + ["willTerminate", "deinit"])
        #expect(notDelivered == UInt64(1 + refused.count * 3))
    }

    /// A C module whose `create` overruns the event deadline is stuck, and the host's
    /// `init` and `start` wait for `create` to return, then run in order, before any event
    /// sent after it returned: the module never runs without them (found from outside: they
    /// were dropped, and the module got events after `create` returned with neither).
    @Test func aCreatePastItsDeadlineIsFollowedByInitAndStartWhenItReturns() async throws {
        let slow = source.replacingOccurrences(
            of: "static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }",
            with: "#include <unistd.h>\nstatic void *create(const modhost_host_api *host, const char *config) { (void)config; sleep(1); return (void *)host; }")
        #expect(slow != source)
        _ = try PluginFactory(directory: dir.path).buildC("Listener", source: slow,
                                                          manifest: PluginFactory.manifest(plugin: "Listener", modules: ["listener"]))
        let load = try await StartupLoad(directories: [dir.path], host: HostInstance(name: "c-admission", eventDeadline: .milliseconds(100)))
        try #require(load.loaded == ["Listener"], "\(load.refused)")
        let host = load.host
        await load.set.start()
        let delivery = try #require(await host.perform { ($0.module(named: "listener") as? CModule)?.delivery })
        #expect(delivery.worker.stuck?.what == "create", "create (1 s) overran the deadline of 0.1 s")
        var returned = false
        for _ in 0..<200 where !returned {
            try await Task.sleep(for: .milliseconds(50))
            returned = delivery.worker.stuck == nil
        }
        #expect(returned, "create returned within 10 s")
        await host.send(ModuleEvent.custom(name: "tick", payload: .null), to: "listener")
        await load.shutdown()
        let events = try String(contentsOfFile: eventsFile, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(events == ["init", "start", "tick", "willTerminate", "deinit"])
    }
}
