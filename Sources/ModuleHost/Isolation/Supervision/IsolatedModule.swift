@_spi(ModuleHost) import ModuleKit

/// A module of an isolated plugin, as the daemon's host instance sees it: everything it is
/// given goes to the module of the same name in the plugin's worker.
final class IsolatedModule: ModuleInAnotherProcess {
    let plugin: IsolatedPlugin
    let moduleName: String
    let notifications: Set<String>
    /// The info the worker's module gave last: the answer while no worker can be asked.
    private var lastInfo: ModuleInfo

    init?(plugin: IsolatedPlugin, name: String, version: String, configuration: JSONValue, running: [String]) {
        guard let created = plugin.create(name, configuration: configuration, running: running) else { return nil }
        self.plugin = plugin
        moduleName = name
        lastInfo = created.info ?? ModuleInfo(name: name, version: version)
        notifications = created.notifications
    }

    /// Asked of the worker's module each time, as a module in process is (its Info may
    /// change as it runs), up to the event deadline; the last answer when its worker is
    /// down or does not answer in time (logged; the worker is then killed and restarted).
    var info: ModuleInfo {
        if let info = plugin.info(moduleName), info.name == moduleName { lastInfo = info }
        return lastInfo
    }

    /// For `ModuleLookupError`: a cast of this stand-in to the module's own types fails.
    var location: String {
        "plugin \(plugin.name)'s worker process\(plugin.status.pid.map { " \($0)" } ?? "")"
    }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        // Its worker's answer is awaited at most the event deadline (then the worker is killed).
        host.handlerKeepsItsOwnDeadline()
        switch event {
        // The worker's own host sent these already (create initializes, configure changes).
        case .initialize, .configurationChanged: return
        case .start: plugin.deliver(moduleName, kind: .start, event: "start", payload: .null)
        case .deinitialize: plugin.deliver(moduleName, kind: .deinitialize, event: "deinit", payload: .null)
        case .notification(let name, let payload): plugin.deliver(moduleName, kind: .notification, event: name, payload: payload)
        case .custom(let name, let payload): plugin.deliver(moduleName, kind: .custom, event: name, payload: payload)
        @unknown default: return
        }
    }

    func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
        await plugin.deliverAwaited(moduleName, event: event.name, payload: event.payload)
    }

    func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        host.handlerKeepsItsOwnDeadline()
        return plugin.configure(moduleName, configuration: configuration) ? self : nil
    }

    func stateForReplacement(host: isolated HostInstance) -> JSONValue? {
        host.handlerKeepsItsOwnDeadline()
        return plugin.stateForReplacement(moduleName)
    }

    func restore(state: JSONValue, host: isolated HostInstance) {
        host.handlerKeepsItsOwnDeadline()
        plugin.restore(moduleName, state: state)
    }
}
