/// One running module and what the host knows about it.
struct ModuleSlot {
    let factory: ModuleFactory
    var module: any Module
    /// Unique per module object within a host instance: a new instance (even under the
    /// same name) gets a new serial. Observables compare serials, which is comparing by
    /// identity without keeping old objects alive and without reused addresses.
    var serial: UInt64
    var order: Int
    /// `module.notifications`, read once when the object was created.
    var notifications: Set<String>
    /// The counters of this module name (kept across instances).
    let metrics: ModuleMetrics

    var name: String { factory.name }
}

/// The ordered modules of one host instance and the observation API over them: find a
/// module by name, type or protocol, observe the set, wait for one (`getModule`).
///
/// Threading: a `ModuleManager` belongs to its `HostInstance` and is reached as
/// `host.moduleManager` from code running on that host's context (module callbacks, or
/// `host.perform { }`). It is not `Sendable`, so the compiler keeps every use there; it
/// needs no locks. Observables may also be created from anywhere with
/// `HostInstance.observeModules(_:)` and friends.
///
/// Readiness: the modules are *being created or updated* from the moment the host starts
/// adding, removing, replacing or reconfiguring modules until that operation is complete
/// (including the awaited `willUnload` handlers), and before the first such operation (or
/// `start()`) has completed at all. During that time observables emit nothing and
/// `getModule` completions wait. When the operation completes, every subscription is
/// evaluated once, in subscription order.
public final class ModuleManager {
    /// Running modules, sorted by (order, name).
    var slots: [ModuleSlot] = [] {
        didSet {
            cache = nil
            runsCache = nil
            generation &+= 1
        }
    }
    /// Incremented on every change of `slots`.
    private(set) var generation: UInt64 = 0
    /// Parallel arrays derived from `slots`, rebuilt on demand after a change: event
    /// fan-out and observable evaluation read them without copying whole slots.
    private var cache: (modules: [any Module], serials: [UInt64], names: [String], metrics: [ModuleMetrics])?

    private var derived: (modules: [any Module], serials: [UInt64], names: [String], metrics: [ModuleMetrics]) {
        if let cache { return cache }
        let built = (slots.map(\.module), slots.map(\.serial), slots.map(\.name), slots.map(\.metrics))
        cache = built
        return built
    }

    /// The running modules with their serials and counters, in order (cached): what a
    /// synchronous fan-out needs, without copying whole slots.
    var dispatchList: (modules: [any Module], serials: [UInt64], metrics: [ModuleMetrics]) {
        let derived = derived
        return (derived.modules, derived.serials, derived.metrics)
    }

    /// The running modules cut into runs, in order (cached, built when a fan-out first
    /// asks after a change): each run of consecutive modules with the same relay
    /// (`RelayedModule`) with that relay, and each run of other modules without one.
    var relayRuns: [(range: Range<Int>, relay: (any ModuleRelay)?)] {
        if let runsCache { return runsCache }
        var runs: [(range: Range<Int>, relay: (any ModuleRelay)?)] = []
        for (index, module) in derived.modules.enumerated() {
            let relay = (module as? any RelayedModule)?.relay
            if let last = runs.last, last.relay === relay {
                runs[runs.count - 1].range = last.range.lowerBound..<(index + 1)
            } else {
                runs.append((index..<(index + 1), relay))
            }
        }
        runsCache = runs
        return runs
    }
    private var runsCache: [(range: Range<Int>, relay: (any ModuleRelay)?)]?

    /// The running modules in order (cached).
    var orderedModules: [any Module] { derived.modules }
    /// Their serials, in the same order (cached).
    var orderedSerials: [UInt64] { derived.serials }
    private var nextSerial: UInt64 = 0
    private var records: [ObservationRecord] = []
    /// Depth of nested updates; emission happens when it returns to zero.
    var updateDepth = 0
    /// True once a first update (or `start()`) has completed.
    var hasBeenReady = false
    /// True after shutdown: new subscriptions get the final value and finish.
    var isTerminated = false
    private var emitting = false
    private var passRequested = false

    /// Where a module that does not run here runs, for a host whose modules share a plugin
    /// with modules of other processes (an isolated plugin's worker); nil elsewhere.
    let locateElsewhere: (@Sendable (_ module: String) -> String?)?

    init(locateElsewhere: (@Sendable (_ module: String) -> String?)? = nil) {
        self.locateElsewhere = locateElsewhere
    }

    // MARK: Reading the modules

    /// True when no module update is in progress and a first one has completed: the state
    /// in which observables emit and `getModule` answers at once.
    public var isReady: Bool { hasBeenReady && updateDepth == 0 }

    /// The running modules, in order (settings' order, else the factory's default order,
    /// then name). Reflects updates in progress.
    public var modules: [any Module] { orderedModules }

    /// The names of the running modules, in order.
    public var moduleNames: [String] { derived.names }

    /// The running module registered as `name`, or nil.
    public func module(named name: String) -> (any Module)? {
        slots.first { $0.name == name }?.module
    }

