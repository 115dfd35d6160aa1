import DaemonKit
import Foundation
import ModuleKit

/// Settings of one daemon run, from the command line (and later the configuration file).
public struct DaemonOptions: Sendable {
    public var pluginDirectories: [String] = []
    public var allowInsecurePlugins = false
    public var logLevel: LogLevel = .info
    public var logFormat: LogFormat = .text
    public var eventDeadline: Duration = .seconds(5)
    public var stateDirectory: String?
    public var socketPath: String?
    public var configPath: String?
    public var moduleSettings: [String: ModuleSettings] = [:]

    public enum LogFormat: String, Sendable { case text, json }

    public init() {}
}

/// The daemon: loads the plugins, runs their modules on one host instance, and stops them
/// on SIGTERM or SIGINT.
///
/// Order of a run: every plugin is validated and loaded in dependency order; every module is
/// registered and gets `.initialize`; then all get `.start`. On SIGTERM/SIGINT the host
/// sends `.willTerminate` (awaited, with the deadline) and `.deinitialize` in reverse order,
/// and the run returns 0. A second signal during shutdown exits at once.
public actor Daemon {
    public let options: DaemonOptions
    public let host: HostInstance
    let loader: PluginLoader
    let logger: Logger
    /// Loaded plugins in load order.
    private(set) var plugins: [LoadedPlugin] = []
    /// Refused files with their reasons, by path.
    private(set) var refused: [String: LoadFailure] = [:]

    public init(options: DaemonOptions) {
        self.options = options
        logger = Logger(label: "modhostd")
        host = HostInstance(name: "modhostd", logger: Logger(label: "modhostd"))
        loader = PluginLoader(validator: Validator(allowInsecure: options.allowInsecurePlugins))
    }

    /// Loads the plugin directories and starts every module. Returns the report.
    @discardableResult
    public func loadAndStart() async -> LoadReport {
        let report = loader.load(directories: options.pluginDirectories)
        for (file, warning) in report.warnings { logger.warning(warning, [("file", file)]) }
        for failure in report.refused {
            refused[failure.file] = failure
            logger.error("refused \(failure)", [("file", failure.file), ("check", failure.check.rawValue)])
        }
        for plugin in report.loaded {
            plugins.append(plugin)
            logger.info("loaded plugin \(plugin.name) \(plugin.file.manifest.version)",
                        [("plugin", plugin.name), ("file", plugin.file.path),
                         ("modules", plugin.modules.map(\.factory.name).joined(separator: ","))])
        }
        await host.add(report.loaded.flatMap { $0.modules.map(\.factory) })
        await host.start()
        let running = await host.moduleNames
        logger.info("started \(running.count) modules: \(running.joined(separator: ", "))",
                    [("plugins", "\(plugins.count)"), ("refused", "\(refused.count)")])
        return report
    }

    /// Runs until SIGTERM or SIGINT, then shuts the modules down. Returns the exit code.
    public func run() async -> ExitCode {
        let signals: UnixSignals
        do {
            signals = try UnixSignals(.terminate, .interrupt, .hangup)
        } catch {
            logger.error("cannot install signal handlers: \(error)")
            return .osError
        }
        await loadAndStart()
        for await signal in signals {
            if signal == .hangup {
                logger.info("SIGHUP received; reload is not available in this version")
                continue
            }
            logger.info("\(signal) received, shutting down")
            break
        }
        // A second SIGTERM/SIGINT during shutdown ends the process at once.
        let escalation = Task.detached { [logger] in
            let again = try? UnixSignals(.terminate, .interrupt)
            guard let again else { return }
            for await signal in again {
                logger.warning("\(signal) received again during shutdown, exiting now")
                exit(ExitCode.failure.rawValue)
            }
        }
        signals.cancel()
        await host.shutdown()
        escalation.cancel()
        logger.info("stopped")
        return .success
    }
}
