/// Renames DT_SONAME and DT_NEEDED strings of an ELF file in place, for private copies of
/// plugin images.
///
/// Why: glibc satisfies `NEEDED libA.so` with the first loaded object whose SONAME is
/// `libA.so`. After a hot replace both the old and the new version of A are mapped (a
/// Swift image is never unloaded), so a dependent reloaded against the new A must ask for a
/// name only the new A has. The new names have the same length as the old ones, so the
/// string table is patched where it is and nothing else in the file moves.
public enum DynamicStringPatch {
    /// `bytes` (the contents of `image`'s file) with every DT_SONAME / DT_NEEDED string
    /// equal to a key of `renames` replaced by its value.
    /// - Throws: when a new name's length differs, or when another reference shares the
    ///   bytes of a string to patch (the linker merged it with a symbol name).
    public static func apply(_ renames: [String: String], to bytes: [UInt8], image: ELFImage) throws(ELFError) -> [UInt8] {
        for (old, new) in renames where old.utf8.count != new.utf8.count {
            throw .malformed("cannot rename \(old) to \(new): the names differ in length")
        }
        guard let dynamic = image.sections.first(where: { $0.name == ".dynamic" }),
              Int(dynamic.link) < image.sections.count else { return bytes }
        let strings = image.sections[Int(dynamic.link)]
        let table = try image.contents(of: dynamic)
        let stringBytes = try image.contents(of: strings)
        let reader = FileBytes(buffer: table)
        let names = FileBytes(buffer: stringBytes)

        // Every offset into the string table anything refers to, and the ones to patch.
        var patches: [(offset: Int, new: [UInt8])] = []
        var references: [Int] = []
        var base = 0
        while base + 16 <= table.count {
            let tag = reader.u64(base), value = Int(reader.u64(base + 8))
            if tag == 0 { break }
            if tag == 1 || tag == 14 || tag == 15 || tag == 29 {  // NEEDED, SONAME, RPATH, RUNPATH
                references.append(value)
                let name = names.cString(at: UInt64(value), limit: UInt64(stringBytes.count))
                if (tag == 1 || tag == 14), let new = renames[name] { patches.append((value, Array(new.utf8))) }
            }
            base += 16
        }
        if let symbols = image.sections.first(where: { $0.name == ".dynsym" }), symbols.link == dynamic.link {
            let entries = FileBytes(buffer: try image.contents(of: symbols))
            var symbol = 24
            while symbol + 24 <= entries.count {
                references.append(Int(entries.u32(symbol)))
                symbol += 24
            }
        }
        var output = bytes
        for patch in patches {
            let range = patch.offset..<patch.offset + patch.new.count
            if references.contains(where: { $0 != patch.offset && range.contains($0) }) {
                throw .malformed("the name at string offset \(patch.offset) shares bytes with another name")
            }
            let fileOffset = Int(strings.offset) + patch.offset
            output.replaceSubrange(fileOffset..<fileOffset + patch.new.count, with: patch.new)
        }
        return output
    }

    /// The most generations of one library a process can tell apart by name.
    public static let maximumGeneration = 36 * 36 - 1

    /// The name generation `generation` of a library uses instead of `soname`: the same
    /// length, its last three characters replaced by "." and the generation in two base-36
    /// digits (`libGreeting.so` → `libGreeting.02`). Generation 1 keeps the original name;
    /// nil past `maximumGeneration` (restart the daemon to start again from 1).
    public static func generationName(_ soname: String, generation: Int) -> String? {
        guard generation > 1 else { return soname }
        guard generation <= maximumGeneration, soname.count >= 4 else { return nil }
        let tag = String(generation, radix: 36)
        return String(soname.dropLast(3)) + "." + (tag.count < 2 ? "0" : "") + tag
    }
}
