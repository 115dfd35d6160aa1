import Foundation
import DaemonKit
import Glibc
import ModuleHost
import ModuleKit
import TestSupport

/// ModuleHost against its peers on the same work, each run the way its users run it:
/// libpeas 1.34 (GNOME's plugin engine) and a bare C loop, on N generated trivial C plugins
/// (count the events they get; at start and stop, send their own clock reading when asked).
///
/// The peers are the C programs of Tests/Peer, which `make bench` builds into `programs`:
/// `peer-timer` (fork to READY=1, CPU time and peak RSS then), `peer-peas-host`,
/// `peer-bare-host` and `peer-floor-host` (the work a start must do to keep modhostd's
/// promises, in C). The plugins are compiled from the templates there (`sources`) into
/// work/src. Rows compare modhostd (the release build) or ModuleHost in process with
/// peer-peas-host; the bare loop's figures are given in the words and in report rows.
struct PeerBenchmark {
    let sdk: String
    let work: String
    let programs: String
    let sources: String

    let sizes = [0, 10, 100, 1000]
    /// Plugins 0..<1000 make up the sets, the next `hotAdds` are added while the hosts run,
    /// the last one is replaced.
    let hotAdds = 100
    let replaces = 20
    var replacedIndex: Int { 1000 + hotAdds }

    /// Why the group cannot run here, or nil when it can.
    static func unavailable(programs: String?, sources: String?) -> String? {
        guard let programs, let sources else {
            return "modhost-bench was not given --peer-programs and --peer-sources (make bench passes them)"
        }
        guard (try? shell("pkg-config --exists libpeas-1.0")) != nil else {
            return "libpeas-1.0 is not installed (pkg-config finds no libpeas-1.0): run make deps as root, or apt-get install --no-install-recommends libpeas-dev"
        }
        for program in ["peer-timer", "peer-peas-host", "peer-bare-host", "peer-floor-host", "peer-contained-loop"] where access(programs + "/" + program, X_OK) != 0 {
            return "\(programs)/\(program) is missing: make bench builds it"
        }
        for template in ["modhost-plugin.c", "peas-plugin.c", "peer-plugin.h"] where access(sources + "/" + template, R_OK) != 0 {
            return "\(sources)/\(template) is missing"
        }
        return nil
    }

    func run() async throws -> [BenchRow] {
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        try "{}\n".write(toFile: configuration, atomically: true, encoding: .utf8)
        try generate(count: replacedIndex + 1)
        var rows = try startToReady()
        rows += try await dispatch()
        rows += try await hot()
        rows.append(try await idleWorker())
        return rows
    }

    // MARK: the plugins

    enum System: String {
        case modhost, peas

        /// The files of plugin `index`, the one that makes it a plugin last.
        func files(_ index: Int) -> [String] {
            switch self {
            case .modhost: [String(format: "libPeer%05d.so", index)]
            case .peas: [String(format: "libpeer%05d.so", index), String(format: "peer%05d.plugin", index)]
            }
        }
    }

    /// The module name of plugin `index`, the same in both systems (and in its clock readings).
    func module(_ index: Int) -> String { String(format: "peer%05d", index) }

    /// An empty `{}` configuration, so that no modhostd.json of this machine counts.
    var configuration: String { work + "/modhostd.json" }

