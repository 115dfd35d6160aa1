// Fuzz target: what happens to a file dropped into a plugin directory before any of its
// code runs. The validator reads it from disk (ELF structure, manifest, ABI, linkage,
// toolchain); then everything the loader, the daemon's private copy and `modhostctl
// inspect` read from an image is read too, valid or not, and the SONAME/NEEDED renames
// of a private copy are computed and applied.
// Promise under test: any bytes give a result or an error, never a trap, and a rename
// only ever rewrites bytes inside the file.
import FuzzSupport
import ModuleHost
import PluginFormat

let scratch = ScratchFile(name: "libFuzzed.so")
// Ownership and mode of the scratch file are not what is fuzzed.
let validator = Validator(allowInsecure: true)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPluginFile(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = fuzzBytes(data, size)

    scratch.write(bytes)
    _ = try? validator.validate(scratch.path)

    guard case .success(let file) = ReadOnlyFile.open(scratch.path, followSymlinks: false),
          let image = try? ELFImage(file: file) else { return 0 }
    _ = image.isExecutable
    _ = image.loadSegmentPastEnd
    if let manifest = try? image.manifestContents() {
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
    if let patches = try? DynamicStringPatch.patches(renames, image: image) {
        for patch in patches {
            let (end, overflow) = patch.fileOffset.addingReportingOverflow(UInt64(patch.bytes.count))
            fuzzCheck(!overflow && end <= UInt64(bytes.count), "a rename patch at \(patch.fileOffset) runs past the file's \(bytes.count) bytes")
        }
    }
    if let patched = try? DynamicStringPatch.apply(renames, to: bytes, image: image) {
        fuzzCheck(patched.count == bytes.count, "renaming changed the file size from \(bytes.count) to \(patched.count)")
        _ = try? ELFImage(path: scratch.path, contents: patched).dynamicInfo()
    }
    return 0
}
