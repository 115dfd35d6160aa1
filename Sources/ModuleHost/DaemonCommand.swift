import DaemonKit
import ModuleKit

/// `modhostd`: the daemon's command line.
public struct DaemonCommand: Sendable {
    public static let usage = "modhostd --plugins DIR [--plugins DIR ...] [options]"

    public static let help = """
        OVERVIEW: ModuleHost daemon: loads plugin .so files from directories and runs their modules.

        USAGE: \(usage)

        OPTIONS:
          --plugins DIR             A plugin directory (repeatable)
          --allow-insecure-plugins  Accept plugin files writable by others or owned by another
                                    user, with a warning (development only)
          --log-level LEVEL         debug, info, warning or error (default: info)
          --log-format FORMAT       text or json (default: text)
          --event-deadline SECONDS  How long an awaited event may take per module (default: 5)
          -h, --help                Show help information

        SIGNALS:
          SIGTERM, SIGINT           Shut down: willTerminate, then deinit in reverse order; exit 0
          SIGHUP                    Reload (see docs/daemon.md)

        EXIT CODES:
          0 clean shutdown, 1 failure, 64 usage error, 71 operating-system error
        """

    let output: any CommandOutput

    public init(output: any CommandOutput = StandardStreams()) { self.output = output }

    /// Parses the command line (without the program name); nil options means exit now
    /// with the returned code.
    public func parse(_ arguments: [String]) -> Result<DaemonOptions, ExitCode> {
        do throws(UsageError) {
            let parsed = try Arguments(
                arguments, valueOptions: ["plugins", "log-level", "log-format", "event-deadline", "state-dir", "socket", "config"],
                flagOptions: ["allow-insecure-plugins"])
            if parsed.has("help") {
                output.out(Self.help)
                return .failure(.success)
            }
            guard parsed.positionals.isEmpty else { throw UsageError("unexpected argument '\(parsed.positionals[0])'") }
            var options = DaemonOptions()
            options.pluginDirectories = parsed.values["plugins"] ?? []
            guard !options.pluginDirectories.isEmpty else { throw UsageError("at least one --plugins DIR is needed") }
            options.allowInsecurePlugins = parsed.has("allow-insecure-plugins")
            if let level = parsed.value("log-level") {
                guard let value = LogLevel(name: level) else { throw UsageError("--log-level must be debug, info, warning or error") }
                options.logLevel = value
            }
            if let format = parsed.value("log-format") {
                guard let value = DaemonOptions.LogFormat(rawValue: format) else { throw UsageError("--log-format must be text or json") }
                options.logFormat = value
            }
            if let deadline = parsed.value("event-deadline") {
                guard let seconds = Double(deadline), seconds > 0 else { throw UsageError("--event-deadline must be a positive number of seconds") }
                options.eventDeadline = .milliseconds(Int64(seconds * 1000))
            }
            options.stateDirectory = parsed.value("state-dir")
            options.socketPath = parsed.value("socket")
            options.configPath = parsed.value("config")
            return .success(options)
        } catch {
            output.err("Error: \(error.message)\nUsage: \(Self.usage)\nSee 'modhostd --help'.")
            return .failure(.usage)
        }
    }

    /// Parses, bootstraps logging, runs the daemon; returns the process exit code.
    public func run(_ arguments: [String]) async -> ExitCode {
        let options: DaemonOptions
        switch parse(arguments) {
        case .success(let parsed): options = parsed
        case .failure(let code): return code
        }
        let backend: any LogBackend = options.logFormat == .json ? JSONLogBackend() : TextLogBackend()
        LoggingSystem.bootstrap(backend, level: options.logLevel)
        return await Daemon(options: options).run()
    }
}
