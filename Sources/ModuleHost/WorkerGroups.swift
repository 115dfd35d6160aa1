import DaemonKit
import Foundation
import Glibc
import ModuleKit
import PluginFormat

/// The process groups of the workers a host process started, one record each in
/// `STATE/workers/` (a file named by the group's id, which is its worker's pid), so that a
/// start after the host was killed ends what an earlier run left: its workers die with it
/// (PR_SET_PDEATHSIG), but what their plugins forked in their groups does not.
///
/// A record holds the boot and the worker's start time. A group is ended only in the boot
/// that recorded it, and only while its worker is gone or is still the process recorded:
/// the kernel gives no new process a pid still used as a group's id, so while a group of
/// that id has members it is the one recorded. Safe to call from any thread.
final class WorkerGroups: Sendable {
    let directory: String
    private let logger: Logger

    /// Records in `stateDirectory`/workers, created (mode 0700) if needed.
    init(stateDirectory: String, logger: Logger) {
        directory = stateDirectory + "/workers"
        self.logger = logger
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            logger.warning("cannot create \(directory): \(String(cString: strerror(errno))); what workers fork may outlive a host that is killed",
                           [("directory", directory)])
        }
    }

    /// Records worker `pid` (the leader of its group) of plugin `plugin`.
    func started(_ pid: pid_t, plugin: String) {
        guard let boot = ProcessIdentity.bootID, let start = ProcessIdentity.startTime(of: pid) else { return }
        let record = JSONValue.object(["boot": .string(boot), "start": .number(Double(start)), "plugin": .string(plugin)])
        do {
            try AtomicFile.write(Array(record.jsonText.utf8), to: path(pid), mode: 0o600)
        } catch {
            logger.warning("cannot record worker \(pid) of plugin \(plugin): \(error)", [("plugin", plugin)])
        }
    }

    /// Forgets worker `pid`, whose group has been killed and which has been reaped.
    func ended(_ pid: pid_t) { unlink(path(pid)) }

    /// Kills what is left of the groups an earlier run recorded, saying so, and forgets
    /// every record. Call it before this run starts any worker.
    func endLeftovers() {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        let boot = ProcessIdentity.bootID
        for name in names {
            let path = directory + "/" + name
            defer { unlink(path) }
            guard let group = pid_t(name), group > 1,
                  let bytes = try? BoundedFile.read(path, limit: 4096), let record = try? JSONValue.parse(bytes),
                  let recordedBoot = record.text("boot"), recordedBoot == boot, let start = record["start"]?.numberValue
            else { continue }
            // Its worker's pid now names another process: the group ended long ago.
            if let now = ProcessIdentity.startTime(of: group), Double(now) != start { continue }
            guard kill(-group, 0) == 0 else { continue }
            kill(-group, SIGKILL)
            // Written by the host, but read back from disk: shown as a name only if it is one.
            let plugin = record.text("plugin").map { PluginName.isValid($0) ? $0 : PluginName.shown($0) } ?? "?"
            logger.warning("killed the processes left in process group \(group) of plugin \(plugin)'s worker, which an earlier run started and did not stop (it ended without stopping its workers, e.g. killed)",
                           [("plugin", plugin), ("group", "\(group)")])
        }
    }

    private func path(_ pid: pid_t) -> String { directory + "/\(pid)" }
}
