/// Renames DT_SONAME and DT_NEEDED strings of an ELF file in place, for private copies of
/// plugin images.
///
/// Why: glibc satisfies `NEEDED libA.so` with the first loaded object whose SONAME is
/// `libA.so`. After a hot replace both the old and the new version of A are mapped (a
/// Swift image is never unloaded), so a dependent reloaded against the new A must ask for a
/// name only the new A has. The new names have the same length as the old ones, so the
/// string table is patched where it is and nothing else in the file moves.
public enum DynamicStringPatch {
    /// New bytes for one place of the file.
    public struct Patch: Sendable, Equatable {
        /// Where in the file the bytes go.
        public var fileOffset: UInt64
        public var bytes: [UInt8]
    }

    /// Where and what to write in `image`'s file so that every DT_SONAME / DT_NEEDED string
    /// equal to a key of `renames` reads as its value. Only the dynamic string table
    /// changes, so a copy of the file can be streamed and then patched at these offsets.
    /// - Throws: when a new name's length differs, when another reference shares the
    ///   bytes of a string to patch (the linker merged it with a symbol name), or when the
    ///   file's dynamic entries or symbols point outside the string table.
    public static func patches(_ renames: [String: String], image: ELFImage) throws(ELFError) -> [Patch] {
        for (old, new) in renames where old.utf8.count != new.utf8.count {
            throw .malformed("cannot rename \(old) to \(new): the names differ in length")
        }
        guard let (entries, strings, link, names) = try image.dynamicEntries() else { return [] }

        // Every offset into the string table anything refers to, and the ones to patch.
        // dynamicEntries() checked each string offset lies inside the table.
        var patches: [(offset: Int, new: [UInt8])] = []
        var references: [Int] = []
        for (tag, value) in entries where ELFImage.stringTagName(tag) != nil {
            references.append(Int(value))
            let name = names.cString(at: value)
            if (tag == 1 || tag == 14), let new = renames[name] { patches.append((Int(value), Array(new.utf8))) }
        }
        if let symbols = image.section(named: ".dynsym"),
           symbols.link == link {
            let entries = FileBytes(try image.bytes(of: symbols))
            var symbol = 24
            while symbol + 24 <= entries.count {
                references.append(Int(entries.u32(symbol)))
                symbol += 24
            }
        }
        var result: [Patch] = []
        for patch in patches {
            let range = patch.offset..<patch.offset + patch.new.count
            if references.contains(where: { $0 != patch.offset && range.contains($0) }) {
                throw .malformed("the name at string offset \(patch.offset) shares bytes with another name")
            }
            // The old name (same length) was read inside the table, so this stays inside it.
            _ = try FileArithmetic.range("renamed string", offset: UInt64(patch.offset), size: UInt64(patch.new.count),
                                         within: UInt64(names.count))
            result.append(Patch(fileOffset: strings.offset + UInt64(patch.offset), bytes: patch.new))
        }
        return result
    }

    /// `bytes` (the contents of `image`'s file) with `patches(renames, image:)` applied.
    public static func apply(_ renames: [String: String], to bytes: [UInt8], image: ELFImage) throws(ELFError) -> [UInt8] {
        var output = bytes
        for patch in try patches(renames, image: image) {
            let range = try FileArithmetic.range("renamed string", offset: patch.fileOffset, size: UInt64(patch.bytes.count),
                                                 within: UInt64(bytes.count))
            output.replaceSubrange(FileArithmetic.indices(range), with: patch.bytes)
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
