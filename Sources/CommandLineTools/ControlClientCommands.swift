import ControlProtocol
import DaemonKit
import ModuleHost
import ModuleKit
import PluginFormat

#if canImport(Glibc)
import Glibc
#endif

/// The `modhostctl` commands that talk to a running modhostd over the control socket
/// (docs/control-protocol.md). Each sends one request and prints the reply; exit codes:
/// 0 the daemon carried it out, 1 it replied with an error, 64 usage error, 69 it could
/// not be reached (the message names the socket and says whether modhostd runs), 77 the
/// process on the socket runs as another user than root or the caller (nothing is sent to it).
extension ControlCommand {
    /// The commands handled here.
    static let daemonCommands: Set<String> = ["list", "status", "metrics", "info", "enable", "disable", "reload", "send", "post", "call",
                                              "version"]

    /// The allowed `--timeout`, in seconds.
    static let timeoutRange = 0.001...86400.0

    /// The variable that names the control socket when `--socket` is not given, so that a
    /// shell talking to a private daemon sets it once.
    static let socketVariable = "MODHOST_SOCKET"

    /// `socketVariable`'s value, when it is set and not empty.
    static func socketFromEnvironment() -> String? {
        ProcessEnvironment.current[socketVariable].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Options every daemon command takes; `send` also takes `payload`, `to` and `await`,
    /// `post` takes `payload`.
    private static let commonOptions: Set<String> = ["json", "socket", "timeout", "help"]

    private static let commandHelp: [String: String] = [
        "list": """
            USAGE: modhostctl list [--json] [--socket PATH]

            Lists every module the daemon knows (running, disabled, stopped) and every plugin file
            it refused or quarantined, one per line: MODULE PLUGIN FILE VERSION STATE ORDER GEN
            ISOLATION PID RESTARTS LAST-ERROR. GEN counts how often the plugin was loaded;
            ISOLATION is in-process or process, and for an isolated plugin PID is its worker's and
            RESTARTS how often that worker was restarted; "-" means none or unknown.
            """,
        "version": """
            USAGE: modhostctl version [--json] [--socket PATH]

            Shows this modhostctl's release, C ABI, ModuleKit version and Swift compiler, and the
            daemon's (with its control protocol version); --json prints the daemon's reply.
            """,
        "status": """
            USAGE: modhostctl status [--json] [--socket PATH]

            Shows the daemon's pid, uptime, readiness, paths and counters, including how many
            retired plugin versions stay mapped and their size.
            """,
        "metrics": """
            USAGE: modhostctl metrics [--json] [--socket PATH]

            Prints the daemon's metrics in the Prometheus text exposition format (version 0.0.4):
            per module events delivered, time in handlers, deadline overruns and errors; calls by
            name per function; daemon-wide plugins loaded and refused, reloads, plugin images
            mapped, retired and in the state directory. Write it to a node exporter's textfile
            collector directory (docs/daemon.md, "Metrics"). --json prints the same data as JSON.
            """,
        "info": """
            USAGE: modhostctl info [--json] [--socket PATH]

            Prints every running module's info: a line "NAME VERSION", then its metadata, one
            "  key: value" line each (values that are not strings as JSON). --json prints the
            daemon's reply as it is.
            """,
        "enable": """
            USAGE: modhostctl enable [--socket PATH] NAME

            Enables the module NAME at run time, as a configuration change would.
            """,
        "disable": """
            USAGE: modhostctl disable [--socket PATH] NAME

            Disables the module NAME at run time, as a configuration change would.
            """,
        "reload": """
            USAGE: modhostctl reload [--json] [--socket PATH]

            Re-reads the configuration file and rescans every plugin directory, as SIGHUP does,
            and prints what changed.
            """,
        "send": """
            USAGE: modhostctl send [--payload JSON] [--to NAME] [--await] [--socket PATH] EVENT

            Sends the event EVENT with a JSON payload (default null) directly to every running
            module, whether it listens to that name or not, or to NAME only. With --await, the
            daemon sends it as an asynchronous event and replies once the modules have handled it
            (or their deadline passed). To reach only the modules that listen, use post.
            """,
        "post": """
            USAGE: modhostctl post [--payload JSON] [--json] [--socket PATH] NAME

            Posts the notification NAME with a JSON payload (default null) to the running modules
            that listen to it (the notifications a module declares), in order, and prints which
            modules got it.
            """,
        "call": """
            USAGE: modhostctl call [--json] [--socket PATH] PLUGIN FUNCTION [ARG...]

            Calls FUNCTION, exported by the loaded plugin PLUGIN, with ARG converted to the types
            of its declared signature (see docs/calling.md: integers, floats, true/false, strings,
            hex:/base64:/text: bytes), and prints the result as text. Negative numbers are
            arguments, not options; put an argument that starts with "--" after "--".
            """,
    ]

    private static let daemonOptionsHelp = """
        OPTIONS:
          --json                    Print the reply's result as JSON
          --socket PATH             The daemon's control socket (default: $MODHOST_SOCKET, else \(RuntimePaths().socketPath))
          --timeout SECONDS         How long to wait for the daemon's reply (0.001 to 86400; default: 30)
          -h, --help                Show help information

        EXIT CODES:
          0 done, 1 the daemon refused the request (its message and error code are printed),
          64 usage error, 69 modhostd not reachable (the message names the socket and says
          whether a modhostd process is running), 77 the process listening on the socket runs
          as another user than root or you: not trusted, nothing is sent to it
        """

    /// Runs one daemon command: checks its arguments, sends the request, prints the reply.
    func daemonCommand(_ command: String, _ operands: [String], _ parsed: Arguments) async throws -> ExitCode {
        if parsed.has("help") {
            output.out((Self.commandHelp[command] ?? "") + "\n\n" + Self.daemonOptionsHelp)
            return .success
        }
        let allowed = switch command {
        case "send": Self.commonOptions.union(["payload", "to", "await"])
        case "post": Self.commonOptions.union(["payload"])
        default: Self.commonOptions
        }
        if let stray = (Array(parsed.values.keys) + Array(parsed.flags)).sorted().first(where: { !allowed.contains($0) }) {
            throw UsageError("option \(shownArgument("--" + stray)) is not valid for \(command)")
        }
        let json = parsed.has("json")
        var fields: [String: JSONValue] = [:]
        switch command {
        case "list", "status", "metrics", "info", "reload", "version":
            guard operands.isEmpty else { throw UsageError("\(command) takes no arguments") }
        case "enable", "disable":
            guard operands.count == 1 else { throw UsageError("\(command) takes exactly one module NAME") }
            fields["module"] = .string(operands[0])
        case "send", "post":
            let operand = command == "send" ? "EVENT" : "notification NAME"
            guard operands.count == 1 else { throw UsageError("\(command) takes exactly one \(operand)") }
            fields[command == "send" ? "event" : "notification"] = .string(operands[0])
            if let text = parsed.value("payload") {
                do {
                    fields["payload"] = try JSONValue.parse(Array(text.utf8))
                } catch {
                    throw UsageError("--payload is \(error)")
                }
            }
            if let target = parsed.value("to") { fields["to"] = .string(target) }
            if parsed.has("await") { fields["await"] = true }
        case "call":
            guard operands.count >= 2 else { throw UsageError("call needs PLUGIN and FUNCTION, then the function's arguments") }
            fields["plugin"] = .string(operands[0])
            fields["function"] = .string(operands[1])
            fields["args"] = .array(operands.dropFirst(2).map(JSONValue.string))
            fields["argsForm"] = "text"
        default:
            throw UsageError("unknown command \(shownArgument(command))")
        }
        var timeout = Duration.seconds(30)
        if let text = parsed.value("timeout") {
            guard let checked = CheckedNumber.duration(secondsText: text, in: Self.timeoutRange) else {
                throw UsageError("--timeout must be a number of seconds \(CheckedNumber.describe(Self.timeoutRange)), not \(shownArgument(text))")
            }
            timeout = checked
        }
        let socketPath = parsed.value("socket") ?? Self.socketFromEnvironment() ?? RuntimePaths().socketPath
        fields["cmd"] = .string(command)
        fields["id"] = 1
        fields["v"] = .number(Double(ControlService.protocolVersion))

        switch await Self.exchange(JSONValue.object(fields).jsonText, socketPath: socketPath, timeout: timeout) {
        case .unreachable(let message):
            output.err("Error: \(message)")
            return .unavailable
        case .untrusted(let message):
            output.err("Error: \(message)")
            return .noPermission
        case .invalidReply(let message):
            output.err("Error: modhostd at \(socketPath) sent a reply this modhostctl cannot read: \(message)")
            return .failure
        case .refused(let code, let message):
            output.err("Error: \(message) (\(code))")
            return .failure
        case .ok(let result):
            if json {
                output.out(encodeJSON(result))
            } else {
                try printResult(command, result, fields: fields)
            }
            return .success
        }
    }

    // MARK: Printing results

    private func printResult(_ command: String, _ result: JSONValue, fields: [String: JSONValue]) throws {
        switch command {
        case "list":
            output.out(Self.table(try Self.decode([ModuleRow].self, from: result["modules"] ?? .null)))
        case "status":
            output.out(Self.statusText(try Self.decode(DaemonStatus.self, from: result)))
        case "version":
            output.out(Self.versionText(daemon: result))
        case "metrics":
            output.out(try Self.decode(MetricsReport.self, from: result).prometheusText)
        case "reload":
            let summary = try Self.decode(ReloadSummary.self, from: result)
            func names(_ list: [String]) -> String { list.isEmpty ? "none" : list.joined(separator: ", ") }
            output.out("""
                configuration: \(summary.configurationChanged ? "changed" : "unchanged")
                added:         \(names(summary.added))
                replaced:      \(names(summary.replaced))
                removed:       \(names(summary.removed))
                refused:       \(names(summary.refused))
                waiting-for-dependency: \(names(summary.waitingForDependency))
                quarantined:   \(names(summary.quarantined))
                """)
        case "enable", "disable":
            output.out("\(command)d \(fields["module"]?.stringValue ?? "")")
        case "send":
            let target = fields["to"]?.stringValue.map { "module \($0)" } ?? "every module"
            let awaited = fields["await"] == true ? " and awaited it" : ""
            output.out("sent \(fields["event"]?.stringValue ?? "") to \(target)\(awaited)")
        case "post":
            var listeners: [String] = []
            if case .array(let names)? = result["listeners"] { listeners = names.compactMap(\.stringValue) }
            let name = fields["notification"]?.stringValue ?? ""
            output.out(listeners.isEmpty ? "posted \(name); no running module listens to it"
                                         : "posted \(name) to \(listeners.joined(separator: ", "))")
        case "call":
            // The result as text, like a shell command's output; nothing for void.
            if result["type"] != "void" { output.out(result["text"]?.stringValue ?? "") }
        default:  // info
            output.out(Self.infoText(result))
        }
    }

    /// `modhostctl info`: a line per running module, `NAME VERSION`, then one indented line
    /// per metadata member, `key: value` (strings as they are, other values as JSON), in
    /// the order the host lists them; `--json` prints the reply itself.
    static func infoText(_ result: JSONValue) -> String {
        guard case .array(let modules)? = result["modules"], !modules.isEmpty else { return "no module runs" }
        var lines: [String] = []
        for module in modules {
            let name = JSONValue.escapingControlCharacters(module["name"]?.stringValue ?? "-")
            let version = JSONValue.escapingControlCharacters(module["version"]?.stringValue ?? "-")
            lines.append("\(name) \(version)")
            if case .object(let metadata)? = module["metadata"] {
                for (key, value) in metadata.sorted(by: { $0.key < $1.key }) {
                    lines.append("  \(JSONValue.escapingControlCharacters(key)): \(JSONValue.escapingControlCharacters(value.stringValue ?? value.jsonText))")
                }
            }
        }
        return lines.joined(separator: "\n")
    }

    /// `modhostctl version`: this tool's version line and the daemon's, from its `version`
    /// reply (the release, the C ABI, ModuleKit, the compiler and the protocol).
    static func versionText(daemon result: JSONValue) -> String {
        func field(_ key: String) -> String { result[key]?.stringValue ?? result[key].map(\.jsonText) ?? "?" }
        return HostSDK.versionLine("modhostctl") + "\n"
            + "modhostd \(field("release")) (C ABI \(field("abi")), ModuleKit \(field("moduleKit")), Swift \(field("swift")), protocol \(field("protocol")))"
    }

    /// `modhostctl list`: aligned columns, "-" for empty cells, then a count per state.
    static func table(_ rows: [ModuleRow]) -> String {
        let header = ["MODULE", "PLUGIN", "FILE", "VERSION", "STATE", "ORDER", "GEN", "ISOLATION", "PID", "RESTARTS", "LAST-ERROR"]
        func cell(_ text: String?) -> String {
            guard let text, !text.isEmpty else { return "-" }
            return JSONValue.escapingControlCharacters(text)
        }
        let cells = rows.map { row in
            [cell(row.module), cell(row.plugin), cell(row.file), cell(row.version), cell(stateText(row)),
             cell(row.order.map(String.init)), cell(row.generation.map(String.init)), cell(row.isolation),
             cell(row.workerPid.map(String.init)), cell(row.restarts.map(String.init)), cell(row.lastError)]
        }
        var widths = header.map(\.count)
        for line in cells {
            for (column, text) in line.enumerated() { widths[column] = max(widths[column], text.count) }
        }
        func format(_ line: [String]) -> String {
            var text = ""
            for (column, value) in line.enumerated() {
                if column == line.count - 1 {
                    text += value
                } else {
                    text += value + String(repeating: " ", count: widths[column] - value.count + 2)
                }
            }
            return text
        }
        var states: [(String, Int)] = []
        for row in rows {
            if let index = states.firstIndex(where: { $0.0 == row.state }) {
                states[index].1 += 1
            } else {
                states.append((row.state, 1))
            }
        }
        let counts = states.isEmpty ? "" : " (" + states.map { "\($0.1) \($0.0)" }.joined(separator: ", ") + ")"
        let summary = "\(rows.count) \(rows.count == 1 ? "entry" : "entries")\(counts)"
        return ([format(header)] + cells.map(format) + ["", summary]).joined(separator: "\n")
    }

    /// The STATE cell: a stuck module also shows for how long and in what, e.g.
    /// "stuck 12.5s in block".
    static func stateText(_ row: ModuleRow) -> String {
        guard row.state == "stuck", let seconds = row.stuckSeconds else { return row.state }
        return "stuck \(seconds)s" + (row.stuckIn.map { " in \($0)" } ?? "")
    }

    /// `seconds` (not negative) with one decimal, as printf's `%.1f` writes it: "12.5", "0.0".
    static func oneDecimal(_ seconds: Double) -> String {
        let tenths = (seconds * 10).rounded(.toNearestOrEven)
        guard tenths.isFinite, tenths >= 0, tenths < 1e18 else { return "\(seconds)" }
        let whole = Int(tenths)
        return "\(whole / 10).\(whole % 10)"
    }

    static func statusText(_ status: DaemonStatus) -> String {
        let directories = status.pluginDirectories.isEmpty ? "none" : status.pluginDirectories.joined(separator: ", ")
        return """
            pid:                 \(status.pid)
            uptime:              \(oneDecimal(status.uptimeSeconds)) s
            ready:               \(status.ready ? "yes" : "no")
            socket:              \(status.socketPath)
            state directory:     \(status.stateDirectory)
            configuration:       \(status.configPath ?? "none")
            plugin directories:  \(directories)
            plugins loaded:      \(status.pluginsLoaded)
            modules running:     \(status.modulesRunning)
            files refused:       \(status.filesRefused)
            retired generations: \(status.retiredGenerations) (\(status.retiredBytes) bytes mapped)
            crash-guarded:       \(status.crashGuarded)
            reloads:             \(status.reloads)
            """
    }

    private static func decode<T: Decodable>(_ type: T.Type, from value: JSONValue) throws -> T {
        do {
            return try value.decode(T.self)
        } catch {
            throw ReplyError(message: "the result is not a \(T.self): \(error)")
        }
    }

    private struct ReplyError: Error, CustomStringConvertible {
        var message: String
        var description: String { message }
    }

    // MARK: Talking to the daemon

    private enum Outcome: Sendable {
        case ok(JSONValue)
        case refused(code: String, message: String)
        case unreachable(String)
        case untrusted(String)
        case invalidReply(String)
    }

    /// Sends one request on a thread of its own (the client blocks) and reads the reply.
    private static func exchange(_ line: String, socketPath: String, timeout: Duration) async -> Outcome {
        await withCheckedContinuation { continuation in
            do throws(SystemError) {
                try startThread(name: "ctl-exchange") {
                    continuation.resume(returning: blockingExchange(line, socketPath: socketPath, timeout: timeout))
                }
            } catch {
                continuation.resume(returning: .unreachable("cannot start a thread to talk to modhostd: \(error)"))
            }
        }
    }

    private static func blockingExchange(_ line: String, socketPath: String, timeout: Duration) -> Outcome {
        let reply: String
        do {
            reply = try ControlClient.request(line, socketPath: socketPath, timeout: timeout)
        } catch .untrustedPeer(let path, let peer) {
            return .untrusted("\(ControlSocketError.untrustedPeer(path: path, peer: peer)); nothing was sent and its replies are ignored. "
                              + "Fix: find who runs pid \(peer.pid) and remove the socket, then start modhostd (or pass --socket with the real daemon's socket)")
        } catch .lineTooLong(let limit) {
            // It answered: the daemon was reached; its reply is more than this tool reads.
            return .invalidReply("a reply line longer than \(limit) bytes (a modhostd of this version never sends one)")
        } catch {
            return .unreachable(unreachableMessage(error, socketPath: socketPath, timeout: timeout))
        }
        guard case .object(let members) = try? JSONValue.parse(Array(reply.utf8)),
              let ok = members["ok"]?.boolValue
        else {
            return .invalidReply("not a JSON object with \"ok\": \(reply.prefix(200))")
        }
        if ok { return .ok(members["result"] ?? .null) }
        let error = members["error"]
        return .refused(code: error?["code"]?.stringValue ?? "unknown", message: error?["message"]?.stringValue ?? reply)
    }

    /// Why the daemon cannot be reached, naming the socket and whether modhostd runs.
    static func unreachableMessage(_ error: ControlSocketError, socketPath: String, timeout: Duration) -> String {
        let daemons = runningDaemons()
        let pids = daemons.map(String.init).joined(separator: ", ")
        let elsewhere = daemons.isEmpty
            ? "modhostd is not running (start it, or pass --socket PATH if it listens elsewhere)"
            : "modhostd is running (pid \(pids)) but not listening on this socket; pass its socket with --socket PATH"
        let reason: String
        var whether = elsewhere
        switch error {
        case .system(let system) where system.code == ENOENT:
            reason = "no socket at this path"
        case .system(let system) where system.code == ECONNREFUSED:
            reason = "nothing accepts connections on this socket (a stale socket file)"
        case .system(let system) where system.code == EACCES || system.code == EPERM:
            reason = "permission denied (the socket belongs to another user; run as that user or as root)"
            whether = daemons.isEmpty ? "no modhostd process is visible" : "modhostd is running (pid \(pids))"
        case .timedOut:
            reason = "no reply within \(timeout) (pass a longer --timeout for slow operations)"
            whether = "modhostd is running but busy or stuck"
        case .connectionClosed:
            reason = "the connection closed before a reply arrived"
            whether = daemons.isEmpty
                ? "modhostd is no longer running (it stopped or crashed: see its log)"
                : "modhostd is running (pid \(pids)) but may be shutting down"
        default:
            reason = error.description
        }
        return "cannot reach modhostd at \(socketPath): \(reason). \(whether)."
    }

    /// Pids of processes named modhostd (from /proc/PID/comm), excluding this process, that
    /// run as root or as this user: those whose socket this tool would trust (another
    /// user's daemon is not the one it looks for).
    static func runningDaemons() -> [Int32] {
        guard let entries = try? FileSystem.names(in: "/proc") else { return [] }
        let me = getpid(), user = geteuid()
        return entries.compactMap(Int32.init).filter { pid in
            var status = stat()
            return pid != me && stat("/proc/\(pid)", &status) == 0 && (status.st_uid == 0 || status.st_uid == user)
                && readSmallFile("/proc/\(pid)/comm") == "modhostd\n"
        }.sorted()
    }

    /// Reads a short file with plain reads (files in /proc report size 0).
    private static func readSmallFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 256)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        return String(decoding: buffer[..<count], as: UTF8.self)
    }
}
