import Synchronization

/// A value that wants to know when it is installed on a bus.
/// Both hooks run on the installing thread, outside the bus's lock, so they may use the
/// bus: `preInstall` before the value becomes accessible, `postInstall` after.
public protocol Installable: Sendable {
    /// Called before the value becomes accessible on `bus`.
    func preInstall(on bus: Bus)
    /// Called once the value is accessible on `bus`.
    func postInstall(on bus: Bus)
}

/// A value that wants to know when it is uninstalled from a bus. Both hooks run on the uninstalling thread, outside the bus's lock:
/// `preUninstall` while the value is still accessible, `postUninstall` after it is gone.
public protocol Uninstallable: Sendable {
    /// Called while the value is still accessible on `bus`.
    func preUninstall(from bus: Bus)
    /// Called once the value is no longer on `bus`.
    func postUninstall(from bus: Bus)
}

extension Installable {
    /// Does nothing by default.
    public func preInstall(on bus: Bus) {}
    /// Does nothing by default.
    public func postInstall(on bus: Bus) {}
}

extension Uninstallable {
    /// Does nothing by default.
    public func preUninstall(from bus: Bus) {}
    /// Does nothing by default.
    public func postUninstall(from bus: Bus) {}
}

/// A plain value with install/uninstall hooks attached. The bus
/// stores the wrapped value under its own type, so `bus.access() as Value?` finds it.
///
///     bus.install(HookedValue(Settings(name: "x")).preInstall { print("installing on", $0) })
public struct HookedValue<Value: Sendable>: Installable, Uninstallable {
    /// The wrapped value.
    public let value: Value
    private var onPreInstall: (@Sendable (Bus) -> Void)?
    private var onPostInstall: (@Sendable (Bus) -> Void)?
    private var onPreUninstall: (@Sendable (Bus) -> Void)?
    private var onPostUninstall: (@Sendable (Bus) -> Void)?

    /// Wraps `value`, with no hooks yet (add them with the builder methods).
    public init(_ value: Value) { self.value = value }

    /// A copy that also runs `hook` before the value is installed.
    public func preInstall(_ hook: @escaping @Sendable (Bus) -> Void) -> HookedValue {
        var copy = self
        copy.onPreInstall = hook
        return copy
    }

    /// A copy that also runs `hook` after the value is installed.
    public func postInstall(_ hook: @escaping @Sendable (Bus) -> Void) -> HookedValue {
        var copy = self
        copy.onPostInstall = hook
        return copy
    }

    /// A copy that also runs `hook` before the value is uninstalled.
    public func preUninstall(_ hook: @escaping @Sendable (Bus) -> Void) -> HookedValue {
        var copy = self
        copy.onPreUninstall = hook
        return copy
    }

    /// A copy that also runs `hook` after the value is uninstalled.
    public func postUninstall(_ hook: @escaping @Sendable (Bus) -> Void) -> HookedValue {
        var copy = self
        copy.onPostUninstall = hook
        return copy
    }

    /// Runs the `preInstall` hook, then the wrapped value's own if it has one.
    public func preInstall(on bus: Bus) {
        onPreInstall?(bus)
        (value as? any Installable)?.preInstall(on: bus)
    }

    /// Runs the `postInstall` hook, then the wrapped value's own if it has one.
    public func postInstall(on bus: Bus) {
        onPostInstall?(bus)
        (value as? any Installable)?.postInstall(on: bus)
    }

    /// Runs the `preUninstall` hook, then the wrapped value's own if it has one.
    public func preUninstall(from bus: Bus) {
        onPreUninstall?(bus)
        (value as? any Uninstallable)?.preUninstall(from: bus)
    }

    /// Runs the `postUninstall` hook, then the wrapped value's own if it has one.
    public func postUninstall(from bus: Bus) {
        onPostUninstall?(bus)
        (value as? any Uninstallable)?.postUninstall(from: bus)
    }
}

/// What `HookedValue` lets the bus see: the value to store.
private protocol HookedValueProtocol: Sendable {
    var storedValue: any Sendable { get }
}