    /// Compiles plugins 0..<count of both systems into work/src/modhost and work/src/peas
    /// (make keeps those that are up to date with the templates).
    func generate(count: Int) throws {
        let src = work + "/src"
        for system in ["modhost", "peas"] {
            try FileManager.default.createDirectory(atPath: src + "/" + system, withIntermediateDirectories: true)
        }
        var makefile = """
            SOURCES = \(sources)
            CFLAGS = -O2 -fPIC -shared -fvisibility=hidden -I$(SOURCES) -I\(sdk)/include
            PEAS = $(shell pkg-config --cflags libpeas-1.0) -Wl,--as-needed $(shell pkg-config --libs libpeas-1.0)
            all:
            """
        for index in 0..<count {
            let name = String(format: "%05d", index)
            makefile += " modhost/libPeer\(name).so peas/libpeer\(name).so peas/peer\(name).plugin"
        }
        makefile += """


            modhost/libPeer%.so: $(SOURCES)/modhost-plugin.c $(SOURCES)/peer-plugin.h
            \tcc $(CFLAGS) -DPEER_PLUGIN='"Peer$*"' -DPEER_MODULE='"peer$*"' $< -o $@.tmp
            \tprintf '{"name":"Peer$*","version":"1.0","description":"generated","abi":"1.0","language":"c","order":%d,"modules":["peer$*"]}' $$(expr $* + 0) > $@.json
            \tobjcopy --add-section .modhost.manifest=$@.json --set-section-flags .modhost.manifest=readonly $@.tmp $@ && rm $@.tmp $@.json
            peas/libpeer%.so: $(SOURCES)/peas-plugin.c $(SOURCES)/peer-plugin.h
            \tcc $(CFLAGS) -DPEER_MODULE='"peer$*"' $< -o $@.tmp $(PEAS) && mv $@.tmp $@
            peas/peer%.plugin:
            \tprintf '[Plugin]\\nModule=peer$*\\nName=peer$*\\nVersion=1.0\\n' > $@

            """
        try makefile.write(toFile: src + "/Makefile", atomically: true, encoding: .utf8)
        try shell("make -s -j2 -C '\(src)'")
    }

