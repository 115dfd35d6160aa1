import Synchronization
import Testing
@testable import ModuleHost

/// The worker that runs a C module's callbacks: what its callers may rely on once a job
/// they waited for has returned.
@Suite struct PluginWorkerTests {
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
            #expect(await worker.run("job \(round)", deadline: .seconds(30)) { round } == round)
            #expect(worker.busy == nil, "after job \(round)")
        }
    }

    /// What the jobs of one test saw, shared by every thread.
    final class Seen: Sendable {
        let submitted = Mutex<[Int]>([])
        let ran = Mutex<[Int]>([])
        let running = Atomic<Int>(0)
        let overlapped = Atomic<Bool>(false)
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
        _ = await worker.run("last", deadline: .seconds(30)) { 0 }
        let overlaps = seen.overlapped.load(ordering: .sequentiallyConsistent)
        #expect(!overlaps)
        #expect(seen.ran.withLock { $0 } == seen.submitted.withLock { $0 })
    }
}