extension HookedValue: HookedValueProtocol {
    fileprivate var storedValue: any Sendable { value }
}

/// A bus with a type of its own, so that it can be installed on another bus and found
/// there by that type:
///
///     final class AudioBus: SubBus { let bus = Bus(label: "audio") }
///     parent.install(AudioBus())
///     let audio = parent.access() as AudioBus?
///
/// Uninstalling it uninstalls everything on it, in reverse order, with hooks.
public protocol SubBus: AnyObject, Sendable {
    /// The bus holding this sub-bus's contents: a stored constant (`let bus = Bus(...)`). It
    /// is read while other installs of buses wait, so it must not install anything itself.
    var bus: Bus { get }
}

extension SubBus {
    /// Installs on this sub-bus's `bus`.
    @discardableResult
    public func install<T: Sendable>(_ item: T) -> Bool { bus.install(item) }
    /// Uninstalls from this sub-bus's `bus`.
    @discardableResult
    public func uninstall<T: Sendable>(_ item: T) -> Bool { bus.uninstall(item) }
    /// Accesses this sub-bus's `bus`.
    public func access<T>(_ type: T.Type = T.self) -> T? { bus.access(type) }
}

/// A dependency container: install any `Sendable` object or
/// value, access it by type, uninstall it; optional hooks around both.
///
/// Threading: a `Bus` is a `Sendable` class whose contents are guarded by a lock, so it
/// can be used from every module's context, from any thread, and through the process-wide
/// `Backdoor`. That is why it holds only `Sendable` values (actors, immutable or
/// internally locked classes, value types); module objects themselves are not installed.
/// Hooks run on the calling thread outside the lock, so they may use the bus.
///
/// Keys: an item is stored under its dynamic type (a `HookedValue` under its wrapped
/// value's type). Installing an item whose type is already present replaces the old item,
/// which is uninstalled first (with its hooks). `access()` returns the item of exactly the
/// requested type, else the first item, in installation order, that casts to it (so
/// `access() as SomeProtocol?` works).
public final class Bus: Sendable, CustomStringConvertible {
    #if MODULEKIT_ABI_TEST_ADDITIONS
    // ABI upgrade test only: a stored property added first, moving the others.
    public let abiTestNote = "added"
    #endif
    /// A label for descriptions and logs.
    public let label: String

    private struct Item {
        let serial: UInt64
        let key: ObjectIdentifier
        /// What `access` returns.
        let value: any Sendable
        /// What was installed (the `HookedValue` itself, or the value): its hooks run.
        let installed: any Sendable
    }

    private struct State {
        var items: [Item] = []
        var nextSerial: UInt64 = 0
        /// Items being uninstalled: claimed by one thread, whose hooks run exactly once.
        var leaving: Set<UInt64> = []
        /// Items being installed (their `preInstall` running): not accessible yet, but an
        /// object here is not installed again by another thread.
        var arriving: [Item] = []

        /// Marks the first item matching `predicate` that nobody is uninstalling as leaving.
        mutating func claim(where predicate: (Item) -> Bool) -> Item? {
            guard let item = items.first(where: { !leaving.contains($0.serial) && predicate($0) }) else { return nil }
            leaving.insert(item.serial)
            return item
        }
    }

    private let state = Mutex(State())

    /// An empty bus.
    public init(label: String = "bus") { self.label = label }

    #if !MODULEKIT_ABI_TEST_BREAKING  // the ABI upgrade test's breaking change removes it
    /// Creates a bus and lets `configure` install its contents before returning it.
    public static func new(label: String = "bus", _ configure: (Bus) -> Void) -> Bus {
        let bus = Bus(label: label)
        configure(bus)
        return bus
    }
    #endif

    /// "Bus(label)".
    public var description: String { "Bus(\(label))" }