    /// A fresh directory holding copies of plugins 0..<size of `system`.
    func set(_ system: System, _ size: Int) throws -> String {
        let directory = work + "/set/\(system.rawValue)-n\(size)"
        try? FileManager.default.removeItem(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        chmod(directory, 0o755)
        for index in 0..<size {
            for file in system.files(index) {
                try FileManager.default.copyItem(atPath: "\(work)/src/\(system.rawValue)/\(file)", toPath: directory + "/" + file)
            }
        }
        return directory
    }

    // MARK: start to READY=1

    struct Ready {
        /// Milliseconds from fork to READY=1, CPU milliseconds spent by then, peak RSS in KiB.
        var wall: Double, cpu: Double, peakKiB: Double
    }

    /// `command` started by peer-timer. A host that writes anything to standard error (at
    /// modhostd's --log-level warning: a refused plugin, say) fails the benchmark: the run
    /// may not have done the work measured.
    func timeToReady(_ command: [String]) throws -> Ready {
        let output = try run([programs + "/peer-timer", "--rss", "--"] + command)
        let messages = (try? String(contentsOfFile: errorLog, encoding: .utf8)) ?? ""
        guard messages.isEmpty else {
            throw BenchError("\(command.joined(separator: " ")) wrote to standard error:\n\(messages.suffix(2000))")
        }
        var fields: [String: Double] = [:]
        for pair in output.split(separator: " ") {
            let parts = pair.split(separator: "=")
            if parts.count == 2, let value = Double(parts[1]) { fields[String(parts[0])] = value }
        }
        guard let wall = fields["ready_ns"], let cpu = fields["cpu_ns"], let kib = fields["hwm_kib"] else {
            throw BenchError("peer-timer printed \(output)")
        }
        return Ready(wall: wall / 1e6, cpu: cpu / 1e6, peakKiB: kib)
    }

    func startToReady() throws -> [BenchRow] {
        var modhost: [Int: [Ready]] = [:], peas: [Int: [Ready]] = [:], bare: [Int: [Ready]] = [:], floor: [Int: [Ready]] = [:]
        for size in sizes {
            let modhostSet = try set(.modhost, size), peasSet = try set(.peas, size)
            try shell("find '\(modhostSet)' '\(peasSet)' -type f -exec cat {} + > /dev/null")  // page cache warm
            var state = 0
            func modhostd() throws -> Ready {
                let directory = work + "/ready/state-\(state)"
                state += 1
                defer {
                    try? FileManager.default.removeItem(atPath: directory)
                    unlink(directory + ".sock.lock")
                }
                return try timeToReady([sdk + "/bin/modhostd", "--config", configuration, "--plugins", modhostSet,
                                        "--state-dir", directory, "--socket", directory + ".sock", "--log-level", "warning"])
            }
            let peasHost = [programs + "/peer-peas-host", peasSet], bareHost = [programs + "/peer-bare-host", modhostSet]
            let floorState = try freshDirectory(work + "/ready/floor")
            let floorHost = [programs + "/peer-floor-host", floorState, modhostSet]
            // One untimed run of each warms their own files too.
            _ = try modhostd()
            _ = try timeToReady(peasHost)
            _ = try timeToReady(bareHost)
            _ = try timeToReady(floorHost)
            for _ in 0..<(size >= 1000 ? 5 : 7) {
                modhost[size, default: []].append(try modhostd())
                peas[size, default: []].append(try timeToReady(peasHost))
                bare[size, default: []].append(try timeToReady(bareHost))
                floor[size, default: []].append(try timeToReady(floorHost))
            }
        }

        func wall(_ runs: [Int: [Ready]], _ size: Int) -> Double { median(runs[size]!.map(\.wall)) }
        func peakMiB(_ runs: [Int: [Ready]], _ size: Int) -> Double { median(runs[size]!.map(\.peakKiB)) / 1024 }
        let how = "fork to READY=1 on NOTIFY_SOCKET, timed by peer-timer; page cache warm; median of"
        let modhostdRun = "modhostd: release build, a fresh state directory each run in build/bench/work, --log-level warning"
        var rows: [BenchRow] = []
        for size in sizes {
            let runs = modhost[size]!.count
            rows.append(BenchRow(
                name: "peer.start_to_ready.n\(size)", value: wall(modhost, size), unit: "ms", baseline: wall(peas, size),
                baselineDescription: "peer-peas-host on the same \(size) plugins as libpeas plugins (libpeas 1.34: add_search_path, load_plugin each, a PeasActivatable extension set activated: init + start), \(how) \(runs) alternating runs; \(modhostdRun); the bare C loop (peer-bare-host: dlopen, dlsym, entry, create, init, start) took \(format(wall(bare, size))) ms",
                target: size <= 10 ? 1.5 : 1.0))
        }
        for size in sizes {
            rows.append(BenchRow(
                name: "peer.start_to_ready_vs_bare.n\(size)", value: wall(modhost, size), unit: "ms", baseline: wall(bare, size),
                baselineDescription: "peer-bare-host on the same \(size) ModuleHost plugin files (dlopen RTLD_NOW, dlsym, entry, create, init, start, in one process, no checks), \(how) \(modhost[size]!.count) alternating runs (report only)",
                target: nil))
        }
        for size in sizes {
            rows.append(BenchRow(
                name: "peer.start_to_ready_vs_floor.n\(size)", value: wall(modhost, size), unit: "ms", baseline: wall(floor, size),
                baselineDescription: "peer-floor-host on the same \(size) ModuleHost plugin files: the work a start must do to keep modhostd's promises, in C (no symlink followed, owner and mode, the whole file read once and hashed, ELF headers and the entry and ownership checks on .dynsym, a sealed memory image dlopened, the crash recorder told, the in-flight record written around each phase, plugin code on a second thread with a deadline: one hand-over per plugin, one for all inits, one for all starts), \(how) \(modhost[size]!.count) alternating runs (report only)",
                target: nil))
        }
        let perPlugin1000 = (wall(modhost, 1000) - wall(modhost, 0)) / 1000 * 1000
        let perPlugin100 = (wall(modhost, 100) - wall(modhost, 0)) / 100 * 1000
        rows.append(BenchRow(
            name: "peer.start_to_ready.per_plugin_n1000_vs_n100", value: perPlugin1000, unit: "us", baseline: perPlugin100,
            baselineDescription: "modhostd's own (time(n100) - time(n0)) / 100 from the rows above; value: (time(n1000) - time(n0)) / 1000 (libpeas: \(format((wall(peas, 1000) - wall(peas, 0)) * 1000 / 1000)) and \(format((wall(peas, 100) - wall(peas, 0)) * 1000 / 100)) us)",
            target: 1.2))
        let cpu1000 = median(modhost[1000]!.map(\.cpu))
        rows.append(BenchRow(
            name: "peer.cpu_at_ready.n1000", value: cpu1000, unit: "ms", baseline: wall(modhost, 1000),
            baselineDescription: "modhostd's wall time from fork to READY=1 with 1000 plugins; value: its CPU time by then (user + system, all threads), medians of the same runs; above 1: more than one core busy (libpeas: \(format(median(peas[1000]!.map(\.cpu)))) ms CPU in \(format(wall(peas, 1000))) ms)",
            target: 1.0))
        let n0MiB = peakMiB(modhost, 0)
        rows.append(BenchRow(
            name: "peer.rss.n0", value: n0MiB, unit: "MiB", baseline: peakMiB(peas, 0),
            baselineDescription: "peak RSS (VmHWM) of peer-peas-host at READY=1 with no plugin; value: modhostd's, medians of the start-to-ready runs; report only: the target is absolute, modhostd at most 12 MiB (\(n0MiB <= 12 ? "met" : "NOT met")); the bare C loop: \(format(peakMiB(bare, 0))) MiB",
            target: nil))
        rows.append(BenchRow(
            name: "peer.rss.n1000", value: peakMiB(modhost, 1000), unit: "MiB", baseline: peakMiB(peas, 1000),
            baselineDescription: "peak RSS (VmHWM) of peer-peas-host at READY=1 with 1000 plugins; value: modhostd's, medians of the start-to-ready runs (report only; the bare C loop: \(format(peakMiB(bare, 1000))) MiB)",
            target: nil))
        return rows
    }

    // MARK: an idle isolated worker

    /// The resident memory of the worker of one C plugin run isolated, idle once its module
    /// has started; libpeas has no workers, so the target is absolute (10 MiB).
    func idleWorker() async throws -> BenchRow {
        let root = try freshDirectory(work + "/worker")
        let plugins = root + "/plugins"
        try FileManager.default.createDirectory(atPath: plugins, withIntermediateDirectories: true)
        chmod(plugins, 0o755)
        let file = System.modhost.files(0)[0]
        try FileManager.default.copyItem(atPath: "\(work)/src/modhost/\(file)", toPath: plugins + "/" + file)
        let isolated = root + "/modhostd.json"
        try #"{"plugins": {"Peer00000": {"isolation": "process"}}}"#.write(toFile: isolated, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(sdk: sdk, root: root, pluginDirectory: plugins, arguments: ["--config", isolated])
        defer { daemon.stop() }
        guard await daemon.waitForLine(containing: "control socket ready", after: 0) != nil else { throw failure("modhostd did not start:\n\(daemon.tail)") }
        // The worker: the daemon's child that runs modhost-worker (any of its threads may
        // have started it, so every process is looked at for its parent).
        func worker() -> Int32? {
            let processes = (try? FileManager.default.contentsOfDirectory(atPath: "/proc"))?.compactMap { Int32($0) } ?? []
            return processes.first { pid in
                guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return false }
                let lines = status.split(separator: "\n")
                return lines.contains("PPid:\t\(daemon.pid)") && lines.contains { $0.hasPrefix("Name:\tmodhost-worker") }
            }
        }
        var samples: [Double] = []
        for _ in 0..<5 {
            try await Task.sleep(for: .milliseconds(200))
            guard let worker = worker(), let bytes = ProcessMemory.residentBytes(pid: worker) else { continue }
            samples.append(Double(bytes) / 1_048_576)
        }
        guard !samples.isEmpty else { throw failure("no worker of Peer00000 was found:\n\(daemon.tail)") }
        let value = median(samples)
        return BenchRow(
            name: "peer.rss.worker_idle", value: value, unit: "MiB", baseline: 10,
            baselineDescription: "the target, 10 MiB; value: VmRSS of the modhost-worker running the generated C plugin Peer00000 isolated, idle after its start, median of 5 readings 200 ms apart (\(value <= 10 ? "met" : "NOT met"))",
            target: nil)
    }

