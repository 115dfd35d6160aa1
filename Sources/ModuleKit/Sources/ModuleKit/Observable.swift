internal import Dispatch
import Glibc
import Synchronization

/// Something that can be disposed of to stop a delivery: a subscription, or a pending
/// `getModule` completion.
///
/// `dispose()` may be called from any thread, any number of times. Once it has returned,
/// the observer or completion it guards is never called again, from any thread:
/// - A call that has not started when `dispose()` is entered never starts.
/// - A call already running on another thread (an emission in flight on the host's
///   context, or an `observeOn` delivery on its queue) is waited for: `dispose()` returns
///   only after that call has returned.
/// - Called from inside the observer or completion itself (on the thread running it),
///   `dispose()` does not wait for the call it is part of, so it cannot deadlock; that call
///   goes on to its end and no later call starts.
///
/// Because `dispose()` may wait for a running call, an observer must not wait for the
/// thread that disposes of it (nor for a lock that thread holds while disposing), and two
/// observers running on different threads must not dispose of each other's subscriptions.
public protocol Disposable: Sendable {
    /// Stops the delivery, waiting for a call running on another thread to return (see the
    /// protocol). Idempotent; safe from any thread.
    func dispose()
    /// True once `dispose()` was called, and only then: a `getModule` completion that was
    /// delivered leaves it false (the completion itself tells that it ran).
    var isDisposed: Bool { get }
}

/// The `Disposable` every subscription of this module returns. Every call of the observer
/// it guards goes through `deliver` (or `deliverOnce`), which starts the call only while
/// the token is not disposed and registers the running thread, so that `dispose()` can
/// wait for calls running on other threads.
final class SubscriptionToken: Disposable {
    private struct State {
        /// `dispose()` was called.
        var disposed = false
        /// No call starts any more: disposed, or a one-shot call started.
        var spent = false
        /// The threads running a guarded call (at most one for serial deliveries; a thread
        /// appears once per call it runs).
        var callers: [pthread_t] = []
        /// Disposers waiting until no thread but their own runs a guarded call.
        var waiters: [(thread: pthread_t, wake: DispatchSemaphore)] = []
    }
    private let state: Mutex<State>

    init(disposed: Bool = false) { state = Mutex(State(disposed: disposed, spent: disposed)) }

    func dispose() {
        let me = pthread_self()
        let wait = state.withLock { state -> DispatchSemaphore? in
            state.disposed = true
            state.spent = true
            guard state.callers.contains(where: { pthread_equal($0, me) == 0 }) else { return nil }
            let wake = DispatchSemaphore(value: 0)
            state.waiters.append((me, wake))
            return wake
        }
        wait?.wait()
    }

    var isDisposed: Bool { state.withLock { $0.disposed } }

    /// True once no guarded call starts any more: disposed, or a one-shot call started.
    var isSpent: Bool { state.withLock { $0.spent } }

    /// Runs `call` unless the token is disposed; `dispose()` on another thread waits for it.
    func deliver(_ call: () -> Void) {
        guard let me = begin(once: false) else { return }
        defer { end(me) }
        call()
    }

    /// Like `deliver`, but marks the token spent as the call starts: `call` runs at most
    /// once, however many times this is reached. For one-shot completions.
    func deliverOnce(_ call: () -> Void) {
        guard let me = begin(once: true) else { return }
        defer { end(me) }
        call()
    }

    private func begin(once: Bool) -> pthread_t? {
        let me = pthread_self()
        return state.withLock { state -> pthread_t? in
            if state.spent { return nil }
            if once { state.spent = true }
            state.callers.append(me)
            return me
        }
    }

    private func end(_ me: pthread_t) {
        let woken = state.withLock { state -> [DispatchSemaphore] in
            if let index = state.callers.firstIndex(where: { pthread_equal($0, me) != 0 }) {
                state.callers.remove(at: index)
            }
            guard !state.waiters.isEmpty else { return [] }
            let callers = state.callers
            var woken: [DispatchSemaphore] = []
            state.waiters.removeAll { waiter in
                // A waiter disposing from inside a call of its own waits only for the others.
                guard callers.allSatisfy({ pthread_equal($0, waiter.thread) != 0 }) else { return false }
                woken.append(waiter.wake)
                return true
            }
            return woken
        }
        for wake in woken { wake.signal() }
    }
}

