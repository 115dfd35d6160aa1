import ControlProtocol
import DaemonKit
import DaemonShell
import ModuleHost
import ModuleKit
import PluginFormat

/// `modhostd`: the daemon's command line.
public struct DaemonCommand: Sendable {
    public static let usage = "modhostd [--plugins DIR]... [--config FILE] [options]"

    public static let help = """
        OVERVIEW: ModuleHost daemon: loads plugin .so files from directories, runs their modules,
        and picks up plugins dropped into, replaced in or removed from those directories.

        USAGE: \(usage)

        OPTIONS:
          --plugins DIR             A plugin directory (repeatable; added to the configuration's)
          --config FILE             Configuration file (JSON; default \(RuntimePaths().configPath),
                                    used when it exists)
          --socket PATH             Control socket (default \(RuntimePaths().socketPath))
          --state-dir DIR           State: private plugin copies, crash guard
                                    (default \(RuntimePaths().stateDirectory))
          --allow-insecure-plugins  Accept plugin files writable by others or owned by another
                                    user, with a warning (development only)
          --log-level LEVEL         debug, info, warning or error (default: info)
          --log-format FORMAT       text or json (default: the configuration's logFormat, else text)
          --event-deadline SECONDS  How long a module's event handler may take before the daemon
                                    goes on without it (a C module is then stuck)
                                    (0.001 to 3600; default: 5)
          --request-deadline SECONDS
                                    How long send, call, enable, disable and info may take before
                                    they reply deadline_exceeded (0.001 to 3600; default: 10)
          --shutdown-budget SECONDS How long a shutdown may take in total
                                    (0.001 to 3600; default: 30)
          --check-config            Read and check the configuration (the file and these options)
                                    as a start would, say whether it is valid, and exit (0 or 65)
                                    without starting
          --version                 Print the release, the C ABI, ModuleKit's version and the
                                    Swift compiler, and exit
          -h, --help                Show help information

        SIGNALS:
          SIGTERM, SIGINT           Shut down: willTerminate (awaited), deinit in reverse order, exit 0;
                                    exit 1 when the shutdown budget ran out (the log names the
                                    modules still running); a second signal exits 1 at once
          SIGHUP                    Reload the configuration and rescan the plugin directories

        EXIT CODES:
          0 clean shutdown, 1 failure, 64 usage error, 65 invalid configuration,
          70 plugin code called exit() (quarantined at the next start),
          71 operating-system error (socket, state directory), or another modhostd
             already uses the state directory or the socket (it exits before loading plugins)

        See daemon.md in ModuleHost's documentation (docs/ in the source tree,
        PREFIX/share/doc/modulehost/ when installed).
        """

    let output: any CommandOutput

    public init(output: any CommandOutput = StandardStreams()) { self.output = output }

