#if canImport(Glibc)
import Glibc
#endif

/// The parts of an ELF file the host checks before it lets `dlopen` near the file:
/// identification, program headers, section headers and the dynamic section.
///
/// Reading never maps the file and never runs code. It reads only the ranges asked for
/// (headers, tables, sections), never the whole file, and every offset, size and count
/// taken from the file is checked before any arithmetic on it: a truncated, garbled or
/// hostile file gives an `ELFError`, never a crash, and files larger than
/// `PluginLimits.maximumFileSize` are refused before anything is read.
public struct ELFImage: Sendable {
    public let path: String
    public let fileSize: UInt64
    public let fileType: UInt16
    public let machine: UInt16
    /// The raw program header table (56 bytes an entry), checked to lie within the file.
    /// Entries are decoded when asked for: the checks read two fields of each, and an array
    /// of `ProgramHeader` costs an allocation per file and its type made at run time.
    private let programHeaderTable: FileBytes
    /// Why the section headers could not be read (there are then none), nil when they were.
    public let sectionError: ELFError?
    private let source: ByteSource
    /// The raw section header table (64 bytes an entry) and the section name table, both
    /// checked to lie within the file; empty when `sectionError` is set. Sections are
    /// decoded when asked for, so a lookup by name costs no strings.
    private let sectionTable: FileBytes
    private let sectionNames: FileBytes

    public struct ProgramHeader: Sendable, Equatable {
        public var type: UInt32
        public var offset: UInt64
        public var fileSize: UInt64
        /// Where the segment is mapped, relative to the image's base, and its size there.
        public var address: UInt64
        public var memorySize: UInt64
        public static let load: UInt32 = 1
        public static let dynamic: UInt32 = 2
        public static let interpreter: UInt32 = 3
        public static let relro: UInt32 = 0x6474_e552
    }

    public struct Section: Sendable, Equatable {
        public var name: String
        public var type: UInt32
        public var offset: UInt64
        public var size: UInt64
        public var link: UInt32
        public static let noBits: UInt32 = 8
    }

    public static let typeSharedObject: UInt16 = 3
    public static let machineX86_64: UInt16 = 62
    public static let machineAArch64: UInt16 = 183
    /// The section `plugin.mk` embeds the manifest in.
    public static let manifestSection = ".modhost.manifest"

    /// The ELF machine of the running host.
    public static var hostMachine: UInt16 {
        #if arch(x86_64)
        return machineX86_64
        #elseif arch(arm64)
        return machineAArch64
        #else
        return 0
        #endif
    }

    /// Opens the file at `path` and checks its structure, reading only its headers.
    /// Throws when it is not a 64-bit little-endian ELF file, is too large, or a header
    /// lies outside it.
    public init(path: String) throws(ELFError) {
        switch ReadOnlyFile.open(path, followSymlinks: true) {
        case .success(let file): try self.init(file: file)
        case .failure(let error): throw error
        }
    }

    /// Checks the structure of the open file `file`; later reads use the same file.
    public init(file: ReadOnlyFile) throws(ELFError) {
        try self.init(path: file.path, source: ByteSource(file))
    }

    /// Checks the structure of `contents`, the bytes of the file at `path` read already.
    public init(path: String, contents: [UInt8]) throws(ELFError) {
        try self.init(path: path, source: .memory(contents))
    }

    private init(path: String, source: ByteSource) throws(ELFError) {
        self.path = path
        self.source = source
        fileSize = source.size
        guard fileSize <= PluginLimits.maximumFileSize else {
            throw .tooLarge(what: "file", size: fileSize, limit: PluginLimits.maximumFileSize)
        }
        let header = FileBytes(try source.read(0..<min(fileSize, 64)))
        guard header.count >= 4, header[0] == 0x7f, header[1] == 0x45, header[2] == 0x4c, header[3] == 0x46 else {
            throw .notELF(firstBytes: Array(header.prefix(4)))
        }
        guard header.count >= 64 else { throw .truncated(what: "ELF header", needed: 64, fileSize: fileSize) }
        guard header[4] == 2 else { throw .wrongClass(found: header[4]) }
        guard header[5] == 1 else { throw .wrongByteOrder(found: header[5]) }
        fileType = header.u16(16)
        machine = header.u16(18)

        let phoff = header.u64(32), phentsize = UInt64(header.u16(54)), phnum = UInt64(header.u16(56))
        guard phnum == 0 || phentsize == 56 else { throw .malformed("program header entry size \(phentsize), expected 56") }
        programHeaderTable = FileBytes(try source.read(FileArithmetic.range(
            "program headers", offset: phoff, size: phnum * 56, within: fileSize)))

        // Section headers sit at the end of the file: a truncated copy loses them first.
        // They are not needed to judge the segments, so their absence is recorded rather
        // than thrown, and the segment check reports the truncation.
        do {
            (sectionTable, sectionNames) = try Self.readSections(header, source)
            sectionError = nil
        } catch {
            (sectionTable, sectionNames) = (FileBytes([]), FileBytes([]))
            sectionError = error
        }
    }