    // MARK: dispatch

    /// One synchronous event to N C modules loaded in process (PluginSet + HostInstance,
    /// `host.send`), in a child process of this executable, against peer-peas-host
    /// --dispatch (peas_extension_set_foreach calling update_state) and peer-bare-host
    /// --dispatch (direct handle_event calls); then 100 Swift modules.
    func dispatch() async throws -> [BenchRow] {
        var rows: [BenchRow] = []
        var peasAt100 = 0.0
        for size in [100, 1000] {
            let modhostSet = try set(.modhost, size), peasSet = try set(.peas, size)
            let hostRounds = String(20_000 / size), loopRounds = String(5_000_000 / size)
            var modhost: [Double] = [], peas: [Double] = [], bare: [Double] = []
            for repetition in 0..<5 {
                let state = work + "/dispatch/state-\(repetition)"
                try? FileManager.default.removeItem(atPath: state)
                modhost.append(try number(run([CommandLine.arguments[0], "--peer-dispatch", modhostSet, state, hostRounds])))
                try? FileManager.default.removeItem(atPath: state)
                peas.append(try number(run([programs + "/peer-peas-host", "--dispatch", loopRounds, peasSet])))
                bare.append(try number(run([programs + "/peer-bare-host", "--dispatch", loopRounds, modhostSet])))
            }
            if size == 100 { peasAt100 = median(peas) }
            // The floor of a contained dispatch: the hand-over to a thread the caller can
            // leave behind, once per module (as C modules are called now) or once per event.
            let contained = programs + "/peer-contained-loop"
            let perEvent = median(try (0..<5).map { _ in try number(run([contained, String(size), loopRounds, "per-event", "sleep"])) })
            let perCall = median(try (0..<5).map { _ in try number(run([contained, String(size), hostRounds, "per-call", "sleep"])) })
            rows.append(BenchRow(
                name: "peer.dispatch.contained_floor.n\(size)", value: perEvent, unit: "ns", baseline: median(peas),
                baselineDescription: "peer-peas-host --dispatch as in peer.dispatch.c_module.n\(size); value: peer-contained-loop, the least a host does to keep a handler that never returns from costing more than its module: the \(size) handlers called on another thread, the fan-out handed over once per event and waited for in futex waits (no spinning), per module; handed over once per module instead: \(format(perCall)) ns (report only)",
                target: nil))
            rows.append(BenchRow(
                name: "peer.dispatch.c_module.n\(size)", value: median(modhost), unit: "ns", baseline: median(peas),
                baselineDescription: "peer-peas-host --dispatch: \(loopRounds) peas_extension_set_foreach calls of update_state on \(size) extensions, per extension per call; value: \(hostRounds) host.send(.custom(\"tick\")) on the host's context to \(size) C modules of the same plugins loaded by a PluginSet in a fresh process, per module; median of 5 alternating processes each; a direct handle_event loop over the same modules (peer-bare-host): \(format(median(bare))) ns",
                target: 1.0))
        }

        let host = HostInstance(name: "peer-swift-dispatch")
        await host.add((0..<100).map { BenchModule.factory(index: $0, service: false) })
        await host.start()
        let swift = try await EventBenchmark.syncFanout(host: host, modules: 100, events: 20_000, repetitions: 7)
        await host.shutdown()
        rows.append(BenchRow(
            name: "peer.dispatch.swift_module.n100", value: swift.host, unit: "ns", baseline: swift.direct,
            baselineDescription: "direct module.handle(event, host:) on the same 100 Swift modules in a loop on the host's actor; value: host.send(.custom) to them, per module, median of 7; report only: libpeas has no Swift plugins to set against it (its C extensions: \(format(peasAt100)) ns, peer.dispatch.c_module.n100), and internal.events.sync_fanout.per_module holds this ratio's target",
            target: nil))
        return rows
    }