/// A set of disposables disposed of together, e.g. everything a module subscribed to,
/// disposed of when it receives `.deinitialize`. Safe from any thread.
public final class DisposeBag: Disposable {
    private struct State {
        var items: [any Disposable] = []
        var disposed = false
    }
    private let state = Mutex(State())

    /// An empty bag.
    public init() {}

    /// Adds `disposable`; disposes of it at once when the bag was already disposed of.
    public func add(_ disposable: any Disposable) {
        let keep = state.withLock { state -> Bool in
            if state.disposed { return false }
            state.items.append(disposable)
            return true
        }
        if !keep { disposable.dispose() }
    }

    /// Disposes of every disposable added so far, in the order they were added, and of
    /// every one added later.
    public func dispose() {
        let items = state.withLock { state -> [any Disposable] in
            state.disposed = true
            defer { state.items.removeAll() }
            return state.items
        }
        for item in items { item.dispose() }
    }

    /// True once `dispose()` was called.
    public var isDisposed: Bool { state.withLock { $0.disposed } }
}

extension Disposable {
    /// Adds this disposable to `bag` (chaining form: `observable.subscribe { ... }.disposed(by: bag)`).
    public func disposed(by bag: DisposeBag) { bag.add(self) }
}

/// A stream of values produced on one host instance's serial context.
///
/// - Creation: anywhere. An `Observable` is a `Sendable` description; creating one does no
///   work and touches no module.
/// - Subscription: on its host's context. `subscribe` takes the caller's isolation, which
///   must be that `HostInstance`; the compiler rejects a call from any other context
///   (`#isolation` would not be a `HostInstance`), and a call from another host instance's
///   context stops the process with a precondition failure.
/// - Emission: on the host's context, synchronously, in subscription order. The observables
///   made by `ModuleManager` emit nothing while modules are being created or updated, and
///   when subscribed while the modules are ready they emit the current value at once,
///   before `subscribe` returns.
/// - To consume values elsewhere: `observeOn(_:)` (a serial queue, subscribable from any
///   thread; the subscription hops to the host's context), `values`
///   (an `AsyncStream`, for `Sendable` values, iterable anywhere) or `valuesOnHost()` (an
///   `AsyncSequence` iterated on the host's context, for module objects).
public struct Observable<Element>: Sendable {
    /// The host instance on whose context the observable is subscribed and emits. Weak:
    /// an observable does not keep its host alive.
    public weak let host: HostInstance?

    /// Attaches an observer under a token, on the host's context.
    let attach: @Sendable (isolated HostInstance, SubscriptionToken, ObservationSink<Element>) -> Void

    init(
        host: HostInstance,
        attach: @escaping @Sendable (isolated HostInstance, SubscriptionToken, ObservationSink<Element>) -> Void
    ) {
        self.host = host
        self.attach = attach
    }

    /// Subscribes `observer`, which is then called on the host's context with every value
    /// the observable emits (the current one first, at once, when the modules are ready),
    /// until the returned `Disposable` is disposed of or the host shuts down. Once
    /// `dispose()` has returned, `observer` is never called again: disposing from another
    /// thread waits for a call in flight on the host's context; disposing from inside
    /// `observer` returns at once (see `Disposable`).
    ///
    /// Must be called on this observable's host context: the default `isolation` argument
    /// is the caller's actor, which the compiler requires to be a `HostInstance`.
    @discardableResult
    public func subscribe(
        isolation: isolated HostInstance = #isolation, _ observer: @escaping (Element) -> Void
    ) -> any Disposable {
        let token = SubscriptionToken()
        attachChecked(isolation, token, ObservationSink(receive: observer, finish: nil))
        return token
    }