    /// The section header table and the section name table, each checked to lie in the file.
    private static func readSections(_ header: FileBytes, _ source: ByteSource) throws(ELFError) -> (table: FileBytes, names: FileBytes) {
        let shoff = header.u64(40), shentsize = UInt64(header.u16(58)), shnum = UInt64(header.u16(60))
        let shstrndx = Int(header.u16(62))
        guard shoff != 0 && shnum != 0 else { return (FileBytes([]), FileBytes([])) }
        guard shentsize == 64 else { throw .malformed("section header entry size \(shentsize), expected 64") }
        let table = FileBytes(try source.read(FileArithmetic.range(
            "section headers", offset: shoff, size: shnum * 64, within: source.size)))
        guard shstrndx < Int(shnum) else { throw .malformed("section name table index \(shstrndx) out of range") }
        let namesHeader = shstrndx * 64
        let names = FileBytes(try source.read(FileArithmetic.range(
            "section name table", offset: table.u64(namesHeader + 24), size: table.u64(namesHeader + 32), within: source.size)))
        return (table, names)
    }

    /// Every program header, in the order of the program header table.
    public var programHeaders: [ProgramHeader] { (0..<programHeaderCount).map(programHeader(at:)) }

    /// The number of entries in the program header table.
    var programHeaderCount: Int { programHeaderTable.count / 56 }

    /// Program header `index`, which must be below `programHeaderCount`.
    func programHeader(at index: Int) -> ProgramHeader {
        let base = index * 56
        return ProgramHeader(type: programHeaderTable.u32(base), offset: programHeaderTable.u64(base + 8),
                             fileSize: programHeaderTable.u64(base + 32), address: programHeaderTable.u64(base + 16),
                             memorySize: programHeaderTable.u64(base + 40))
    }

    /// Every section, in the order of the section header table (empty when `sectionError`
    /// is set).
    public var sections: [Section] { (0..<sectionCount).map(section(at:)) }

    /// The number of entries in the section header table.
    public var sectionCount: Int { sectionTable.count / 64 }

    /// Section `index`, which must be below `sectionCount`.
    func section(at index: Int) -> Section {
        section(at: index, named: sectionNames.cString(at: UInt64(sectionTable.u32(base(ofSection: index)))))
    }

    private func base(ofSection index: Int) -> Int { index * 64 }

    /// Section `index`, whose name is known to be `name`.
    private func section(at index: Int, named name: String) -> Section {
        let base = base(ofSection: index)
        return Section(
            name: name, type: sectionTable.u32(base + 4),
            offset: sectionTable.u64(base + 24), size: sectionTable.u64(base + 32), link: sectionTable.u32(base + 40))
    }

    /// The first section called `name`, nil when there is none. Names are compared on the
    /// bytes of the section name table, as `sections` would decode them.
    public func section(named name: String) -> Section? {
        guard let index = sectionIndex(named: name) else { return nil }
        // The name matched `name` byte for byte: no need to decode it from the table.
        return section(at: index, named: name)
    }

    /// The index of the first section called `name`, nil when there is none. The checks
    /// before dlopen look sections up with it rather than with `section(named:)`: an
    /// optional `Section` is copied and destroyed through its type, made at run time.
    func sectionIndex(named name: String) -> Int? {
        var name = name
        let count = sectionCount
        return name.withUTF8 { wanted in
            sectionTable.withUnsafeBytes { table in
                sectionNames.withUnsafeBytes { names -> Int? in
                    for index in 0..<count {
                        // index * 64 + 4 <= table.count: the table holds `count` whole entries.
                        let offset = Int(UInt32(littleEndian: table.loadUnaligned(fromByteOffset: index * 64, as: UInt32.self)))
                        if FileBytes.isCString(wanted, at: offset, in: names) { return index }
                    }
                    return nil
                }
            }
        }
    }

    /// True for a position-independent executable (ET_DYN with a program interpreter),
    /// which `dlopen` refuses.
    public var isExecutable: Bool { (0..<programHeaderCount).contains { programHeader(at: $0).type == ProgramHeader.interpreter } }