    /// The child's side of the C dispatch row: loads the plugins of `directory` with a
    /// PluginSet (state in `state`), starts them, and returns the nanoseconds per module of
    /// one synchronous custom event sent `rounds` times.
    static func dispatchInProcess(directory: String, state: String, rounds: Int) async throws -> Double {
        let host = HostInstance(name: "peer-dispatch")
        let plugins = try PluginSet(host: host, directories: [directory], stateDirectory: state, trialLoader: nil)
        let changes = await plugins.reconcile(trial: false)
        guard changes.refused.isEmpty else { throw BenchError("refused: \(changes.refused)") }
        await plugins.start()
        let perModule = try await send(rounds: rounds, host: host)
        await plugins.shutdown()
        return perModule
    }

    static func send(rounds: Int, host: isolated HostInstance) throws -> Double {
        let modules = host.moduleNames.count
        guard modules > 0 else { throw BenchError("no module runs") }
        let event = ModuleEvent.custom(name: "tick", payload: .null)
        for _ in 0..<max(1, rounds / 10) { host.send(event) }
        let elapsed = seconds {
            for _ in 0..<rounds { host.send(event) }
        }
        return elapsed / Double(rounds * modules) * 1e9
    }

    // MARK: hot add, replace, remove

    /// modhostd and peer-peas-host --watch, each following an empty directory of its own,
    /// both running; plugins dropped into, replaced in and removed from them, alternating
    /// between the two. Timed from the file operation to the plugin's own clock reading in
    /// its start (activate) or deinit (deactivate), sent to a socket per host.
    func hot() async throws -> [BenchRow] {
        let root = try freshDirectory(work + "/hot")
        let modhostDirectory = root + "/plugins", peasDirectory = root + "/peas"
        try FileManager.default.createDirectory(atPath: peasDirectory, withIntermediateDirectories: true)
        chmod(peasDirectory, 0o755)
        let modhostClock = try NotifySocketListener(path: root + "/modhost-clock.sock")
        let peasClock = try NotifySocketListener(path: root + "/peas-clock.sock")

        let daemon = try DaemonProcess(sdk: sdk, root: root, pluginDirectory: modhostDirectory,
                                       environment: ["MODHOST_PEER_CLOCK": modhostClock.path], arguments: ["--config", configuration])
        defer { daemon.stop() }
        guard await daemon.waitForLine(containing: "control socket ready", after: 0) != nil else { throw failure("modhostd did not start:\n\(daemon.tail)") }
        let notify = try NotifySocketListener(path: root + "/peas-notify.sock")
        let peas = try PeasWatcher(program: programs + "/peer-peas-host", directory: peasDirectory, log: root + "/peas.log",
                                   environment: ["MODHOST_PEER_CLOCK": peasClock.path, "NOTIFY_SOCKET": notify.path])
        defer { peas.stop() }
        guard await notify.next(containing: "READY=1", timeout: .seconds(30)) != nil else { throw failure("peer-peas-host --watch did not start:\n\(peas.tail)") }

        let hosts = HotHosts(bench: self, root: root, modhostDirectory: modhostDirectory, peasDirectory: peasDirectory,
                             modhostClock: modhostClock, peasClock: peasClock, daemon: daemon, peas: peas)
        let (modhostAdds, peasAdds) = try await hosts.adds()
        let (modhostReplaces, peasReplaces) = try await hosts.replaces()
        let (modhostRemoves, peasRemoves) = try await hosts.removes()
        let both = "both hosts running, each following its own directory, the two served alternately; timed from the file operation to the plugin's own CLOCK_MONOTONIC reading, sent from its start or deinit (modhostd), activate or deactivate (libpeas)"
        let peasHost = "peer-peas-host --watch (GFileMonitor, peas_engine_rescan_plugins, load_plugin: activate)"
        let addP50 = percentile(modhostAdds, 0.5)
        return [
            BenchRow(name: "peer.hot_add.p50", value: addP50, unit: "ms", baseline: percentile(peasAdds, 0.5),
                     baselineDescription: "\(peasHost), p50 of \(hotAdds) new plugins, each libpeerN.so then peerN.plugin renamed in from dotfiles, timed from the last rename; value: modhostd, p50 of the same \(hotAdds) plugins' .so renamed in; \(both); report only: the target is absolute, p50 at most 5 ms (\(addP50 <= 5 ? "met" : "NOT met"))",
                     target: nil),
            BenchRow(name: "peer.hot_add.p99", value: percentile(modhostAdds, 0.99), unit: "ms", baseline: percentile(peasAdds, 0.99),
                     baselineDescription: "p99 of the same \(hotAdds) adds on each side (report only)", target: nil),
            BenchRow(name: "peer.hot_replace.p50", value: percentile(modhostReplaces, 0.5), unit: "ms", baseline: percentile(peasReplaces, 0.5),
                     baselineDescription: "\(peasHost), p50 of \(replaces) replaces of one running plugin: a new copy of its .so then a .plugin with a new Version renamed in, timed from the last rename to activate (unload: deactivate, then load; libpeas keeps a C module resident, so it runs the code first loaded); value: modhostd, p50 of \(replaces) new builds of the plugin (a new manifest version) renamed over it, to the new module's start; \(both) (report only)",
                     target: nil),
            BenchRow(name: "peer.hot_remove.p50", value: percentile(modhostRemoves, 0.5), unit: "ms", baseline: percentile(peasRemoves, 0.5),
                     baselineDescription: "\(peasHost), p50 of \(hotAdds) removals (peerN.plugin then libpeerN.so unlinked, timed from the first) to deactivate's clock reading; value: modhostd, the plugin's .so unlinked, to its module's deinit; \(both) (report only)",
                     target: nil),
        ]
    }