    /// The running module named `name` as a `T`: its class, or a protocol it conforms to
    /// (`(any Greeter).self`). Where `module(named:)` and a cast give nil, this says why:
    /// the module is `.notRunning`, `.notOfType` T, or `.inAnotherProcess`: it runs in
    /// another process (its plugin, or this module's, runs isolated, in a worker process of
    /// its own), where no Swift cast reaches its object; use events, notifications or calls
    /// by name to reach it (see the daemon's docs/isolation.md).
    ///
    ///     do {
    ///         let greeter = try host.moduleManager.module(named: "greeting", as: (any Greeter).self)
    ///         greeter.greet()
    ///     } catch {
    ///         host.logger(for: moduleName).warning("no greeter: \(error)")
    ///     }
    public func module<T>(named name: String, as type: T.Type) throws(ModuleLookupError) -> T {
        // The type's name is spelled only for an error: a lookup that finds its module
        // costs a search and a cast, nothing more.
        func failure(_ reason: ModuleLookupError.Reason, location: String? = nil) -> ModuleLookupError {
            ModuleLookupError(module: name, type: "\(T.self)", reason: reason, location: location)
        }
        if let module = module(named: name) {
            if let found = module as? T { return found }
            if let standIn = module as? any ModuleInAnotherProcess { throw failure(.inAnotherProcess, location: standIn.location) }
            throw failure(.notOfType)
        }
        if let location = locateElsewhere?(name) { throw failure(.inAnotherProcess, location: location) }
        throw failure(.notRunning)
    }

    // MARK: Observing

    /// Observes the objects produced by the successful transformations of the modules,
    /// whether or not a given module is currently enabled (a disabled module simply
    /// contributes nothing).
    ///
    /// While the modules are being created or updated a subscriber receives no value at
    /// all, never a premature `[]`. Once they are ready, `transform` is called with every
    /// running module, in order, and the observable emits the objects of all the
    /// transformations that succeeded, in order, or `[]` when none did.
    ///
    /// The array is emitted again only when the set of modules whose transformation
    /// succeeded changes by identity or order: a module mutated in place by
    /// `updateConfiguration` (same instance) is not re-emitted; a module replaced by a new
    /// instance with the same name is.
    ///
    ///     host.moduleManager.observeModules { $0 as? Greeter }
    ///         .subscribe { greeters in for greeter in greeters { greeter.greet() } }
    ///
    /// `transform` is `@Sendable` because the observable may travel; it is only ever
    /// called on the host's context.
    public func observeModules<T>(
        isolation: isolated HostInstance = #isolation,
        _ transform: @escaping @Sendable (any Module) -> T?
    ) -> Observable<[T]> {
        Self.modulesObservable(host: isolation, transform)
    }

    /// Observes the object produced by the first successful transformation of a module, in
    /// order, whether or not a given module is currently enabled.
    ///
    /// While the modules are being created or updated a subscriber receives no value at
    /// all, never a premature nil. Once they are ready, `transform` is called with every
    /// running module, in order, until one returns non-nil; the observable emits that
    /// object, or nil when no transformation succeeds.
    ///
    /// The object is emitted again only when the module whose transformation succeeded
    /// changes by identity (nil counts as a value: nil → nil is not re-emitted).
    public func observeModule<T>(
        isolation: isolated HostInstance = #isolation,
        _ transform: @escaping @Sendable (any Module) -> T?
    ) -> Observable<T?> {
        Self.moduleObservable(host: isolation, transform)
    }

    /// Observes the module of type `T`, whether or not it is currently enabled.
    ///
    /// While the modules are being created or updated a subscriber receives no value at
    /// all. Once this starts emitting, nil means the module is not enabled (not running):
    /// it never means that the modules are still being created. When several running
    /// modules have type `T`, the first by order wins. It emits again only when the
    /// resolved module changes by identity.
    public func observeModule<T: Module & SendableMetatype>(
        isolation: isolated HostInstance = #isolation,
        _ type: T.Type = T.self
    ) -> Observable<T?> {
        Self.moduleObservable(host: isolation) { $0 as? T }
    }

    /// Retrieves the object produced by the first successful transformation of a module, in
    /// order, and calls `completion` with it (or nil when no transformation succeeds)
    /// exactly once, on the host's context, as soon as the modules are ready: before this
    /// returns when they already are, otherwise when the update in progress completes.
    ///
    /// Disposing of the returned `Disposable` before then prevents the call; when the call
    /// has already started on the host's context, `dispose()` from another thread returns
    /// once `completion` has returned (see `Disposable`). When the host shuts down first,
    /// `completion` is called with nil.
    ///
    ///     host.moduleManager.getModule(transform: { $0 as? Greeter }) { $0?.greet() }
    @discardableResult
    public func getModule<T>(
        transform: @escaping (any Module) -> T? = { $0 as? T },
        completion: @escaping (T?) -> Void
    ) -> any Disposable {
        let token = SubscriptionToken()
        register(
            ObservationRecord(
                token: token,
                deliver: { manager in
                    token.deliverOnce { completion(manager.firstTransformation(transform)) }
                },
                finish: nil))
        return token
    }

    // MARK: Observable factories (shared with HostInstance's nonisolated entry points)