    /// Parses the command line (without the program name): the options, or the exit code
    /// to end with now (after --help or a usage error).
    public func parse(_ arguments: [String]) -> Result<DaemonOptions, ExitCode> {
        do throws(UsageError) {
            let parsed = try Arguments(
                arguments, valueOptions: ["plugins", "log-level", "log-format", "event-deadline", "request-deadline", "shutdown-budget",
                                          "state-dir", "socket", "config"],
                flagOptions: ["allow-insecure-plugins", "check-config", "version"])
            if parsed.has("help") {
                output.out(Self.help)
                return .failure(.success)
            }
            if parsed.has("version") {
                output.out(HostSDK.versionLine("modhostd"))
                return .failure(.success)
            }
            guard parsed.positionals.isEmpty else { throw UsageError("unexpected argument \(shownArgument(parsed.positionals[0]))") }
            var options = DaemonOptions()
            options.pluginDirectories = parsed.values["plugins"] ?? []
            for (flag, values) in [("plugins", options.pluginDirectories), ("state-dir", [parsed.value("state-dir")].compactMap { $0 }),
                                   ("config", [parsed.value("config")].compactMap { $0 })] {
                for value in values {
                    if let problem = PathText.problem(with: value) { throw UsageError("--\(flag) \(problem)") }
                }
            }
            // Relative paths are the operator's working directory's: the daemon keeps and
            // shows them absolute, as the configuration file requires.
            options.pluginDirectories = options.pluginDirectories.map { PathText.absolute($0) }
            if let stateDirectory = parsed.value("state-dir") { options.stateDirectory = PathText.absolute(stateDirectory) }
            if let socket = parsed.value("socket"), let problem = UnixSocketAddress.problem(with: socket) {
                throw UsageError("--socket \(problem)")
            }
            options.allowInsecurePlugins = parsed.has("allow-insecure-plugins")
            if let level = parsed.value("log-level") {
                guard let value = LogLevel(name: level) else { throw UsageError("--log-level must be debug, info, warning or error") }
                options.logLevel = value
            }
            if let format = parsed.value("log-format") {
                guard let value = DaemonOptions.LogFormat(rawValue: format) else { throw UsageError("--log-format must be text or json") }
                options.logFormat = value
            }
            let durations: [(flag: String, set: (inout DaemonOptions, Duration) -> Void)] = [
                ("event-deadline", { $0.eventDeadline = $1 }),
                ("request-deadline", { $0.requestDeadline = $1 }),
                ("shutdown-budget", { $0.shutdownBudget = $1 }),
            ]
            for (flag, set) in durations {
                guard let text = parsed.value(flag) else { continue }
                let range = DaemonConfiguration.durationRange
                guard let duration = CheckedNumber.duration(secondsText: text, in: range) else {
                    throw UsageError("--\(flag) must be a number of seconds \(CheckedNumber.describe(range)), not \(shownArgument(text))")
                }
                set(&options, duration)
            }
            options.socketPath = parsed.value("socket")
            options.checkConfigurationOnly = parsed.has("check-config")
            options.configPathExplicit = parsed.value("config") != nil
            options.configPath = parsed.value("config").map { PathText.absolute($0) } ?? RuntimePaths().configPath
            return .success(options)
        } catch {
            return .failure(usageError(error))
        }
    }

    private func usageError(_ error: UsageError) -> ExitCode {
        output.err("Error: \(error.message)\nUsage: \(Self.usage)\nSee 'modhostd --help'.")
        return .usage
    }

    /// `run` with this process's command line; an argument that is not UTF-8 is a usage
    /// error giving the offset of its first bad byte.
    public func runProcessArguments() async -> ExitCode {
        let arguments: [String]
        do {
            arguments = try processArguments()
        } catch {
            return usageError(error)
        }
        return await run(arguments)
    }

    /// Parses, reads the configuration, bootstraps logging, runs the daemon; returns the
    /// process exit code.
    public func run(_ arguments: [String]) async -> ExitCode {
        var options: DaemonOptions
        switch parse(arguments) {
        case .success(let parsed): options = parsed
        case .failure(let code): return code
        }
        let configuration: DaemonConfiguration
        let file: String?
        do {
            (configuration, file) = try DaemonConfiguration.read(for: options)
        } catch {
            output.err("Error: \(error.message)")
            return .dataError
        }
        guard !configuration.pluginDirectories.isEmpty else {
            output.err("Error: \(DaemonConfiguration.noPluginDirectory)\nUsage: \(Self.usage)\nSee 'modhostd --help'.")
            return options.checkConfigurationOnly ? .dataError : .usage
        }
        if options.checkConfigurationOnly {
            let directories = configuration.pluginDirectories.count
            output.out("configuration OK: \(file ?? "no configuration file; the defaults and the command line"), "
                       + "\(directories) plugin \(directories == 1 ? "directory" : "directories")")
            return .success
        }
        // On the journal, each line carries its priority (`journalctl -p err` finds errors).
        let journal = SystemdNotifier.standardErrorIsJournal()
        let backend: any LogBackend = configuration.logFormat == .json ? JSONLogBackend(priorityPrefixes: journal)
                                                                 : TextLogBackend(priorityPrefixes: journal)
        LoggingSystem.bootstrap(backend, level: configuration.logLevel)
        do {
            return try await Daemon(options: options, configuration: configuration).run()
        } catch {
            output.err("Error: \(error.message)")
            return .osError
        }
    }
}