    /// The first loadable segment whose file bytes run past the end of the file: mapping it
    /// makes `dlopen` die with SIGBUS. Nil when every segment fits.
    public var loadSegmentPastEnd: (index: Int, end: UInt64)? {
        for index in 0..<programHeaderCount {
            let header = programHeader(at: index)
            guard header.type == ProgramHeader.load else { continue }
            let (end, overflow) = header.offset.addingReportingOverflow(header.fileSize)
            if overflow || end > fileSize { return (index, overflow ? .max : end) }
        }
        return nil
    }

    /// The first address the dynamic loader would follow out of the image, said as a
    /// problem; nil when there is none. `dlopen` trusts the program headers and the dynamic
    /// segment (not the section headers the other checks read): a dynamic segment, a RELRO
    /// range or a table the dynamic segment points to (strings, symbols, hash, relocations,
    /// init and fini arrays, versions) outside every loadable segment crashes it, and the
    /// process with it. The loader keeps the last entry of each tag, so every entry is
    /// checked, and it reads entries until DT_NULL, which must end them within the segment.
    /// Throws when the dynamic segment's bytes lie outside the file.
    public func loaderAddressProblem() throws(ELFError) -> String? {
        var loads: [AddressRange] = []
        for index in 0..<programHeaderCount {
            let header = programHeader(at: index)
            if header.type == ProgramHeader.load { loads.append(AddressRange(start: header.address, size: header.memorySize)) }
        }
        // Each address below is looked up among them: a plugin has a few, a crafted file
        // could have 65,535 (and a dynamic segment of millions of entries).
        guard loads.count <= Self.maximumLoadSegments else {
            return "\(loads.count) loadable segments, more than the \(Self.maximumLoadSegments) a plugin may have"
        }
        func mapped(_ start: UInt64, size: UInt64) -> Bool {
            let range = AddressRange(start: start, size: size)
            return !range.overflows && loads.contains { !$0.overflows && range.start >= $0.start && range.end <= $0.end }
        }
        func hex(_ value: UInt64) -> String { "0x" + String(value, radix: 16) }
        var dynamic: ProgramHeader?
        for index in 0..<programHeaderCount {
            let header = programHeader(at: index)
            let what: String
            switch header.type {
            case ProgramHeader.dynamic:
                what = "the dynamic segment"
                if dynamic == nil { dynamic = header }
            case ProgramHeader.relro: what = "the RELRO range"
            default: continue
            }
            guard mapped(header.address, size: header.memorySize) else {
                return "\(what) (program header \(index)) at address \(hex(header.address)) with \(header.memorySize) bytes lies outside the loadable segments"
            }
        }
        guard let dynamic else { return nil }
        let table = FileBytes(try source.read(FileArithmetic.range("the dynamic segment", offset: dynamic.offset,
                                                                    size: dynamic.fileSize, within: fileSize)))
        // ld.so keeps the last entry of each tag, so every entry of an address tag is
        // checked, with the last size given for it: a first pass finds the end (DT_NULL) and
        // the last value of each size tag, the second checks the addresses. (Twice linear:
        // a table of a million entries costs two passes, not a million.)
        var sizes = [UInt64?](repeating: nil, count: Self.sizeTags.count)
        var end = 0
        while true {
            guard end + 16 <= table.count else {
                return "the dynamic segment has no DT_NULL entry to end it within its \(table.count) bytes"
            }
            let tag = table.u64(end)
            if tag == 0 { break }
            if let slot = Self.sizeTags.firstIndex(of: tag) { sizes[slot] = table.u64(end + 8) }
            end += 16
        }
        for base in stride(from: 0, to: end, by: 16) {
            guard let described = Self.addressTag(table.u64(base)) else { continue }
            let address = table.u64(base + 8)
            let size = described.sizeTag.flatMap { Self.sizeTags.firstIndex(of: $0) }.flatMap { sizes[$0] } ?? 1
            guard mapped(address, size: size) else {
                return "\(described.name) points to address \(hex(address))\(size > 1 ? " with \(size) bytes" : ""), outside the loadable segments"
            }
        }
        return nil
    }

    /// The most loadable segments a plugin may have (linkers make two to five).
    static let maximumLoadSegments = 64

    /// The tags whose value is the size of what an `AddressTag` points to.
    static let sizeTags: [UInt64] = [2, 8, 10, 18, 27, 28, 33]

    /// A dynamic entry whose value is an address in the image the loader reads or calls:
    /// its name, and the tag of the entry giving its size when it has one.
    struct AddressTag {
        var name: String
        var sizeTag: UInt64?
    }

