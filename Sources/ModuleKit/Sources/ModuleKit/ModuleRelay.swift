/// Delivers the synchronous events of a group of modules for the host, a whole run of them
/// in one call: the host's stand-ins of C modules, whose code runs on a thread the host can
/// leave behind, so one hand-over to that thread serves every module of the run instead of
/// one per module.
@_spi(ModuleHost)
public protocol ModuleRelay: AnyObject, Sendable {
    /// Delivers `event`, a custom event or a notification, to each of `modules` in order,
    /// as each one's `handle(_:host:)` would, and returns once each has returned or has run
    /// past the host's event deadline (the relay then goes on with the next): true. It
    /// counts each delivery on the module's counters (`ModuleMetrics.countDelivery`, while
    /// the host's context waits for it) and samples handler times as the host does.
    /// False when it delivers nothing and counts nothing: the host then gives the event to
    /// each module's own `handle(_:host:)`.
    func deliver(_ event: ModuleEvent, to modules: ArraySlice<any Module>, host: isolated HostInstance) -> Bool
}

/// A module whose custom events sent to every module, and notifications posted, its relay
/// delivers: the host hands each run of consecutive modules with the same relay (of them,
/// the listeners of a notification) to it in one call. Every other event still reaches
/// the module's `handle(_:host:)`.
@_spi(ModuleHost)
public protocol RelayedModule: Module {
    /// The same object for every module it serves, for as long as the module lives.
    var relay: any ModuleRelay { get }
}