    /// Installs `item`: `preInstall` hook, then the item becomes accessible under its type
    /// (replacing an item of the same type, which is uninstalled first with its hooks),
    /// then `postInstall`.
    ///
    /// Returns true when this call installed `item`, false when it did nothing:
    /// - `item` is an object that is already installed on this bus, or that another call is
    ///   installing at this moment (from another thread, or from its own hooks): the object
    ///   is installed once, with one `preInstall`/`postInstall` pair, by the call that
    ///   returns true. A call that returns false because another one is still running does
    ///   not wait for it: the object becomes accessible once that call's `preInstall` has
    ///   returned.
    /// - `item` is this bus or a bus (or `SubBus`) that contains this bus, or on which this
    ///   bus is being installed (from a hook, or another thread), which would make a cycle.
    ///   Of two installs that together would make one, from any threads, one returns false.
    ///
    /// Values (not objects) are never "the same": installing one always installs it,
    /// replacing the item of its type.
    @discardableResult
    public func install<T: Sendable>(_ item: T) -> Bool {
        let installed: any Sendable = item
        let value: any Sendable = (installed as? any HookedValueProtocol)?.storedValue ?? installed
        let key = ObjectIdentifier(type(of: value))
        // Reserve the install: from here on, another install of the same object returns false.
        func reserve() -> (serial: UInt64, existing: Item?)? {
            state.withLock { state in
                let isSame = { (other: Item) in other.key == key && Self.isSameObject(other.value, value) }
                if state.arriving.contains(where: isSame)
                    || state.items.contains(where: { !state.leaving.contains($0.serial) && isSame($0) })
                {
                    return nil
                }
                state.nextSerial += 1
                state.arriving.append(Item(serial: state.nextSerial, key: key, value: value, installed: installed))
                return (state.nextSerial, state.claim { $0.key == key })
            }
        }
        let reserved: (serial: UInt64, existing: Item?)?
        if let nested = Self.bus(in: value) {
            // The check and the reservation as one step, for every bus at once: two installs
            // that together would make a cycle (A on B and B on A) cannot both pass it.
            reserved = Self.nesting.withLock { _ in nested.reaches(self) ? nil : reserve() }
        } else {
            reserved = reserve()
        }
        guard let reserved else { return false }
        if let existing = reserved.existing { finishUninstall(existing) }
        (installed as? any Installable)?.preInstall(on: self)
        let displaced = state.withLock { state -> Item? in
            // Only this call removes its reservation, so it is still there.
            let arrived = state.arriving.remove(at: state.arriving.firstIndex { $0.serial == reserved.serial }!)
            // Another thread may have installed the same type meanwhile: the later one wins.
            let displaced = state.claim { $0.key == key }
            state.items.append(arrived)
            return displaced
        }
        if let displaced { finishUninstall(displaced) }
        (installed as? any Installable)?.postInstall(on: self)
        return true
    }

    /// Uninstalls the item `item` designates: for an object, that very object; for a value
    /// (or a `HookedValue`), the item stored under its type. Hooks: `preUninstall` (the item
    /// still accessible), then, for a bus or `SubBus`, everything on it is uninstalled in
    /// reverse order, then the item is removed, then `postUninstall`. Each installed item
    /// gets its uninstall hooks exactly once, even when several threads uninstall it.
    /// Returns false when nothing matched (or another thread is already uninstalling it).
    @discardableResult
    public func uninstall<T: Sendable>(_ item: T) -> Bool {
        let given: any Sendable = item
        let value: any Sendable = (given as? any HookedValueProtocol)?.storedValue ?? given
        let key = ObjectIdentifier(type(of: value))
        let isObject = type(of: value) is AnyObject.Type
        guard
            let claimed = state.withLock({ state in
                state.claim { $0.key == key && (!isObject || Self.isSameObject($0.value, value)) }
            })
        else { return false }
        finishUninstall(claimed)
        return true
    }

    /// Uninstalls the item `access(type)` would return. Returns false when there is none.
    @discardableResult
    public func uninstall<T>(type: T.Type) -> Bool {
        let claimed = state.withLock { state -> Item? in
            let key = ObjectIdentifier(T.self)
            return state.claim { $0.key == key } ?? state.claim { $0.value is T }
        }
        guard let claimed else { return false }
        finishUninstall(claimed)
        return true
    }