    /// The `AddressTag` of `tag`, nil for the tags whose value is no such address.
    static func addressTag(_ tag: UInt64) -> AddressTag? {
        switch tag {
        case 3: AddressTag(name: "DT_PLTGOT")
        case 4: AddressTag(name: "DT_HASH")
        case 5: AddressTag(name: "DT_STRTAB", sizeTag: 10)
        case 6: AddressTag(name: "DT_SYMTAB")
        case 7: AddressTag(name: "DT_RELA", sizeTag: 8)
        case 12: AddressTag(name: "DT_INIT")
        case 13: AddressTag(name: "DT_FINI")
        case 17: AddressTag(name: "DT_REL", sizeTag: 18)
        case 23: AddressTag(name: "DT_JMPREL", sizeTag: 2)
        case 25: AddressTag(name: "DT_INIT_ARRAY", sizeTag: 27)
        case 26: AddressTag(name: "DT_FINI_ARRAY", sizeTag: 28)
        case 32: AddressTag(name: "DT_PREINIT_ARRAY", sizeTag: 33)
        case 0x6fff_fef5: AddressTag(name: "DT_GNU_HASH")
        case 0x6fff_fff0: AddressTag(name: "DT_VERSYM")
        case 0x6fff_fffc: AddressTag(name: "DT_VERDEF")
        case 0x6fff_fffe: AddressTag(name: "DT_VERNEED")
        default: nil
        }
    }

    /// `start..<start + size` in the image's addresses; a range whose end passes 2^64
    /// `overflows`, and neither contains nor is contained in any other.
    struct AddressRange {
        var start: UInt64
        var end: UInt64
        var overflows: Bool
        init(start: UInt64, size: UInt64) {
            self.start = start
            (end, overflows) = start.addingReportingOverflow(size)
        }
    }

    /// The contents of the section called `name`, nil when there is none. Throws when it
    /// lies outside the file.
    public func sectionContents(named name: String) throws(ELFError) -> [UInt8]? {
        guard let section = section(named: name) else { return nil }
        return try contents(of: section)
    }

    /// The embedded manifest's bytes, nil when the file has no manifest section. Throws
    /// `tooLarge` past `PluginLimits.maximumManifestSize`, before reading it.
    public func manifestContents() throws(ELFError) -> [UInt8]? {
        guard let index = sectionIndex(named: Self.manifestSection) else { return nil }
        let section = self.section(at: index, named: Self.manifestSection)
        guard section.size <= PluginLimits.maximumManifestSize else {
            throw .tooLarge(what: "manifest section \(Self.manifestSection)", size: section.size, limit: PluginLimits.maximumManifestSize)
        }
        return try contents(of: section)
    }

    /// The bytes of `section`, read from the file; throws when they lie outside it.
    public func contents(of section: Section) throws(ELFError) -> [UInt8] {
        Array(try bytes(of: section))
    }

    func bytes(of section: Section) throws(ELFError) -> ArraySlice<UInt8> {
        if section.type == Section.noBits { return [] }
        return try source.read(FileArithmetic.range(
            "section \(section.name)", offset: section.offset, size: section.size, within: fileSize))
    }

    /// The string table `section` links to (its `sh_link`).
    func linkedSection(of section: Section) throws(ELFError) -> Section {
        guard Int(section.link) < sectionCount else {
            throw .malformed("\(section.name) links to section \(section.link), the file has \(sectionCount)")
        }
        return self.section(at: Int(section.link))
    }

    /// The entries of the dynamic section as (tag, value) pairs up to DT_NULL, with its
    /// string table (section, index and bytes). Throws when an entry that names a string
    /// points outside the table.
    func dynamicEntries() throws(ELFError) -> (entries: [(tag: UInt64, value: UInt64)], strings: Section, link: UInt32, stringBytes: FileBytes)? {
        var entries: [(tag: UInt64, value: UInt64)] = []
        guard let strings = try forEachDynamicEntry({ tag, value, _ in entries.append((tag, value)) }) else { return nil }
        return (entries, strings.section, strings.link, strings.bytes)
    }

    /// The string table of the dynamic section: its section, its index and its bytes. (Not a
    /// tuple: a tuple type, with its labels, is made at run time on a process's first scan.)
    private struct DynamicStrings {
        var section: Section
        var link: UInt32
        var bytes: FileBytes
    }