    static func modulesObservable<T>(
        host: HostInstance, _ transform: @escaping @Sendable (any Module) -> T?
    ) -> Observable<[T]> {
        Observable(host: host) { host, token, sink in
            var lastSerials: [UInt64]?
            host.moduleManager.register(
                ObservationRecord(
                    token: token,
                    deliver: { manager in
                        let modules = manager.orderedModules
                        let allSerials = manager.orderedSerials
                        var serials: [UInt64] = []
                        var values: [T] = []
                        for index in modules.indices {
                            if let value = transform(modules[index]) {
                                serials.append(allSerials[index])
                                values.append(value)
                            }
                        }
                        guard serials != lastSerials else { return }
                        lastSerials = serials
                        token.deliver { sink.receive(values) }
                    },
                    finish: sink.finish))
        }
    }

    static func moduleObservable<T>(
        host: HostInstance, _ transform: @escaping @Sendable (any Module) -> T?
    ) -> Observable<T?> {
        Observable(host: host) { host, token, sink in
            // nil: nothing emitted yet; .some(nil): emitted nil; .some(serial): emitted that module.
            var lastSerial: UInt64??
            host.moduleManager.register(
                ObservationRecord(
                    token: token,
                    deliver: { manager in
                        let modules = manager.orderedModules
                        var found: (serial: UInt64, value: T)?
                        for index in modules.indices {
                            if let value = transform(modules[index]) {
                                found = (manager.orderedSerials[index], value)
                                break
                            }
                        }
                        let serial: UInt64? = found?.serial
                        if let lastSerial, lastSerial == serial { return }
                        lastSerial = .some(serial)
                        token.deliver { sink.receive(found?.value) }
                    },
                    finish: sink.finish))
        }
    }

    // MARK: Emission

    func firstTransformation<T>(_ transform: (any Module) -> T?) -> T? {
        for module in orderedModules {
            if let value = transform(module) { return value }
        }
        return nil
    }

    /// Adds a subscription; delivers the current value at once when ready.
    func register(_ record: ObservationRecord) {
        if records.count >= 32 { records.removeAll { $0.token.isSpent } }
        if isTerminated {
            if !record.token.isSpent { record.deliver(self) }
            record.finish?()
            return
        }
        records.append(record)
        if isReady, !record.token.isSpent { record.deliver(self) }
    }

    /// Evaluates every live subscription once (called when an update completes). A change
    /// made by an observer during the pass triggers one more pass instead of a nested one.
    func notifyObservers() {
        guard isReady else { return }
        if emitting {
            passRequested = true
            return
        }
        emitting = true
        defer { emitting = false }
        repeat {
            passRequested = false
            records.removeAll { $0.token.isSpent }
            for record in records where !record.token.isSpent {
                record.deliver(self)
                if !isReady { break }
            }
        } while passRequested && isReady
    }

    /// After the final emission of a shutdown: completes every stream and drops every
    /// subscription (pending `getModule` completions were answered by that emission).
    func finishAll() {
        isTerminated = true
        let finishing = records
        records.removeAll()
        for record in finishing { record.finish?() }
    }

    // MARK: Slots

    func makeSerial() -> UInt64 {
        nextSerial += 1
        return nextSerial
    }

    func index(ofSerial serial: UInt64) -> Int? { orderedSerials.firstIndex(of: serial) }

    func slot(named name: String) -> ModuleSlot? { slots.first { $0.name == name } }

    /// Inserts `slot` among the sorted slots: after every slot ordered before it or equal to
    /// it by (order, name), as appending it and sorting stably would place it.
    func insert(_ slot: ModuleSlot) {
        slots.insert(slot, at: slots.partitionPoint { ($0.order, $0.name) <= (slot.order, slot.name) })
    }

    /// Sorts by (order, name); stable for equal keys.
    func sortSlots() {
        let sorted = slots.enumerated().sorted { lhs, rhs in
            if lhs.element.order != rhs.element.order { return lhs.element.order < rhs.element.order }
            if lhs.element.name != rhs.element.name { return lhs.element.name < rhs.element.name }
            return lhs.offset < rhs.offset
        }.map(\.element)
        if sorted.map(\.serial) != slots.map(\.serial) { slots = sorted }
    }
}

/// One subscription or pending completion, evaluated on the host's context.
final class ObservationRecord {
    let token: SubscriptionToken
    let deliver: (ModuleManager) -> Void
    let finish: (() -> Void)?

    init(token: SubscriptionToken, deliver: @escaping (ModuleManager) -> Void, finish: (() -> Void)?) {
        self.token = token
        self.deliver = deliver
        self.finish = finish
    }
}

extension Array {
    /// The index of the first element for which `precedes` is false, found by halving:
    /// `precedes` must hold for a prefix of the array and for nothing after it.
    func partitionPoint(_ precedes: (Element) -> Bool) -> Int {
        var low = startIndex, high = endIndex
        while low < high {
            let middle = low + (high - low) / 2
            if precedes(self[middle]) { low = middle + 1 } else { high = middle }
        }
        return low
    }
}
