import DaemonKit
import Dispatch
import Synchronization

/// The one thread every worker is spawned from. PR_SET_PDEATHSIG fires when the *thread*
/// that started a process ends, and pool threads come and go: this one never ends.
enum SpawnThread {
    private final class Job: Sendable {
        let body: @Sendable () -> Void
        let done = DispatchSemaphore(value: 0)
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }

    private static let queue = Mutex<[Job]>([])
    private static let wake = DispatchSemaphore(value: 0)
    /// Whether the thread runs; it is started by the first `run`, or by a later one if
    /// that could not start it.
    private static let started = Mutex(false)

    /// Starts the spawn thread unless it runs.
    private static func start() throws(SystemError) {
        try started.withLock { (started: inout Bool) throws(SystemError) in
            guard !started else { return }
            try startThread(name: "worker.spawn") {
                while true {
                    wake.wait()
                    while let job = queue.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) {
                        job.body()
                        job.done.signal()
                    }
                }
            }
            started = true
        }
    }

    /// Runs `body` on the spawn thread and returns its result. Throws, without running
    /// `body`, if the spawn thread is not running and cannot be started.
    static func run<T: Sendable>(_ body: @escaping @Sendable () -> T) throws(SystemError) -> T {
        try start()
        let result = Mutex<T?>(nil)
        let job = Job { let value = body(); result.withLock { $0 = value } }
        queue.withLock { $0.append(job) }
        wake.signal()
        job.done.wait()
        return result.withLock { $0! }
    }
}