    /// Calls `body` with each (tag, value) of the dynamic section up to DT_NULL and the
    /// bytes of its string table, then returns the string table; nil when there is no
    /// dynamic section. Throws at the first entry that names a string outside the table.
    private func forEachDynamicEntry(_ body: (UInt64, UInt64, FileBytes) -> Void) throws(ELFError) -> DynamicStrings? {
        guard let index = sectionIndex(named: ".dynamic") else { return nil }
        let dynamic = section(at: index, named: ".dynamic")
        let table = FileBytes(try bytes(of: dynamic))
        let strings = try linkedSection(of: dynamic)
        let stringBytes = FileBytes(try bytes(of: strings))
        var base = 0
        while base + 16 <= table.count {
            let tag = table.u64(base), value = table.u64(base + 8)
            if tag == 0 { break }
            if let name = Self.stringTagName(tag), value >= UInt64(stringBytes.count) {
                throw .malformed("\(name) entry names string offset \(value), the string table has \(stringBytes.count) bytes")
            }
            body(tag, value, stringBytes)
            base += 16
        }
        return DynamicStrings(section: strings, link: dynamic.link, bytes: stringBytes)
    }

    /// The name of a dynamic entry tag whose value is an offset in the string table, nil
    /// for the other tags.
    static func stringTagName(_ tag: UInt64) -> String? {
        switch tag {
        case 1: "DT_NEEDED"
        case 14: "DT_SONAME"
        case 15: "DT_RPATH"
        case 29: "DT_RUNPATH"
        default: nil
        }
    }

    /// NEEDED, SONAME and RUNPATH/RPATH entries of the dynamic section (read in one pass,
    /// without building the list of entries).
    public func dynamicInfo() throws(ELFError) -> DynamicInfo {
        var info = DynamicInfo()
        _ = try forEachDynamicEntry { tag, value, strings in
            switch tag {
            case 1: info.needed.append(strings.cString(at: value))
            case 14: info.soname = strings.cString(at: value)
            case 15, 29: info.runpath.append(strings.cString(at: value))
            default: break
            }
        }
        return info
    }

    /// Names of the symbols the file defines in its dynamic symbol table (what other
    /// objects can bind to). With `prefixes`, only names starting with one of them, which
    /// is compared on the raw bytes, so scanning a large Swift table costs no strings.
    /// Throws when a symbol's name lies outside the string table.
    public func definedDynamicSymbols(withPrefixes prefixes: [String]? = nil) throws(ELFError) -> [String] {
        guard let symbols = section(named: ".dynsym") else { return [] }
        let entries = FileBytes(try bytes(of: symbols))
        let strings = FileBytes(try bytes(of: linkedSection(of: symbols)))
        let wanted = prefixes?.map { Array($0.utf8) }
        var names: [String] = []
        var base = 24  // entry 0 is the null symbol
        while base + 24 <= entries.count {
            defer { base += 24 }
            let offset = Int(entries.u32(base))
            guard offset < strings.count else {
                throw .malformed("dynamic symbol \(base / 24) names string offset \(offset), the string table has \(strings.count) bytes")
            }
            guard entries.u16(base + 6) != 0 else { continue }  // SHN_UNDEF: imported, not defined
            if let wanted, !wanted.contains(where: { strings.has($0, at: offset) }) {
                continue
            }
            names.append(strings.cString(at: UInt64(offset)))
        }
        return names
    }

    /// What the host needs from the dynamic symbol table, read in one pass: the facts of
    /// each symbol of `names` (as `symbols(named:)` gives them: nil when the table lacks
    /// it, a definition winning over a reference), and the names of the symbols defined with
    /// one of `prefixes` (as `definedDynamicSymbols(withPrefixes:)` gives them, with its
    /// errors). Names are compared on the table's bytes: no string is made for a symbol
    /// that is not asked for.
    public func dynamicSymbols(named names: SymbolNames, definedWithPrefixes prefixes: SymbolNames) throws(ELFError) -> (facts: [SymbolFacts?], defined: [String]) {
        var facts = [SymbolFacts?](repeating: nil, count: names.bytes.count)
        var defined: [String] = []
        guard let index = sectionIndex(named: ".dynsym") else { return (facts, defined) }
        let symbols = section(at: index, named: ".dynsym")
        let entries = FileBytes(try bytes(of: symbols))
        let strings = FileBytes(try bytes(of: linkedSection(of: symbols)))
        let wanted = names.bytes, starts = prefixes.bytes
        var failure: ELFError?
        entries.withUnsafeBytes { table in
            strings.withUnsafeBytes { text in
                var base = 24  // entry 0 is the null symbol
                while base + 24 <= table.count {
                    defer { base += 24 }
                    let offset = Int(UInt32(littleEndian: table.loadUnaligned(fromByteOffset: base, as: UInt32.self)))
                    guard offset < text.count else {
                        failure = .malformed("dynamic symbol \(base / 24) names string offset \(offset), the string table has \(text.count) bytes")
                        return
                    }
                    let infoAndOther = UInt16(littleEndian: table.loadUnaligned(fromByteOffset: base + 4, as: UInt16.self))
                    let isDefined = UInt16(littleEndian: table.loadUnaligned(fromByteOffset: base + 6, as: UInt16.self)) != 0
                    let first = text[offset]
                    if isDefined, starts.contains(where: { ($0.isEmpty || $0.first == first) && FileBytes.hasPrefix($0, at: offset, in: text) }) {
                        defined.append(FileBytes.cString(text, from: offset))
                    }
                    for (index, name) in wanted.enumerated() where name.first == first || (name.isEmpty && first == 0) {
                        guard name.withUnsafeBufferPointer({ FileBytes.isCString($0, at: offset, in: text) }) else { continue }
                        if facts[index]?.defined != true {
                            let info = UInt8(truncatingIfNeeded: infoAndOther), other = UInt8(truncatingIfNeeded: infoAndOther >> 8)
                            facts[index] = SymbolFacts(defined: isDefined, type: info & 0xf, binding: info >> 4, visibility: other & 3)
                        }
                    }
                }
            }
        }
        if let failure { throw failure }
        return (facts, defined)
    }