    /// The two hosts `hot()` runs, and the file operations it times on both.
    struct HotHosts {
        let bench: PeerBenchmark
        let root: String, modhostDirectory: String, peasDirectory: String
        let modhostClock: NotifySocketListener, peasClock: NotifySocketListener
        let daemon: DaemonProcess
        let peas: PeasWatcher

        func src(_ system: System, _ file: String) -> String { "\(bench.work)/src/\(system.rawValue)/\(file)" }
        /// Copies each of `files` to a dotfile beside its place in `directory`; returns their renames, in order.
        func stage(_ files: [(source: String, name: String)], in directory: String) throws -> [(String, String)] {
            try files.map { file in
                let temporary = directory + "/." + file.name + ".tmp"
                unlink(temporary)
                try FileManager.default.copyItem(atPath: file.source, toPath: temporary)
                return (temporary, directory + "/" + file.name)
            }
        }
        /// Renames them in, in order; returns the time of the last rename.
        func renameIn(_ renames: [(String, String)]) throws -> UInt64 {
            var last: UInt64 = 0
            for (from, to) in renames {
                last = monotonicNanoseconds()
                guard rename(from, to) == 0 else { throw failure("rename to \(to) failed") }
            }
            return last
        }
        func modhostWait(_ what: String, _ index: Int, after time: UInt64) async throws -> Double {
            guard let ms = await bench.clock(modhostClock, what, bench.module(index), after: time) else {
                throw failure("modhostd: no \(what) of \(bench.module(index)) within 30 s:\n\(daemon.tail)")
            }
            return ms
        }
        func peasWait(_ what: String, _ index: Int, after time: UInt64) async throws -> Double {
            guard let ms = await bench.clock(peasClock, what, bench.module(index), after: time) else {
                throw failure("peer-peas-host: no \(what) of \(bench.module(index)) within 30 s:\n\(peas.tail)")
            }
            return ms
        }
        func settle() async throws { try await Task.sleep(for: .milliseconds(20)) }