    /// Uninstalls everything, in reverse order of installation, each with its hooks (a bus
    /// on this bus with its own contents first, as `uninstall` does).
    public func uninstallAll() {
        while let last = state.withLock({ state in
            state.items.last { !state.leaving.contains($0.serial) }.flatMap { item in state.claim { $0.serial == item.serial } }
        }) {
            finishUninstall(last)
        }
    }

    /// The item of type `T` (see the type's documentation for the lookup rule), or nil.
    ///
    ///     let store = bus.access() as KeyValueStore?
    public func access<T>(_ type: T.Type = T.self) -> T? {
        state.withLock { state -> T? in
            let key = ObjectIdentifier(T.self)
            let item = state.items.first { $0.key == key } ?? state.items.first { $0.value is T }
            return item?.value as? T
        }
    }

    /// Every item that casts to `T`, in installation order.
    public func accessAll<T>(_ type: T.Type = T.self) -> [T] {
        state.withLock { state in state.items.compactMap { $0.value as? T } }
    }

    /// The number of items installed.
    public var count: Int { state.withLock { $0.items.count } }

    /// True when `bus` is this bus or is installed on it, directly or on a bus on it.
    public func contains(bus: Bus) -> Bool { reaches(bus, countingArriving: false) }

    // MARK: Internals

    /// Held by an install of a bus (or `SubBus`) from its check for a cycle to its
    /// reservation: the check must see every bus install that passed it before.
    private static let nesting = Mutex<Void>(())

    /// Whether `bus` is this bus, or is on it, directly or on a bus on it; with
    /// `countingArriving`, also a bus being installed (its `preInstall` running): then
    /// installing this bus on `bus` would make a cycle.
    private func reaches(_ bus: Bus, countingArriving: Bool = true) -> Bool {
        if bus === self { return true }
        // The values under the lock; a `SubBus`'s `bus` (its code) is read outside it.
        let values = state.withLock { state in (countingArriving ? state.items + state.arriving : state.items).map(\.value) }
        return values.lazy.compactMap(Self.bus(in:)).contains { $0.reaches(bus, countingArriving: countingArriving) }
    }

    /// Runs the uninstall of an item this thread claimed: pre hook, contents of a nested
    /// bus, removal, post hook.
    private func finishUninstall(_ item: Item) {
        let hooks = item.installed as? any Uninstallable
        hooks?.preUninstall(from: self)
        Self.bus(in: item.value)?.uninstallAll()
        state.withLock { state in
            state.items.removeAll { $0.serial == item.serial }
            state.leaving.remove(item.serial)
        }
        hooks?.postUninstall(from: self)
    }

    private static func bus(in value: any Sendable) -> Bus? {
        if let bus = value as? Bus { return bus }
        return (value as? any SubBus)?.bus
    }

    private static func isSameObject(_ lhs: any Sendable, _ rhs: any Sendable) -> Bool {
        guard type(of: lhs) is AnyObject.Type, type(of: rhs) is AnyObject.Type else { return false }
        return (lhs as AnyObject) === (rhs as AnyObject)
    }
}

/// The process-wide default bus: one `Bus` that any code in the
/// process can reach without a reference to a host instance. Every member is safe to use
/// from any thread concurrently.
///
/// Host instances do not use it; each has its own `HostInstance.bus`. An application that
/// wants one shared bus installs it here.
public enum Backdoor {
    private static let current = Mutex<Bus?>(nil)

    /// Makes `bus` the process-wide bus (replacing the previous one, which is left as is).
    public static func install(on bus: Bus) {
        current.withLock { $0 = bus }
    }

    /// Uninstalls the Backdoor from `bus`: when `bus` is the current process-wide bus it is
    /// no longer reachable here, and everything on it is uninstalled in reverse order with
    /// its hooks. Does
    /// nothing when `bus` is nil or not the current bus.
    public static func uninstall(from bus: Bus?) {
        guard let bus else { return }
        let wasCurrent = current.withLock { current -> Bool in
            guard current === bus else { return false }
            current = nil
            return true
        }
        if wasCurrent { bus.uninstallAll() }
    }

    /// The process-wide bus, or nil when none is installed.
    public static var bus: Bus? { current.withLock { $0 } }
}
