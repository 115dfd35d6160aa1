import Dispatch
import ModuleKit
import Synchronization
import Testing
@testable import ModuleHost

/// The worker that runs a C module's callbacks: what its callers may rely on once a job
/// they waited for has returned.
@Suite(.timeLimit(.minutes(5))) struct PluginWorkerTests {
    /// A caller woken by a finished job finds the worker idle: the next event is not
    /// refused, nor shutdown told the module is still busy, because of the job just done.
    @Test func aJobWaitedForIsNoLongerRunningWhenItsCallerWakes() {
        let worker = PluginWorker(label: "sync")
        for round in 0..<300 {
            #expect(worker.run("job \(round)", deadline: .seconds(30)) { round } == round)
            #expect(worker.busy == nil, "after job \(round)")
        }
    }

    @Test func aJobAwaitedIsNoLongerRunningWhenItsCallerResumes() async {
        let worker = PluginWorker(label: "async")
        for round in 0..<300 {
            guard case .returned(let value) = await worker.attempt("job \(round)", deadline: .seconds(30), { round }) else {
                Issue.record("job \(round) did not return")
                return
            }
            #expect(value == round)
            #expect(worker.busy == nil, "after job \(round)")
        }
    }

    /// What the jobs of one test saw, shared by every thread.
    final class Seen: Sendable {
        let submitted = Mutex<[Int]>([])
        let ran = Mutex<[Int]>([])
        let running = Atomic<Int>(0)
        let overlapped = Atomic<Bool>(false)
        /// Callers that are done, for a lane that runs until they are.
        let callersDone = Atomic<Int>(0)
    }

    /// A lane's calls (`claim`, `release`) and the queue's jobs, from synchronous and
    /// asynchronous callers at once, never run at the same time, and every queued job runs.
    @Test func aLaneAndTheQueueNeverRunAJobAtOnce() async {
        let worker = PluginWorker(label: "lane")
        let seen = Seen()
        // A lane of its own thread, as the relay's are, claiming until the other callers are done.
        let lane = Task.detached {
            await withCheckedContinuation { (done: CheckedContinuation<Int, Never>) in
                DispatchQueue.global().async {
                    var token: UInt64 = 0
                    while seen.callersDone.load(ordering: .acquiring) < 2 || token < 20_000 {
                        token += 1
                        switch worker.claim(token: token, isCurrent: { true }) {
                        case .claimed:
                            Self.runAlone(seen, "lane")
                            worker.release()
                        case .stuck, .busy, .superseded:
                            Issue.record("claim \(token) was refused")
                        }
                    }
                    done.resume(returning: Int(token))
                }
            }
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for _ in 0..<1000 { _ = worker.run("sync", deadline: .seconds(30)) { Self.runAlone(seen, "sync") } }
                seen.callersDone.add(1, ordering: .releasing)
            }
            group.addTask {
                for _ in 0..<1000 { _ = await worker.attempt("async", deadline: .seconds(30)) { Self.runAlone(seen, "async") } }
                seen.callersDone.add(1, ordering: .releasing)
            }
        }
        let claims = await lane.value
        let overlapped = seen.overlapped.load(ordering: .sequentiallyConsistent)
        let ran = seen.ran.withLock { ran in Dictionary(grouping: ran) { $0 }.mapValues(\.count) }
        #expect(!overlapped)
        #expect(ran == [0: claims, 1: 1000, 2: 1000])
        #expect(worker.busy == nil)
    }

    /// Notes a job of `kind` ("lane", "sync", "async") in `seen.ran` as 0, 1 or 2, and
    /// whether another ran meanwhile.
    @Sendable static func runAlone(_ seen: Seen, _ kind: String) {
        if seen.running.add(1, ordering: .sequentiallyConsistent).newValue > 1 {
            seen.overlapped.store(true, ordering: .sequentiallyConsistent)
        }
        for _ in 0..<50 { _ = seen.running.load(ordering: .relaxed) }
        seen.ran.withLock { $0.append(["lane", "sync", "async"].firstIndex(of: kind) ?? -1) }
        seen.running.subtract(1, ordering: .sequentiallyConsistent)
    }

    /// Every lane waiting for the worker's queue goes on once the queue is idle, however
    /// many wait (two batches' lanes may reach one module while its queue runs a job): each
    /// makes its call, or finds the other's call running (`busy`) and makes none; never
    /// two calls at once.
    @Test func everyLaneWaitingForTheQueueGoesOnOnceItIsIdle() async {
        let worker = PluginWorker(label: "lanes-wait")
        let release = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let seen = Seen()
        let busy = Atomic<Int>(0)
        worker.submit("slow", deadline: .seconds(30)) { release.wait() }
        for token in [UInt64(1), 2] {
            DispatchQueue.global().async {
                switch worker.claim(token: token, isCurrent: { true }) {
                case .claimed:
                    Self.runAlone(seen, "lane")
                    worker.release()
                case .busy:
                    busy.add(1, ordering: .sequentiallyConsistent)
                case .stuck, .superseded:
                    break
                }
                done.signal()
            }
        }
        // Both lanes find the queue busy and wait (a lane that comes later finds it idle).
        try? await Task.sleep(for: .milliseconds(200))
        release.signal()
        let first = done.wait(timeout: .now() + 10) == .success
        let second = done.wait(timeout: .now() + 10) == .success
        let overlapped = seen.overlapped.load(ordering: .sequentiallyConsistent)
        #expect(first && second, "a lane never went on")
        #expect(!overlapped)
        let ran = seen.ran.withLock { $0 }
        #expect(ran.allSatisfy { $0 == 0 } && !ran.isEmpty && ran.count + busy.load(ordering: .sequentiallyConsistent) == 2,
                "calls made: \(ran.count), busy: \(busy.load(ordering: .sequentiallyConsistent))")
    }

    /// A lane's call its caller gave up on makes the worker stuck until it returns; a job
    /// queued meanwhile runs after it.
    @Test func aLaneCallGivenUpOnIsStuckUntilItReturns() async {
        let worker = PluginWorker(label: "lane-stuck")
        let release = DispatchSemaphore(value: 0)
        let claimed = DispatchSemaphore(value: 0)
        let order = Mutex<[String]>([])
        DispatchQueue.global().async {
            guard case .claimed = worker.claim(token: 7, isCurrent: { true }) else { return }
            claimed.signal()
            release.wait()
            order.withLock { $0.append("lane") }
            worker.release()
        }
        claimed.wait()
        #expect(worker.stuck == nil)
        #expect(!worker.abandon(lane: 8, what: "tick", since: .now))
        #expect(worker.abandon(lane: 7, what: "tick", since: .now))
        #expect(worker.stuck?.what == "tick")
        if case .stuck(let stuck) = worker.claim(token: 9, isCurrent: { true }) {
            #expect(stuck.what == "tick")
        } else {
            Issue.record("a second claim was not refused as stuck")
        }
        worker.submit("deinit", deadline: .seconds(30)) { order.withLock { $0.append("deinit") } }
        release.signal()
        _ = await worker.attempt("last", deadline: .seconds(30)) { 0 }
        #expect(order.withLock { $0 } == ["lane", "deinit"])
        #expect(worker.stuck == nil)
    }

    /// Jobs run one at a time, in submission order, whichever threads submit them.
    @Test func jobsFromManyThreadsRunOneAtATimeInSubmissionOrder() async {
        let worker = PluginWorker(label: "order")
        let seen = Seen()
        await withTaskGroup(of: Void.self) { group in
            for thread in 0..<4 {
                group.addTask {
                    for index in 0..<100 {
                        let job = thread * 1000 + index
                        // Listed in the order they reach the worker.
                        seen.submitted.withLock { order in
                            order.append(job)
                            worker.submit("job", deadline: .seconds(30)) {
                                if seen.running.add(1, ordering: .sequentiallyConsistent).newValue > 1 {
                                    seen.overlapped.store(true, ordering: .sequentiallyConsistent)
                                }
                                seen.ran.withLock { $0.append(job) }
                                seen.running.subtract(1, ordering: .sequentiallyConsistent)
                            }
                        }
                    }
                }
            }
        }
        _ = await worker.attempt("last", deadline: .seconds(30)) { 0 }
        let overlaps = seen.overlapped.load(ordering: .sequentiallyConsistent)
        #expect(!overlaps)
        #expect(seen.ran.withLock { $0 } == seen.submitted.withLock { $0 })
    }

    /// A job the caller gave up on keeps its thread (a C call cannot be interrupted), but
    /// not the other workers': their calls still run, and the stuck one is shown as stuck.
    @Test(.timeLimit(.minutes(1)))
    func aJobThatNeverReturnsHoldsUpNoOtherWorker() async {
        let hung = PluginWorker(label: "hung"), other = PluginWorker(label: "other")
        let gate = DispatchSemaphore(value: 0)
        #expect(waited(hung, "hang", .milliseconds(100)) { gate.wait() } == nil)
        #expect(hung.stuck?.what == "hang")
        for round in 0..<50 {
            #expect(waited(other, "quick \(round)", .seconds(30)) { round } == round)
        }
        gate.signal()
        await until { hung.busy == nil }
    }

    /// A job a caller waits for runs after the jobs queued on its worker before it, never
    /// beside them; one given up on while it waits there makes the worker stuck at once (its
    /// thread may never come), and is stuck once it starts.
    @Test(.timeLimit(.minutes(1)))
    func aWaitedJobRunsAfterTheJobsQueuedBeforeItAndIsStuckOnceGivenUp() async {
        let worker = PluginWorker(label: "queued")
        let seen = Seen()
        let first = DispatchSemaphore(value: 0), second = DispatchSemaphore(value: 0)
        worker.submit("first", deadline: .seconds(30)) {
            first.wait()
            seen.ran.withLock { $0.append(1) }
        }
        // Given up on while "first" still holds the queue.
        #expect(waited(worker, "second", .milliseconds(100)) { () -> Int in
            seen.ran.withLock { $0.append(2) }
            second.wait()
            return 2
        } == nil)
        #expect(worker.stuck?.what == "second")
        first.signal()
        await until { worker.busy?.what == "second" }
        #expect(worker.stuck?.what == "second")
        second.signal()
        await until { worker.busy == nil }
        #expect(waited(worker, "third", .seconds(30)) { () -> Int in
            seen.ran.withLock { $0.append(3) }
            return 3
        } == 3)
        #expect(seen.ran.withLock { $0 } == [1, 2, 3])
    }

    /// `PluginWorker.run` as a synchronous caller (the host's actor) makes it: blocking.
    private func waited<T: Sendable>(_ worker: PluginWorker, _ what: String, _ deadline: Duration,
                                     _ job: @escaping @Sendable () -> T) -> T? {
        worker.run(what, deadline: deadline, job)
    }

    /// An event an isolated module did not answer stays known however many events of
    /// another name fail after it (a notification the module floods itself with), while a
    /// send waits for its answer.
    @Test func anUnansweredEventIsNotHiddenByAFloodOfAnother() {
        let workers = PluginWorkers()
        let since = ContinuousClock.now
        workers.recordUnanswered(module: "evil", event: "crash", why: .workerEnded)
        for _ in 0..<1000 { workers.recordUnanswered(module: "evil", event: "ping", why: .workerDown) }
        #expect(workers.leftUnanswered(module: "evil", event: "crash", since: since) == .workerEnded)
        #expect(workers.leftUnanswered(module: "evil", event: "ping", since: since) == .workerDown)
        #expect(workers.leftUnanswered(module: "other", event: "crash", since: since) == nil)
        // Only the latest names are kept, per module.
        for index in 0...PluginWorkers.unansweredNames { workers.recordUnanswered(module: "evil", event: "e\(index)", why: .workerDown) }
        #expect(workers.leftUnanswered(module: "evil", event: "crash", since: since) == nil)
        #expect(workers.leftUnanswered(module: "evil", event: "e\(PluginWorkers.unansweredNames)", since: since) == .workerDown)
    }

    /// Waits, without a fixed sleep, until `condition` holds.
    private func until(_ condition: () -> Bool) async {
        while !condition() { try? await Task.sleep(for: .milliseconds(1)) }
    }
}