    /// An observable emitting `transform` of every value of this one. The transform runs
    /// on the host's context; it does not drop repeated values.
    public func map<Mapped>(_ transform: @escaping @Sendable (Element) -> Mapped) -> Observable<Mapped> {
        let upstream = self
        return Observable<Mapped>(weakHost: host) { host, token, sink in
            upstream.attachChecked(host, token, ObservationSink(receive: { sink.receive(transform($0)) }, finish: sink.finish))
        }
    }

    /// The values of this observable as an `AsyncSequence` iterated on the host's context,
    /// for elements that may not leave it (module objects). The subscription is made
    /// before this returns, so no value emitted afterwards is lost; values are buffered
    /// until the loop asks for them. The sequence ends when the host shuts down or the
    /// iterating task is cancelled; breaking out of the loop (dropping the sequence and
    /// iterator) disposes of the subscription.
    ///
    /// The compiler keeps the sequence on the host's context: it cannot be sent elsewhere.
    public func valuesOnHost(isolation: isolated HostInstance = #isolation) -> HostValueSequence<Element> {
        let buffer = HostValueBuffer<Element>(token: SubscriptionToken())
        attachChecked(
            isolation, buffer.token,
            ObservationSink(
                receive: { [weak buffer] value in buffer?.push(value) },
                finish: { [weak buffer] in buffer?.finish() }))
        return HostValueSequence(buffer: buffer, host: isolation)
    }

    private init(
        weakHost host: HostInstance?,
        attach: @escaping @Sendable (isolated HostInstance, SubscriptionToken, ObservationSink<Element>) -> Void
    ) {
        self.host = host
        self.attach = attach
    }

    /// Attaches after checking that `isolation` is this observable's host.
    func attachChecked(_ isolation: isolated HostInstance, _ token: SubscriptionToken, _ sink: ObservationSink<Element>) {
        precondition(
            host === isolation,
            "an Observable must be subscribed on the context of the HostInstance that made it")
        attach(isolation, token, sink)
    }
}

/// Where an observable delivers: the observer, and what to do when the host shuts down
/// (streams finish).
struct ObservationSink<Element> {
    let receive: (Element) -> Void
    let finish: (() -> Void)?
}

extension Observable where Element: Sendable {
    /// The values as an `AsyncStream`, iterable from any context. Creating the stream
    /// subscribes on the host's context asynchronously (a hop), so the first value is the
    /// state at that moment; later values are buffered in order until consumed. The stream
    /// finishes when the host shuts down; cancelling the consuming task or dropping the
    /// stream disposes of the subscription.
    public var values: AsyncStream<Element> {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self)
        let token = SubscriptionToken()
        continuation.onTermination = { _ in token.dispose() }
        guard let host else {
            continuation.finish()
            return stream
        }
        let upstream = self
        Task {
            await host.perform { host in
                upstream.attachChecked(
                    host, token,
                    ObservationSink(receive: { continuation.yield($0) }, finish: { continuation.finish() }))
            }
        }
        return stream
    }

    /// An observable that may be subscribed from any thread (the subscription hops to the
    /// host's context) and delivers every value, in order, through `enqueue`: each value
    /// becomes one work item handed to `enqueue`, which must run the items one at a time in
    /// the order given, e.g. on a serial dispatch queue:
    ///
    ///     names.observeOn { queue.async(execute: $0) }.subscribe { print($0) }
    ///
    /// (A closure rather than a `DispatchQueue` parameter: Dispatch is not built with
    /// library evolution, so ModuleKit's binary interface does not name its types.)
    public func observeOn(_ enqueue: @escaping @Sendable (_ work: @escaping @Sendable () -> Void) -> Void) -> RelayedObservable<Element> {
        RelayedObservable(upstream: self, enqueue: enqueue)
    }
}

/// An observable whose values are delivered on a serial queue of the subscriber's
/// choosing (see `Observable.observeOn(_:)`). `subscribe` may be called from any thread.
public struct RelayedObservable<Element: Sendable>: Sendable {
    let upstream: Observable<Element>
    let enqueue: @Sendable (@escaping @Sendable () -> Void) -> Void

