// Fuzz target: what happens to a file dropped into a plugin directory before any of its
// code runs. The validator reads it from disk (ELF structure, manifest, ABI, linkage,
// toolchain), then everything the loader and `modhostctl inspect` read from an image is
// read too, valid or not, and the private copy's SONAME/NEEDED rename is applied.
// Promise under test: any bytes give a result or an error, never a trap.
import FuzzSupport
import ModuleHost
import ModuleKit
import PluginFormat

let scratch = ScratchFile(name: "libFuzzed.so")
// Ownership and mode of the scratch file are not what is fuzzed.
let validator = Validator(allowInsecure: true)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPluginFile(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = fuzzBytes(data, size)

    scratch.write(bytes)
    _ = try? validator.validate(scratch.path)

    guard let image = try? ELFImage(path: scratch.path, contents: bytes) else { return 0 }
    _ = image.isExecutable
    _ = image.loadSegmentPastEnd
    if let manifest = try? image.sectionContents(named: MODHOST_MANIFEST_SECTION) {
        _ = try? Manifest.parse(manifest)
    }
    _ = try? image.definedDynamicSymbols()
    _ = try? image.buildID()
    guard let dynamic = try? image.dynamicInfo() else { return 0 }

    var renames: [String: String] = [:]
    for name in dynamic.needed + [dynamic.soname].compactMap({ $0 }) {
        if let new = DynamicStringPatch.generationName(name, generation: 2), new.utf8.count == name.utf8.count {
            renames[name] = new
        }
    }
    if let patched = try? DynamicStringPatch.apply(renames, to: bytes, image: image) {
        fuzzCheck(patched.count == bytes.count, "patching renames changed the file size from \(bytes.count) to \(patched.count)")
        _ = try? ELFImage(path: scratch.path, contents: patched).dynamicInfo()
    }
    return 0
}
