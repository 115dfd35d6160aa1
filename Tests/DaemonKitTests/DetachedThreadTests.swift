import DaemonKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.timeLimit(.minutes(5)))
struct DetachedThreadTests {
    /// What a thread started by `startThread` saw of itself.
    struct Seen: Sendable, Equatable {
        var thread: pthread_t
        var name: String
    }

    /// Starts a thread named `name` and waits for what it reports.
    func start(_ name: String, stackSize: Int? = nil) async throws -> Seen {
        let seen = Collector<Seen>()
        try startThread(name: name, stackSize: stackSize) {
            let comm = (try? BoundedFile.read("/proc/thread-self/comm", limit: 64)) ?? []
            seen.append(Seen(thread: pthread_self(), name: String(decoding: comm, as: UTF8.self)))
        }
        #expect(await seen.waitFor { !$0.isEmpty })
        return try #require(seen.all.first)
    }

    @Test func theBodyRunsOnANewThreadOfItsOwnWithItsName() async throws {
        let first = try await start("dk-test")
        #expect(first.name == "dk-test\n")
        #expect(pthread_equal(first.thread, pthread_self()) == 0)
    }

    @Test func aLongNameIsCutToTheSystemsLimit() async throws {
        #expect(try await start("a-thread-name-longer-than-fifteen-bytes").name == "a-thread-name-l\n")
    }

    @Test func aStackSizeIsHonouredOrRefused() async throws {
        #expect(try await start("dk-small-stack", stackSize: 512 << 10).name == "dk-small-stack\n")
        let ran = Collector<Bool>()
        #expect(throws: SystemError("pthread_attr_setstacksize", code: EINVAL, subject: "dk-no-stack")) {
            try startThread(name: "dk-no-stack", stackSize: 1) { ran.append(true) }
        }
        try await Task.sleep(for: .milliseconds(50))
        #expect(ran.all.isEmpty)
    }
}
