import Foundation
import Glibc

/// The bytes of a real ELF file, to be garbled on purpose: hostile headers, offsets and
/// sizes near 2^64, huge notes. It reads the layout with its own plain code (not the
/// host's reader under test) and trusts the file it starts from.
public struct CraftedELF: Sendable {
    public var bytes: [UInt8]

    public init(contentsOf path: String) throws {
        bytes = Array(try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    // ELF64 header fields.
    public static let programHeaderOffsetField = 32
    public static let sectionHeaderOffsetField = 40
    public static let sectionNameIndexField = 62

    public func u16(_ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
    public func u32(_ at: Int) -> UInt32 { UInt32(u16(at)) | UInt32(u16(at + 2)) << 16 }
    public func u64(_ at: Int) -> UInt64 { UInt64(u32(at)) | UInt64(u32(at + 4)) << 32 }

    public mutating func set32(_ value: UInt32, at offset: Int) {
        for index in 0..<4 { bytes[offset + index] = UInt8(truncatingIfNeeded: value >> (8 * UInt32(index))) }
    }

    public mutating func set64(_ value: UInt64, at offset: Int) {
        for index in 0..<8 { bytes[offset + index] = UInt8(truncatingIfNeeded: value >> (8 * UInt64(index))) }
    }

    /// The file offset of the first program header of `type`, nil when there is none.
    public func programHeader(ofType type: UInt32) -> Int? {
        let table = Int(u64(Self.programHeaderOffsetField)), count = Int(u16(56))
        return (0..<count).map { table + $0 * 56 }.first { u32($0) == type }
    }

    /// The file offset of section header `index`.
    public func sectionHeader(_ index: Int) -> Int { Int(u64(Self.sectionHeaderOffsetField)) + index * Int(u16(58)) }

    /// The file offset of the header of the section called `name`.
    public func sectionHeader(named name: String) -> Int? {
        let names = sectionHeader(Int(u16(Self.sectionNameIndexField)))
        let namesOffset = Int(u64(names + 24))
        for index in 0..<Int(u16(60)) {
            let header = sectionHeader(index)
            var cursor = namesOffset + Int(u32(header))
            var text: [UInt8] = []
            while bytes[cursor] != 0 { text.append(bytes[cursor]); cursor += 1 }
            if String(decoding: text, as: UTF8.self) == name { return header }
        }
        return nil
    }

    /// The file offset of the contents of the section called `name`.
    public func sectionContents(named name: String) -> Int? {
        sectionHeader(named: name).map { Int(u64($0 + 24)) }
    }

    /// The file offset of the value of the first dynamic entry tagged `tag`
    /// (0 DT_NULL, 1 DT_NEEDED, 14 DT_SONAME).
    public func dynamicEntryValue(tag: UInt64) -> Int? {
        guard let header = sectionHeader(named: ".dynamic") else { return nil }
        let start = Int(u64(header + 24)), size = Int(u64(header + 32))
        for entry in stride(from: start, to: start + size, by: 16) where u64(entry) == tag { return entry + 8 }
        return nil
    }

    /// Writes the bytes to `path` (mode 0644); returns the path.
    @discardableResult
    public func write(to path: String) throws -> String {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        chmod(path, 0o644)
        return path
    }
}

extension CraftedELF {
    /// Writes a copy of `source` whose manifest section is `size` bytes of (sparse) zeros
    /// appended to the file; returns the path.
    @discardableResult
    public static func withHugeManifest(_ source: String, size: UInt64, writingTo path: String) throws -> String {
        var elf = try CraftedELF(contentsOf: source)
        let end = UInt64(elf.bytes.count)
        let header = elf.sectionHeader(named: ".modhost.manifest")!
        elf.set64(end, at: header + 24)
        elf.set64(size, at: header + 32)
        try elf.write(to: path)
        try extendSparse(path, to: Int64(end + size))
        return path
    }
}

/// Makes `path` `size` bytes long without writing them (a sparse file: the new bytes read as
/// zeros and take no disk space).
public func extendSparse(_ path: String, to size: Int64) throws {
    let fd = open(path, O_WRONLY | O_CLOEXEC)
    guard fd >= 0 else { throw ShellError(command: "open \(path)", status: errno, output: String(cString: strerror(errno))) }
    defer { close(fd) }
    guard ftruncate(fd, off_t(size)) == 0 else {
        throw ShellError(command: "ftruncate \(path)", status: errno, output: String(cString: strerror(errno)))
    }
}

/// One way of garbling a plugin file: a header field, an offset or a size set to a hostile
/// value. `refused` tells whether plugin validation must refuse the result (the build id is
/// not read by validation, so a garbled one is harmless there).
public struct ELFMutation: Sendable, CustomStringConvertible {
    public let description: String
    public let refused: Bool
    let change: @Sendable (inout CraftedELF) -> Void

    public init(_ description: String, refused: Bool = true, _ change: @escaping @Sendable (inout CraftedELF) -> Void) {
        self.description = description
        self.refused = refused
        self.change = change
    }

    /// A file name made from the description.
    public var fileName: String {
        "lib" + String(description.map { $0.isLetter || $0.isNumber ? $0 : "_" }) + ".so"
    }

    /// A copy of the file at `source` with the mutation applied, written to `path`.
    @discardableResult
    public func apply(to source: String, writingTo path: String) throws -> String {
        var elf = try CraftedELF(contentsOf: source)
        change(&elf)
        return try elf.write(to: path)
    }

    /// Sets the 64-bit field `field` of the header of section `section` (24 sh_offset, 32 sh_size).
    static func section(_ section: String, field: Int, _ value: UInt64) -> @Sendable (inout CraftedELF) -> Void {
        { elf in elf.set64(value, at: elf.sectionHeader(named: section)! + field) }
    }

    /// Every hostile file the host must refuse (or accept) without trapping.
    public static let all: [ELFMutation] = [
        ELFMutation("e_phoff 0xFFFF_FFFF_FFFF_FFF0") { $0.set64(0xFFFF_FFFF_FFFF_FFF0, at: CraftedELF.programHeaderOffsetField) },
        ELFMutation("e_phoff 2^64-9 (offset plus size overflows)") { $0.set64(UInt64.max - 8, at: CraftedELF.programHeaderOffsetField) },
        ELFMutation("e_phentsize 0xFFFF") { elf in elf.bytes[54] = 0xFF; elf.bytes[55] = 0xFF },
        ELFMutation("e_shoff 2^64-1") { $0.set64(UInt64.max, at: CraftedELF.sectionHeaderOffsetField) },
        ELFMutation("section name table sh_offset near 2^64") { elf in
            elf.set64(0xFFFF_FFFF_FFFF_FF00, at: elf.sectionHeader(Int(elf.u16(CraftedELF.sectionNameIndexField))) + 24)
        },
        ELFMutation("section name table sh_size 2^64-17") { elf in
            elf.set64(UInt64.max - 16, at: elf.sectionHeader(Int(elf.u16(CraftedELF.sectionNameIndexField))) + 32)
        },
        ELFMutation("manifest sh_offset 2^64-4", section(".modhost.manifest", field: 24, UInt64.max - 3)),
        ELFMutation("manifest sh_size 2^64-1", section(".modhost.manifest", field: 32, UInt64.max)),
        ELFMutation(".dynamic sh_size 2^64-1", section(".dynamic", field: 32, UInt64.max)),
        ELFMutation(".dynamic sh_link 0xFFFF_FFFF") { elf in elf.set32(0xFFFF_FFFF, at: elf.sectionHeader(named: ".dynamic")! + 40) },
        ELFMutation(".dynstr sh_offset 2^64-2", section(".dynstr", field: 24, UInt64.max - 1)),
        ELFMutation("DT_SONAME string offset 2^64-1") { elf in elf.set64(UInt64.max, at: elf.dynamicEntryValue(tag: 14)!) },
        ELFMutation("DT_NEEDED string offset 2^63") { elf in elf.set64(1 << 63, at: elf.dynamicEntryValue(tag: 1)!) },
        ELFMutation(".dynsym st_name 0xFFFF_FFFF") { elf in elf.set32(0xFFFF_FFFF, at: elf.sectionContents(named: ".dynsym")! + 24) },
        // What dlopen follows without a check of its own: the program headers and the
        // dynamic segment. Each crashed a daemon that found the file at start.
        ELFMutation("PT_DYNAMIC p_vaddr 2^64-1") { elf in elf.set64(UInt64.max, at: elf.programHeader(ofType: 2)! + 16) },
        ELFMutation("PT_GNU_RELRO p_memsz 2^63") { elf in elf.set64(1 << 63, at: elf.programHeader(ofType: 0x6474_e552)! + 40) },
        ELFMutation("DT_STRTAB outside the image") { elf in elf.set64(0x7fff_ffff_0000, at: elf.dynamicEntryValue(tag: 5)!) },
        ELFMutation("DT_SYMTAB outside the image") { elf in elf.set64(0x7fff_ffff_0000, at: elf.dynamicEntryValue(tag: 6)!) },
        // ld.so takes the last entry of a tag, so a later duplicate counts as much as the first.
        ELFMutation("a second DT_SYMTAB, outside the image, after the first") { elf in
            let spare = elf.dynamicEntryValue(tag: 0)! - 8  // the first DT_NULL; the linker leaves spare ones after it
            // Another must follow, or the file would be refused for having no DT_NULL instead.
            precondition(elf.u64(spare + 16) == 0, "the linker left no second DT_NULL in .dynamic")
            elf.set64(6, at: spare)
            elf.set64(0x7fff_ffff_0000, at: spare + 8)
        },
        ELFMutation("PT_DYNAMIC p_filesz 16 (no DT_NULL within it)") { elf in elf.set64(16, at: elf.programHeader(ofType: 2)! + 32) },
        ELFMutation("build-id note name and descriptor sizes 0xFFFF_FFFx", refused: false) { elf in
            let note = elf.sectionContents(named: ".note.gnu.build-id")!
            elf.set32(0xFFFF_FFFF, at: note)
            elf.set32(0xFFFF_FFF0, at: note + 4)
        },
    ]
}
