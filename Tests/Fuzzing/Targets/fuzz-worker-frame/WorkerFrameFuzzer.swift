// Fuzz target: the body of a frame on a worker socket, as the daemon reads what an isolated
// plugin's worker (and so the plugin's own code) writes there: strict JSON
// (docs/isolation.md, "The worker protocol").
// Promises under test: any bytes are read as one JSON object or refused, never a trap; and
// the message read, written back as a frame, reads as the same message.
import FuzzSupport
import ModuleHost
import ModuleKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWorkerFrame(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let body = fuzzBytes(data, size)
    guard !body.isEmpty, let message = WorkerFrameReading.message(body) else { return 0 }
    guard case .object = message else {
        fuzzCheck(false, "a frame read as \(message.jsonText.prefix(200)), not an object")
        return 0
    }
    guard let again = WorkerFrameReading.jsonBody(message) else { return 0 }  // larger as JSON than a frame may be
    fuzzCheck(WorkerFrameReading.message(again) == message,
              "the message of a frame, written back as JSON, reads otherwise: \(message.jsonText.prefix(200))")
    return 0
}