    /// Symbol names (or prefixes) to look for, as the bytes a symbol table holds: made once
    /// for names asked of every file.
    public struct SymbolNames: Sendable {
        let bytes: [[UInt8]]
        public init(_ names: [String]) { bytes = names.map { Array($0.utf8) } }
    }

    /// What a symbol table says about one symbol: whether the file defines it, its type,
    /// binding and visibility (the ELF `st_info` and `st_other` fields).
    public struct SymbolFacts: Sendable, Equatable {
        public var defined: Bool
        /// STT_*: 0 no type, 1 object, 2 function, ...
        public var type: UInt8
        /// STB_*: 0 local, 1 global, 2 weak.
        public var binding: UInt8
        /// STV_*: 0 default, 1 internal, 2 hidden, 3 protected.
        public var visibility: UInt8
        public static let typeFunction: UInt8 = 2
        public static let bindingLocal: UInt8 = 0

        /// Defined here, global or weak, with default or protected visibility: what `dlsym`
        /// finds in this file (Swift's `@_cdecl` public functions are protected).
        public var isExported: Bool { defined && binding != Self.bindingLocal && (visibility == 0 || visibility == 3) }

        /// "a hidden local function" and the like, for messages.
        public var summary: String {
            let visibilityName = ["default", "internal", "hidden", "protected"][Int(visibility & 3)]
            let bindingName = binding == 0 ? "local" : binding == 1 ? "global" : binding == 2 ? "weak" : "binding \(binding)"
            let typeName = type == 1 ? "object" : type == 2 ? "function" : "symbol"
            return defined ? "a \(bindingName) \(typeName) with \(visibilityName) visibility" : "an undefined reference (imported from another file)"
        }
    }

    /// The facts of the symbols named `names` in the symbol table `table` (`.dynsym`, what
    /// the dynamic loader sees, or `.symtab`, the full table a non-stripped file keeps);
    /// a name the table lacks is absent from the result (for `.dynsym`: not exported at
    /// all). When a name appears twice, a definition wins over a reference.
    public func symbols(named names: Set<String>, in table: String = ".dynsym") throws(ELFError) -> [String: SymbolFacts] {
        guard !names.isEmpty, let symbols = section(named: table), symbols.type != Section.noBits else { return [:] }
        let entries = FileBytes(try bytes(of: symbols))
        let strings = FileBytes(try bytes(of: linkedSection(of: symbols)))
        let wanted = names.map { Array($0.utf8) + [0] }
        var found: [String: SymbolFacts] = [:]
        var base = 24  // entry 0 is the null symbol
        while base + 24 <= entries.count {
            defer { base += 24 }
            let offset = Int(entries.u32(base))
            guard offset < strings.count else {
                throw .malformed("symbol \(base / 24) of \(table) names string offset \(offset), the string table has \(strings.count) bytes")
            }
            // The name must end where the wanted one does (the NUL is compared too).
            guard let match = wanted.first(where: { strings.has($0, at: offset) }) else { continue }
            let name = String(decoding: match.dropLast(), as: UTF8.self)
            // st_info (type in the low nibble, binding in the high one), then st_other
            // (visibility in its low two bits).
            let infoAndOther = entries.u16(base + 4)
            let info = UInt8(truncatingIfNeeded: infoAndOther), other = UInt8(truncatingIfNeeded: infoAndOther >> 8)
            let facts = SymbolFacts(defined: entries.u16(base + 6) != 0, type: info & 0xf, binding: info >> 4, visibility: other & 3)
            if found[name]?.defined != true { found[name] = facts }
        }
        return found
    }

