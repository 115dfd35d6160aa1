import Foundation
import Glibc
import ModuleKit
import Testing

/// What `body` writes on standard error (descriptor 2, redirected to a file meanwhile: the
/// default log backend writes there). The tests run one at a time (`make test`).
func capturingStandardError(_ body: () async -> Void) async -> String {
    var template = Array("/tmp/modhost-stderr-XXXXXX".utf8CString)
    let file = mkstemp(&template)
    precondition(file >= 0, "cannot create a scratch file")
    unlink(template)
    let saved = dup(2)
    dup2(file, 2)
    await body()
    dup2(saved, 2)
    close(saved)
    let size = Int(lseek(file, 0, SEEK_END))
    var bytes = [UInt8](repeating: 0, count: max(size, 0))
    let read = pread(file, &bytes, bytes.count, 0)
    close(file)
    return String(decoding: bytes.prefix(max(read, 0)), as: UTF8.self)
}

/// The default log backend, which an embedding service gets unless it installs another.
@Suite(.timeLimit(.minutes(5))) struct LoggerTests {

    /// One record is one line, whatever its text holds: a file named with a newline and a
    /// terminal escape sequence (a plugin set logs the names of the files it refuses) cannot
    /// start a line of its own or clear the operator's screen.
    @Test func theDefaultBackendWritesOneRecordOnOneLineWithControlCharactersEscaped() async {
        let output = await capturingStandardError {
            Logger(label: "set\u{1B}]0;x\u{07}").error("refused lib\nerror fake: line\u{1B}[2J\u{202E}.so", [("file\n", "a\nb"), ("why", "c d\re")])
        }
        #expect(output.filter { $0 == "\n" }.count == 1 && output.hasSuffix("\n"), "\(output.debugDescription)")
        #expect(!output.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 || $0.value == 0x0D || $0.value == 0x202E })
        #expect(output.contains(#"refused lib\nerror fake: line\u001b[2J\u202e.so"#), "\(output.debugDescription)")
        #expect(output.contains(#"file\n=a\nb"#) && output.contains(#"why="c d\re""#), "\(output.debugDescription)")
    }
}