        /// New plugins renamed in, one after the other on each side: the times to their start.
        func adds() async throws -> (modhost: [Double], peas: [Double]) {
            var modhostAdds: [Double] = [], peasAdds: [Double] = []
            for index in 1000..<1000 + bench.hotAdds {
                let modhostFile = System.modhost.files(index)[0]
                var time = try renameIn(stage([(src(.modhost, modhostFile), modhostFile)], in: modhostDirectory))
                modhostAdds.append(try await modhostWait("start", index, after: time))
                try await settle()
                time = try renameIn(stage(System.peas.files(index).map { (src(.peas, $0), $0) }, in: peasDirectory))
                peasAdds.append(try await peasWait("start", index, after: time))
                try await settle()
            }
            return (modhostAdds, peasAdds)
        }

        /// New builds of one running plugin: the times to the new version's start.
        func replaces() async throws -> (modhost: [Double], peas: [Double]) {
            // A new build of one plugin: for modhostd, the same code with a new manifest version;
            // for libpeas, a new copy of the module and a .plugin file with a new Version.
            let index = bench.replacedIndex
            let modhostFile = System.modhost.files(index)[0], peasFiles = System.peas.files(index)
            _ = try await modhostWait("start", index, after: renameIn(stage([(src(.modhost, modhostFile), modhostFile)], in: modhostDirectory)))
            _ = try await peasWait("start", index, after: renameIn(stage(peasFiles.map { (src(.peas, $0), $0) }, in: peasDirectory)))
            var modhostReplaces: [Double] = [], peasReplaces: [Double] = []
            for version in 2..<2 + bench.replaces {
                let manifest = root + "/manifest.json", info = root + "/version.plugin"
                try #"{"name":"Peer\#(String(format: "%05d", index))","version":"\#(version).0","description":"generated","abi":"1.0","language":"c","order":\#(index),"modules":["\#(bench.module(index))"]}"#
                    .write(toFile: manifest, atomically: true, encoding: .utf8)
                let temporary = modhostDirectory + "/." + modhostFile + ".tmp"
                try shell("objcopy --update-section .modhost.manifest='\(manifest)' '\(src(.modhost, modhostFile))' '\(temporary)'")
                var time = try renameIn([(temporary, modhostDirectory + "/" + modhostFile)])
                modhostReplaces.append(try await modhostWait("start", index, after: time))
                try await settle()
                try "[Plugin]\nModule=\(bench.module(index))\nName=\(bench.module(index))\nVersion=\(version).0\n".write(toFile: info, atomically: true, encoding: .utf8)
                time = try renameIn(stage([(src(.peas, peasFiles[0]), peasFiles[0]), (info, peasFiles[1])], in: peasDirectory))
                peasReplaces.append(try await peasWait("start", index, after: time))
                try await settle()
            }
            return (modhostReplaces, peasReplaces)
        }

