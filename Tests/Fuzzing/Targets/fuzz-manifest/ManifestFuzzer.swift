// Fuzz target: the manifest parser (the JSON embedded in a plugin's modhost_manifest
// section) and the strict JSON parser under it.
// Promise under test: any bytes give a manifest or an error, never a trap; a manifest
// that parses writes out as JSON that parses back to the same manifest, without the
// unknown fields it listed (which are not written).
import FuzzSupport
import ModuleKit
import PluginFormat

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzManifest(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = fuzzBytes(data, size)
    _ = try? JSONValue.parse(bytes)
    guard let manifest = try? Manifest.parse(bytes) else { return 0 }
    let text = manifest.jsonText()
    do {
        let again = try Manifest.parse(Array(text.utf8))
        var known = manifest
        known.unknownFields = []
        fuzzCheck(again == known, "manifest changed when written and read back: \(text)")
    } catch {
        fuzzCheck(false, "a parsed manifest writes JSON that does not parse back (\(error)): \(text)")
    }
    return 0
}