    /// The ModuleKit ABI version a libModuleKit.so records in its `.modhost.modulekit`
    /// section (two little-endian UInt32: major, minor); nil when the file has no such
    /// section or it is not 8 bytes.
    public func moduleKitABIVersion() throws(ELFError) -> (major: Int, minor: Int)? {
        guard let section = section(named: ".modhost.modulekit"), section.size == 8 else { return nil }
        let reader = FileBytes(try contents(of: section)[...])
        return (Int(reader.u32(0)), Int(reader.u32(4)))
    }

    /// The GNU build id (lowercase hex) from `.note.gnu.build-id`, nil when absent or when
    /// the note's sizes do not fit in it.
    public func buildID() throws(ELFError) -> String? {
        guard let note = try sectionContents(named: ".note.gnu.build-id"), note.count >= 16 else { return nil }
        let reader = FileBytes(note[...])
        let nameSize = UInt64(reader.u32(0)), descSize = UInt64(reader.u32(4))
        // Both sizes are 32-bit: the sums below cannot overflow 64 bits.
        let descStart = 12 + (nameSize + 3) / 4 * 4
        guard let range = try? FileArithmetic.range("build-id note", offset: descStart, size: descSize, within: UInt64(note.count)) else {
            return nil
        }
        return note[FileArithmetic.indices(range)].map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }
}

/// Entries of an ELF dynamic section.
public struct DynamicInfo: Sendable, Equatable {
    public var needed: [String] = []
    public var soname: String?
    public var runpath: [String] = []

    public init(needed: [String] = [], soname: String? = nil, runpath: [String] = []) {
        self.needed = needed
        self.soname = soname
        self.runpath = runpath
    }
}

/// Why a file is not a usable ELF shared object, in words an operator can act on.
public enum ELFError: Error, Sendable, Equatable, CustomStringConvertible {
    case cannotRead(path: String, errno: Int32)
    case notELF(firstBytes: [UInt8])
    case wrongClass(found: UInt8)
    case wrongByteOrder(found: UInt8)
    case truncated(what: String, needed: UInt64, fileSize: UInt64)
    case malformed(String)
    /// The file, or a part of it, is larger than the host reads (`PluginLimits`).
    case tooLarge(what: String, size: UInt64, limit: UInt64)

    public var description: String {
        switch self {
        case .cannotRead(let path, let code):
            return "cannot read \(path): \(String(cString: strerror(code)))"
        case .notELF(let first):
            let shown = first.map { String($0, radix: 16) }.joined(separator: " ")
            return "not an ELF file: starts with bytes [\(shown)], expected 7f 45 4c 46 (\"\\x7fELF\")"
        case .wrongClass(let found):
            return "ELF class is \(found == 1 ? "32-bit" : "unknown (\(found))"), expected 64-bit"
        case .wrongByteOrder:
            return "ELF data is big-endian, expected little-endian"
        case .truncated(let what, let needed, let size):
            return "truncated: \(what) end at byte \(needed) but the file has \(size) bytes"
        case .malformed(let what):
            return "malformed ELF: \(what)"
        case .tooLarge(let what, let size, let limit):
            return "the \(what) is \(size) bytes, more than the \(limit) bytes the host reads"
        }
    }
}

/// Where an image's bytes come from: an open file, or bytes already in memory.
///
/// For a file, its first `headSize` and last `tailSize` bytes are read in (at most) two
/// calls when it is opened: the first hold the ELF and program headers and the dynamic
/// symbols of a small plugin, the last its section headers, section names, manifest and
/// often its dynamic section, so the checks of a small C plugin cost two system calls. Any
/// other range is read with `pread` when asked for. Memory stays bounded by the two windows
/// and the ranges asked for, whatever the file's size.
///
/// The head is kept small: a read that copies pages nothing else needs costs more (about
/// a microsecond a page on a page-cache hit) than the extra `pread` a larger plugin needs.
struct ByteSource: Sendable {
    /// How much of the start of a file is read when it is opened.
    static let headSize: UInt64 = 1 << 10
    /// How much of the end of a file is read when it is opened.
    static let tailSize: UInt64 = 4 << 10
    private let file: ReadOnlyFile?
    private let head: [UInt8]
    private let tail: [UInt8]
    let size: UInt64

    init(_ file: ReadOnlyFile) throws(ELFError) {
        self.file = file
        size = file.size
        guard size <= PluginLimits.maximumFileSize else {
            (head, tail) = ([], [])
            return
        }
        if size <= Self.headSize + Self.tailSize {
            head = try file.read(0..<size)
            tail = []
        } else {
            head = try file.read(0..<Self.headSize)
            tail = try file.read(size - Self.tailSize..<size)
        }
    }