        /// The added plugins' files removed: the times to their deinit.
        func removes() async throws -> (modhost: [Double], peas: [Double]) {
            var modhostRemoves: [Double] = [], peasRemoves: [Double] = []
            for index in 1000..<1000 + bench.hotAdds {
                var time = monotonicNanoseconds()
                unlink(modhostDirectory + "/" + System.modhost.files(index)[0])
                modhostRemoves.append(try await modhostWait("stop", index, after: time))
                try await settle()
                time = monotonicNanoseconds()
                for file in System.peas.files(index).reversed() { unlink(peasDirectory + "/" + file) }
                peasRemoves.append(try await peasWait("stop", index, after: time))
                try await settle()
            }
            return (modhostRemoves, peasRemoves)
        }
    }

    /// Milliseconds from `time` to the clock reading "WHAT MODULE NS" that plugin `module`
    /// sent at or after `time` (earlier ones are skipped); nil after 30 s.
    func clock(_ listener: NotifySocketListener, _ what: String, _ module: String, after time: UInt64) async -> Double? {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            guard let message = await listener.next(containing: "\(what) \(module) ", timeout: .seconds(30)) else { return nil }
            if let reading = message.split(separator: " ").last.flatMap({ UInt64($0) }), reading >= time {
                return Double(reading - time) / 1e6
            }
        }
        return nil
    }

    // MARK: helpers

    /// The standard error of the last program `run` ran.
    var errorLog: String { work + "/stderr.log" }

    /// Runs `arguments` to its end and returns its standard output, trimmed; throws with the
    /// end of its standard error when it fails.
    func run(_ arguments: [String]) throws -> String {
        _ = FileManager.default.createFile(atPath: errorLog, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: arguments[0])
        process.arguments = Array(arguments.dropFirst())
        process.standardError = FileHandle(forWritingAtPath: errorLog)
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            let text = (try? String(contentsOfFile: errorLog, encoding: .utf8)) ?? ""
            throw BenchError("\(arguments.joined(separator: " ")) exited with status \(process.terminationStatus):\n\(text.suffix(2000))")
        }
        return output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func number(_ text: String) throws -> Double {
        guard let value = Double(text) else { throw BenchError("expected a number, got \(text)") }
        return value
    }

    func format(_ value: Double) -> String { String(format: "%.3g", value) }
}

/// peer-peas-host --watch on `directory`, its standard error in `log`.
final class PeasWatcher: Sendable {
    private let process: Process
    private let log: String

    init(program: String, directory: String, log: String, environment: [String: String]) throws {
        self.log = log
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = ["--watch", directory]
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        process.standardError = FileHandle(forWritingAtPath: log)
        process.standardOutput = FileHandle.nullDevice
        self.process = process
        try process.run()
    }

    var tail: String { ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").suffix(10).joined(separator: "\n") }

    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
    }
}