/// How a worker's limits are named in messages about a worker that stalled.
@Suite(.timeLimit(.minutes(5))) struct WorkerLimitsTests {
    @Test func theSummaryNamesTheLimitsSetAsTheConfigurationDoes() {
        #expect(WorkerLimits().summary == nil)
        #expect(WorkerLimits(addressSpaceBytes: 150_000_000, openFiles: 16).summary == "addressSpaceBytes 150000000, openFiles 16")
        #expect(WorkerLimits(cpuSeconds: 2, processes: 64).summary == "cpuSeconds 2, processes 64")
    }

    /// What waits of one isolated plugin's notifications is bounded in bytes, not only in
    /// count: 256 posts of 1 MiB (a worker's largest frame) would hold 256 MiB.
    @Test(.timeLimit(.minutes(1)))
    func theNotificationsWaitingForOnePluginAreBoundedInBytes() async {
        let host = HostInstance(name: "flood")
        let queue = NotificationQueue(host: host, plugin: "Flooder", logger: Logger(label: "test"))
        // The host's context is held, so nothing is delivered meanwhile.
        let held = Atomic<Bool>(false)
        let gate = DispatchSemaphore(value: 0)
        let holder = Task { await host.perform { _ in held.store(true, ordering: .releasing); gate.wait() } }
        while !held.load(ordering: .acquiring) { await Task.yield() }
        let payload = JSONValue.string(String(repeating: "b", count: (1 << 20) - 2))
        for _ in 0..<64 { queue.post("big", payload: payload, to: nil) }
        // 16 fit, and at most one batch (16) left the queue before the host was held.
        #expect(queue.dropped.total >= 64 - 32, "\(queue.dropped.total) dropped")
        gate.signal()
        await holder.value
    }
}
