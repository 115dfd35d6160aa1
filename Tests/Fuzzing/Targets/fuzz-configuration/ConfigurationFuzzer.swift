// Fuzz target: the daemon's configuration file parser (DaemonConfiguration.load), which
// reads a path, so each input is written to a file first.
// Promise under test (docs/daemon.md): any file gives a configuration or one error naming
// the file and the field, never a trap.
import FuzzSupport
import DaemonShell

let scratch = ScratchFile(name: "modhostd.json")

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzConfiguration(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    scratch.write(fuzzBytes(data, size))
    do {
        _ = try DaemonConfiguration.load(scratch.path)
    } catch {
        fuzzCheck(error.message.hasPrefix(scratch.path), "the error does not name the file: \(error.message)")
    }
    return 0
}
