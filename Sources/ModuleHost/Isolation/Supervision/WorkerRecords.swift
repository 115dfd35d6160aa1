import DaemonKit
import Glibc
import ModuleKit
import PluginFormat

/// What the isolated workers a host process started leave behind if the host is killed:
/// the workers die with it (PR_SET_PDEATHSIG), but what their plugins forked does not.
/// Each worker is started with a random token in its environment
/// (`MODHOST_WORKER_TOKEN`), which the processes its plugin starts inherit, and recorded in
/// `STATE/workers/` (one file per worker, named by its pid) with the token and the host
/// process that started it. A later start ends every process holding the token of a record
/// whose host is gone.
///
/// Nothing but the token picks a process: not a pid nor a process group, which the kernel
/// reuses. A record is acted on only in the boot that wrote it, once its host process (pid
/// and start time) has ended, so two plugin sets sharing a state directory, or a host on
/// another machine, leave each other's workers alone. A process that clears its environment
/// escapes, as one that leaves its group does (docs/isolation.md). Safe to call from any
/// thread.
final class WorkerRecords: Sendable {
    /// The variable every worker's environment holds, with its own token.
    static let tokenVariable = "MODHOST_WORKER_TOKEN"

    let directory: String
    private let logger: Logger
    /// This host process, as its records name it, and this boot (read once, not per worker).
    private let owner: (pid: pid_t, start: UInt64?) = (getpid(), ProcessIdentity.startTime(of: getpid()))
    private let boot = ProcessIdentity.bootID

    /// Records in `stateDirectory`/workers, created (mode 0700) if needed.
    init(stateDirectory: String, logger: Logger) {
        directory = stateDirectory + "/workers"
        self.logger = logger
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            logger.warning("cannot create \(directory): \(SystemError.describe(errno)); what workers fork may outlive a host that is killed",
                           [("directory", directory)])
        }
    }

    /// A new token for a worker's environment: 128 random bits, in hex.
    static func newToken() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<2).map { _ in
            let text = String(generator.next() as UInt64, radix: 16)
            return String(repeating: "0", count: 16 - text.count) + text
        }.joined()
    }

    /// Records worker `pid` of plugin `plugin`, started with `token`.
    func started(_ pid: pid_t, plugin: String, token: String) {
        guard let boot, let ownerStart = owner.start else { return }
        let record = JSONValue.object(["boot": .string(boot), "owner": .number(Double(owner.pid)), "ownerStart": .number(Double(ownerStart)),
                                       "token": .string(token), "plugin": .string(plugin)])
        do {
            try AtomicFile.write(Array(record.jsonText.utf8), to: path(pid), mode: 0o600)
        } catch {
            logger.warning("cannot record worker \(pid) of plugin \(plugin): \(error)", [("plugin", plugin)])
        }
    }

    /// Forgets worker `pid`, whose process group has been killed.
    func ended(_ pid: pid_t) { unlink(path(pid)) }

    /// Kills every process that holds the token of a worker an earlier host process (now
    /// gone) recorded, saying so per plugin, and forgets those records. Call it before this
    /// process starts any worker.
    func endLeftovers() {
        guard let names = try? FileSystem.names(in: directory), !names.isEmpty else { return }
        var tokens: [String: String] = [:]  // "VARIABLE=TOKEN" -> plugin
        for name in names {
            let path = directory + "/" + name
            guard let bytes = try? BoundedFile.read(path, limit: 4096), let record = try? JSONValue.parse(bytes),
                  record.text("boot") == boot, boot != nil,
                  let ownerPid = record.integer("owner"), let ownerStart = record["ownerStart"]?.numberValue,
                  let token = record.text("token"), token.utf8.count == 32, token.utf8.allSatisfy({ $0 < 0x80 })
            else {
                unlink(path)  // unreadable, or written in another boot: nothing of it runs
                continue
            }
            // Its host process still runs (another plugin set, this one): not a leftover.
            if let start = ProcessIdentity.startTime(of: pid_t(clamping: ownerPid)), Double(start) == ownerStart { continue }
            tokens[Self.tokenVariable + "=" + token] = record.text("plugin").map { PluginName.isValid($0) ? $0 : PluginName.shown($0) } ?? "?"
            unlink(path)
        }
        guard !tokens.isEmpty else { return }
        var killed: [String: Int] = [:]
        for entry in (try? FileSystem.names(in: "/proc")) ?? [] {
            guard let pid = pid_t(entry), pid > 1, pid != getpid(),
                  let environment = try? BoundedFile.read("/proc/\(pid)/environ", limit: 1 << 20)
            else { continue }
            for variable in environment.split(separator: 0) where variable.count == Self.tokenVariable.utf8.count + 33 {
                guard let plugin = tokens[String(decoding: variable, as: UTF8.self)] else { continue }
                if kill(pid, SIGKILL) == 0 { killed[plugin, default: 0] += 1 }
            }
        }
        for (plugin, count) in killed.sorted(by: { $0.key < $1.key }) {
            logger.warning("killed \(count) processes left by plugin \(plugin)'s worker, which an earlier run started and did not stop (it ended without stopping its workers, e.g. killed)",
                           [("plugin", plugin), ("killed", "\(count)")])
        }
    }

    private func path(_ pid: pid_t) -> String { directory + "/\(pid)" }
}
