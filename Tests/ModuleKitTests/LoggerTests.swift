import Foundation
import Glibc
import ModuleKit
import Testing

/// The default log backend, which an embedding service gets unless it installs another.
@Suite struct LoggerTests {
    /// What `body` writes on standard error (descriptor 2, redirected to a pipe meanwhile).
    func standardError(of body: () -> Void) -> String {
        let pipe = Pipe()
        let saved = dup(2)
        dup2(pipe.fileHandleForWriting.fileDescriptor, 2)
        body()
        dup2(saved, 2)
        close(saved)
        try? pipe.fileHandleForWriting.close()
        return String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    }

    /// One record is one line, whatever its text holds: a file named with a newline and a
    /// terminal escape sequence (a plugin set logs the names of the files it refuses) cannot
    /// start a line of its own or clear the operator's screen.
    @Test func theDefaultBackendWritesOneRecordOnOneLineWithControlCharactersEscaped() {
        let output = standardError {
            Logger(label: "set\u{1B}]0;x\u{07}").error("refused lib\nerror fake: line\u{1B}[2J\u{202E}.so", [("file\n", "a\nb"), ("why", "c d\re")])
        }
        #expect(output.filter { $0 == "\n" }.count == 1 && output.hasSuffix("\n"), "\(output.debugDescription)")
        #expect(!output.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 || $0.value == 0x0D || $0.value == 0x202E })
        #expect(output.contains(#"refused lib\nerror fake: line\u001b[2J\u202e.so"#), "\(output.debugDescription)")
        #expect(output.contains(#"file\n=a\nb"#) && output.contains(#"why="c d\re""#), "\(output.debugDescription)")
    }
}