    /// Subscribes from any thread. The subscription is made on the host's context shortly
    /// after this returns; `observer` is then called through the queue with every value, in
    /// emission order, until the returned `Disposable` is disposed of. Values already queued
    /// when `dispose()` is entered are dropped; a call running on the queue at that moment is
    /// waited for (unless `dispose()` is called from inside it), so once `dispose()` has
    /// returned, `observer` is never called again.
    @discardableResult
    public func subscribe(_ observer: @escaping @Sendable (Element) -> Void) -> any Disposable {
        let token = SubscriptionToken()
        guard let host = upstream.host else { return token }
        let upstream = self.upstream
        let enqueue = self.enqueue
        Task {
            await host.perform { host in
                upstream.attachChecked(
                    host, token,
                    ObservationSink(
                        receive: { value in
                            enqueue { token.deliver { observer(value) } }
                        },
                        finish: nil))
            }
        }
        return token
    }
}

/// The buffer behind `valuesOnHost()`. Only touched on the host's context: the emission
/// side runs there, and the sequence holding it cannot leave that context. The suspended
/// reader's continuation lives in a `Sendable` box so that task cancellation (from any
/// thread) can wake it.
final class HostValueBuffer<Element> {
    let token: SubscriptionToken
    private var items: [Element] = []
    private var head = 0
    private var finished = false
    private let waiter = WaiterBox()

    init(token: SubscriptionToken) { self.token = token }

    deinit { token.dispose() }

    func push(_ value: Element) {
        items.append(value)
        waiter.wake()
    }

    func finish() {
        finished = true
        waiter.wake()
    }

    /// The next value; nil once the host has shut down or the calling task is cancelled.
    func next(isolation actor: isolated (any Actor)?) async -> Element? {
        while head == items.count {
            if finished || Task.isCancelled { return nil }
            let waiter = self.waiter
            await withTaskCancellationHandler {
                await withCheckedContinuation(isolation: actor) { (continuation: CheckedContinuation<Void, Never>) in
                    waiter.park(continuation)
                }
            } onCancel: {
                waiter.wake()
            }
        }
        let value = items[head]
        head += 1
        if head > 64, head * 2 > items.count {
            items.removeFirst(head)
            head = 0
        }
        return value
    }
}

/// Holds at most one suspended reader. Safe from any thread.
final class WaiterBox: Sendable {
    private let state = Mutex<CheckedContinuation<Void, Never>?>(nil)

    /// Parks `continuation` until `wake()`; resumes it at once if the task was already
    /// cancelled (the cancellation handler may have run before the reader parked).
    func park(_ continuation: CheckedContinuation<Void, Never>) {
        let resumeNow = state.withLock { waiter -> Bool in
            if Task.isCancelled { return true }
            waiter = continuation
            return false
        }
        if resumeNow { continuation.resume() }
    }

    func wake() {
        let waiter = state.withLock { waiter -> CheckedContinuation<Void, Never>? in
            defer { waiter = nil }
            return waiter
        }
        waiter?.resume()
    }
}

/// An `AsyncSequence` of an observable's values, iterated on its host's context (see
/// `Observable.valuesOnHost()`). Not `Sendable`: the compiler keeps it where it was made.
public struct HostValueSequence<Element>: AsyncSequence {
    let buffer: HostValueBuffer<Element>
    weak let host: HostInstance?

    /// An iterator over the buffered and future values (all iterators share one buffer).
    public func makeAsyncIterator() -> Iterator { Iterator(buffer: buffer, host: host) }

    /// Iterates with `next(isolation:)`, which `for await` uses and which must run on the
    /// host's context.
    public struct Iterator: AsyncIteratorProtocol {
        let buffer: HostValueBuffer<Element>
        weak let host: HostInstance?

        /// Not supported: a nonisolated `next()` would leave the host's context. `for await`
        /// calls `next(isolation:)` instead.
        public mutating func next() async -> Element? {
            preconditionFailure("HostValueSequence must be iterated with for-await on its host's context")
        }

        /// The next value, suspending until one is emitted; nil once the host has shut down.
        public mutating func next(isolation actor: isolated (any Actor)?) async -> Element? {
            precondition(
                actor != nil && actor === host,
                "HostValueSequence must be iterated on the context of the HostInstance that made it")
            return await buffer.next(isolation: actor)
        }
    }
}
