import DaemonKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.timeLimit(.minutes(5)))
struct SystemErrorTests {
    @Test func failingCallThrowsItsNameErrnoAndText() {
        do {
            try valueOrErrno("open", subject: "/nonexistent/x") { open("/nonexistent/x", O_RDONLY) }
            Issue.record("open should fail")
        } catch {
            #expect(error.syscall == "open")
            #expect(error.code == ENOENT)
            #expect(error.subject == "/nonexistent/x")
            #expect(error.message == "No such file or directory")
            #expect(error.description == "open(/nonexistent/x): No such file or directory (errno 2)")
        }
    }

    @Test func successReturnsTheValue() throws {
        let fd = try valueOrErrno("open") { open("/dev/null", O_RDONLY | O_CLOEXEC) }
        #expect(fd >= 0)
        close(fd)
    }

    @Test func interruptedCallIsRetriedOnlyWhenAsked() {
        var attempts = 0
        let result = try? valueOrErrno("fake") { () -> Int32 in
            attempts += 1
            if attempts < 3 {
                errno = EINTR
                return -1
            }
            return 7
        }
        #expect(result == 7)
        #expect(attempts == 3)

        attempts = 0
        #expect(throws: SystemError("fake", code: EINTR)) {
            try valueOrErrno("fake", retryOnInterrupt: false) { () -> Int32 in
                attempts += 1
                errno = EINTR
                return -1
            }
        }
        #expect(attempts == 1)
    }

    @Test func describesUnknownCodes() {
        #expect(SystemError.describe(EACCES) == "Permission denied")
        #expect(SystemError("x", code: EAGAIN).wouldBlock)
        #expect(!SystemError("x", code: EACCES).isInterrupted)
    }
}