    static func memory(_ bytes: [UInt8]) -> ByteSource { ByteSource(bytes) }

    private init(_ bytes: [UInt8]) {
        file = nil
        head = bytes
        tail = []
        size = UInt64(bytes.count)
    }

    /// The bytes of `range`, checked by the caller to lie within `size`.
    func read(_ range: Range<UInt64>) throws(ELFError) -> ArraySlice<UInt8> {
        if range.upperBound <= UInt64(head.count) { return head[FileArithmetic.indices(range)] }
        let tailStart = size - UInt64(tail.count)
        if !tail.isEmpty, range.lowerBound >= tailStart {
            return tail[FileArithmetic.indices(range.lowerBound - tailStart..<range.upperBound - tailStart)]
        }
        guard let file else { throw .truncated(what: "range", needed: range.upperBound, fileSize: size) }
        return try file.read(range)[...]
    }
}

/// Bytes read from a file (a header, a table), with little-endian accessors at offsets the
/// caller keeps within `count` (counted from 0 whatever the slice's indices).
struct FileBytes: Sendable {
    private let buffer: ArraySlice<UInt8>
    var count: Int { buffer.count }

    init(_ buffer: ArraySlice<UInt8>) { self.buffer = buffer }

    @inline(__always)
    subscript(index: Int) -> UInt8 { buffer[buffer.startIndex + index] }
    func prefix(_ n: Int) -> ArraySlice<UInt8> { buffer.prefix(n) }

    @inline(__always)
    func u16(_ at: Int) -> UInt16 { load(at, as: UInt16.self) }
    @inline(__always)
    func u32(_ at: Int) -> UInt32 { load(at, as: UInt32.self) }
    @inline(__always)
    func u64(_ at: Int) -> UInt64 { load(at, as: UInt64.self) }

    /// The little-endian integer at `at`; traps, like the subscript, when its bytes are not
    /// all within `count`.
    @inline(__always)
    private func load<T: FixedWidthInteger>(_ at: Int, as type: T.Type) -> T {
        precondition(at >= 0 && at <= count - MemoryLayout<T>.size, "FileBytes: read past the end")
        return T(littleEndian: buffer.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at, as: T.self) })
    }

    /// True when the bytes at `offset` start with `prefix`.
    func has(_ prefix: [UInt8], at offset: Int) -> Bool {
        offset >= 0 && offset <= count - prefix.count
            && buffer[(buffer.startIndex + offset)...].starts(with: prefix)
    }

    /// True when the NUL-terminated string at `offset` of `bytes` (read as `cString(at:)`
    /// reads it, stopping at the end of the buffer) is exactly `name`.
    static func isCString(_ name: UnsafeBufferPointer<UInt8>, at offset: Int, in bytes: UnsafeRawBufferPointer) -> Bool {
        let count = bytes.count
        guard offset >= 0, offset <= count - name.count else { return name.isEmpty && offset >= count }
        // offset + name.count <= count: both ranges lie within the buffer.
        return (name.isEmpty || memcmp(bytes.baseAddress! + offset, name.baseAddress!, name.count) == 0)
            && (offset + name.count == count || bytes[offset + name.count] == 0)
    }

    /// True when the bytes at `offset` of `bytes` start with `prefix`.
    static func hasPrefix(_ prefix: [UInt8], at offset: Int, in bytes: UnsafeRawBufferPointer) -> Bool {
        guard offset >= 0, offset <= bytes.count - prefix.count else { return false }
        return prefix.withUnsafeBytes { prefix in prefix.isEmpty || memcmp(bytes.baseAddress! + offset, prefix.baseAddress!, prefix.count) == 0 }
    }

    /// The NUL-terminated string at `offset` (within `bytes`), stopping at the end of the
    /// buffer, as `cString(at:)` reads it.
    static func cString(_ bytes: UnsafeRawBufferPointer, from offset: Int) -> String {
        let rest = UnsafeRawBufferPointer(rebasing: bytes[offset...])
        let length = rest.firstIndex(of: 0) ?? rest.count
        return String(decoding: UnsafeRawBufferPointer(rebasing: rest[..<length]), as: UTF8.self)
    }

    /// Calls `body` with the bytes, counted from 0.
    func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try buffer.withUnsafeBytes(body)
    }

    /// The NUL-terminated string at `offset`, stopping at the end of the buffer; "" when
    /// `offset` lies outside it.
    func cString(at offset: UInt64) -> String {
        guard offset < UInt64(count) else { return "" }
        let start = buffer.startIndex + Int(offset)
        let stop = buffer[start...].firstIndex(of: 0) ?? buffer.endIndex
        return String(decoding: buffer[start..<stop], as: UTF8.self)
    }
}
