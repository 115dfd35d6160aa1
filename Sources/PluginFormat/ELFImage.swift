#if canImport(Glibc)
import Glibc
#endif

/// The parts of an ELF file the host checks before it lets `dlopen` near the file:
/// identification, program headers, section headers and the dynamic section.
///
/// Reading never maps the file and never runs code: every offset is checked against the
/// file size first, so a truncated or garbled file gives an `ELFError`, not a crash.
public struct ELFImage: Sendable {
    public let path: String
    public let fileSize: UInt64
    public let fileType: UInt16
    public let machine: UInt16
    public let programHeaders: [ProgramHeader]
    public let sections: [Section]
    private let bytes: FileBytes

    public struct ProgramHeader: Sendable, Equatable {
        public var type: UInt32
        public var offset: UInt64
        public var fileSize: UInt64
        public static let load: UInt32 = 1
        public static let dynamic: UInt32 = 2
        public static let interpreter: UInt32 = 3
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

    /// Reads and checks the structure of the file at `path`.
    /// Throws when it is not a 64-bit little-endian ELF file or a header lies outside it.
    public init(path: String) throws(ELFError) {
        let bytes = try FileBytes(path: path)
        try self.init(path: path, bytes: bytes)
    }

    /// Checks the structure of `contents`, the bytes of the file at `path` read already.
    public init(path: String, contents: [UInt8]) throws(ELFError) {
        try self.init(path: path, bytes: FileBytes(buffer: contents))
    }

    init(path: String, bytes: FileBytes) throws(ELFError) {
        self.path = path
        self.bytes = bytes
        fileSize = UInt64(bytes.count)
        guard bytes.count >= 4, bytes[0] == 0x7f, bytes[1] == 0x45, bytes[2] == 0x4c, bytes[3] == 0x46 else {
            throw .notELF(firstBytes: Array(bytes.prefix(4)))
        }
        guard bytes.count >= 64 else { throw .truncated(what: "ELF header", needed: 64, fileSize: fileSize) }
        guard bytes[4] == 2 else { throw .wrongClass(found: bytes[4]) }
        guard bytes[5] == 1 else { throw .wrongByteOrder(found: bytes[5]) }
        fileType = bytes.u16(16)
        machine = bytes.u16(18)

        let phoff = bytes.u64(32), phentsize = UInt64(bytes.u16(54)), phnum = UInt64(bytes.u16(56))
        guard phnum == 0 || phentsize >= 56 else { throw .malformed("program header entry size \(phentsize) < 56") }
        guard phoff.addingReportingOverflow(phentsize * phnum).partialValue <= fileSize, phoff <= fileSize else {
            throw .truncated(what: "program headers", needed: phoff + phentsize * phnum, fileSize: fileSize)
        }
        programHeaders = (0..<phnum).map { index in
            let base = Int(phoff + index * phentsize)
            return ProgramHeader(type: bytes.u32(base), offset: bytes.u64(base + 8), fileSize: bytes.u64(base + 32))
        }

        // Section headers sit at the end of the file: a truncated copy loses them first.
        // They are not needed to judge the segments, so their absence is recorded rather
        // than thrown, and the segment check reports the truncation.
        self.sections = (try? Self.readSections(bytes, fileSize: fileSize)) ?? []
    }

    private static func readSections(_ bytes: FileBytes, fileSize: UInt64) throws(ELFError) -> [Section] {
        let shoff = bytes.u64(40), shentsize = UInt64(bytes.u16(58)), shnum = UInt64(bytes.u16(60))
        let shstrndx = Int(bytes.u16(62))
        guard shoff != 0 && shnum != 0 else { return [] }
        guard shentsize >= 64 else { throw .malformed("section header entry size \(shentsize) < 64") }
        guard shoff <= fileSize, shoff + shentsize * shnum <= fileSize else {
            throw .truncated(what: "section headers", needed: shoff + shentsize * shnum, fileSize: fileSize)
        }
        var raw: [(nameOffset: UInt32, section: Section)] = []
        for index in 0..<shnum {
            let base = Int(shoff + index * shentsize)
            raw.append((bytes.u32(base), Section(
                name: "", type: bytes.u32(base + 4), offset: bytes.u64(base + 24),
                size: bytes.u64(base + 32), link: bytes.u32(base + 40))))
        }
        guard shstrndx < raw.count else { throw .malformed("section name table index \(shstrndx) out of range") }
        let names = raw[shstrndx].section
        guard names.offset + names.size <= fileSize else {
            throw .truncated(what: "section name table", needed: names.offset + names.size, fileSize: fileSize)
        }
        var sections: [Section] = []
        for entry in raw {
            var section = entry.section
            section.name = bytes.cString(at: names.offset + UInt64(entry.nameOffset), limit: names.offset + names.size)
            sections.append(section)
        }
        return sections
    }

    /// True for a position-independent executable (ET_DYN with a program interpreter),
    /// which `dlopen` refuses.
    public var isExecutable: Bool { programHeaders.contains { $0.type == ProgramHeader.interpreter } }

    /// The first loadable segment whose file bytes run past the end of the file: mapping it
    /// makes `dlopen` die with SIGBUS. Nil when every segment fits.
    public var loadSegmentPastEnd: (index: Int, end: UInt64)? {
        for (index, header) in programHeaders.enumerated() where header.type == ProgramHeader.load {
            let (end, overflow) = header.offset.addingReportingOverflow(header.fileSize)
            if overflow || end > fileSize { return (index, overflow ? .max : end) }
        }
        return nil
    }

    /// The contents of the section called `name`, nil when there is none. Throws when it
    /// lies outside the file.
    public func sectionContents(named name: String) throws(ELFError) -> [UInt8]? {
        guard let section = sections.first(where: { $0.name == name }) else { return nil }
        return try contents(of: section)
    }

    public func contents(of section: Section) throws(ELFError) -> [UInt8] {
        if section.type == Section.noBits { return [] }
        let (end, overflow) = section.offset.addingReportingOverflow(section.size)
        guard !overflow, end <= fileSize else {
            throw .truncated(what: "section \(section.name)", needed: end, fileSize: fileSize)
        }
        return Array(bytes.slice(Int(section.offset)..<Int(end)))
    }

    /// NEEDED, SONAME and RUNPATH/RPATH entries of the dynamic section.
    public func dynamicInfo() throws(ELFError) -> DynamicInfo {
        var info = DynamicInfo()
        guard let dynamic = sections.first(where: { $0.name == ".dynamic" }) else { return info }
        let table = try contents(of: dynamic)
        guard Int(dynamic.link) < sections.count else { throw .malformed(".dynamic links to a missing string table") }
        let strings = try contents(of: sections[Int(dynamic.link)])
        func string(_ offset: UInt64) -> String {
            FileBytes(buffer: strings).cString(at: offset, limit: UInt64(strings.count))
        }
        let entries = FileBytes(buffer: table)
        var base = 0
        while base + 16 <= table.count {
            let tag = entries.u64(base), value = entries.u64(base + 8)
            switch tag {
            case 0: return info
            case 1: info.needed.append(string(value))
            case 14: info.soname = string(value)
            case 15, 29: info.runpath.append(string(value))
            default: break
            }
            base += 16
        }
        return info
    }

    /// Names of the symbols the file defines in its dynamic symbol table (what other
    /// objects can bind to). With `prefixes`, only names starting with one of them, which
    /// is compared on the raw bytes, so scanning a large Swift table costs no strings.
    public func definedDynamicSymbols(withPrefixes prefixes: [String]? = nil) throws(ELFError) -> [String] {
        guard let symbols = sections.first(where: { $0.name == ".dynsym" }) else { return [] }
        let table = try contents(of: symbols)
        guard Int(symbols.link) < sections.count else { throw .malformed(".dynsym links to a missing string table") }
        let stringBytes = try contents(of: sections[Int(symbols.link)])
        let strings = FileBytes(buffer: stringBytes)
        let entries = FileBytes(buffer: table)
        let wanted = prefixes?.map { Array($0.utf8) }
        var names: [String] = []
        var base = 24  // entry 0 is the null symbol
        while base + 24 <= table.count {
            defer { base += 24 }
            guard entries.u16(base + 6) != 0 else { continue }  // SHN_UNDEF: imported, not defined
            let offset = Int(entries.u32(base))
            if let wanted, !wanted.contains(where: { prefix in
                offset + prefix.count <= stringBytes.count && stringBytes[offset..<offset + prefix.count].elementsEqual(prefix)
            }) {
                continue
            }
            names.append(strings.cString(at: UInt64(offset), limit: UInt64(stringBytes.count)))
        }
        return names
    }

    /// The GNU build id (lowercase hex) from `.note.gnu.build-id`, nil when absent.
    public func buildID() throws(ELFError) -> String? {
        guard let note = try sectionContents(named: ".note.gnu.build-id"), note.count >= 16 else { return nil }
        let reader = FileBytes(buffer: note)
        let nameSize = Int(reader.u32(0)), descSize = Int(reader.u32(4))
        let descStart = 12 + ((nameSize + 3) & ~3)
        guard descStart + descSize <= note.count else { return nil }
        return note[descStart..<descStart + descSize].map { byte in
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
        }
    }
}

/// The bytes of a file read in one go, with bounds-checked little-endian accessors.
struct FileBytes: Sendable {
    private let buffer: [UInt8]
    var count: Int { buffer.count }

    init(buffer: [UInt8]) { self.buffer = buffer }

    init(path: String) throws(ELFError) {
        switch OpenedFile.read(path, followSymlinks: true) {
        case .success(let file): buffer = file.bytes
        case .failure(let error): throw error
        }
    }

    subscript(index: Int) -> UInt8 { buffer[index] }
    func prefix(_ n: Int) -> ArraySlice<UInt8> { buffer.prefix(n) }
    func slice(_ range: Range<Int>) -> ArraySlice<UInt8> { buffer[range] }

    func u16(_ at: Int) -> UInt16 { UInt16(buffer[at]) | UInt16(buffer[at + 1]) << 8 }
    func u32(_ at: Int) -> UInt32 { UInt32(u16(at)) | UInt32(u16(at + 2)) << 16 }
    func u64(_ at: Int) -> UInt64 { UInt64(u32(at)) | UInt64(u32(at + 4)) << 32 }

    /// The NUL-terminated string at `offset`, stopping at `limit` or the end of the buffer.
    func cString(at offset: UInt64, limit: UInt64) -> String {
        let end = Int(min(limit, UInt64(buffer.count)))
        guard offset < UInt64(end) else { return "" }
        var stop = Int(offset)
        while stop < end && buffer[stop] != 0 { stop += 1 }
        return String(decoding: buffer[Int(offset)..<stop], as: UTF8.self)
    }
}

/// A file opened once: its status and, for a regular file, all its bytes. Opening with
/// `O_NONBLOCK` makes a FIFO harmless, and without following a symlink makes a symlink
/// visible (`ELOOP`), so one open answers what lstat, stat and read would.
public struct OpenedFile: Sendable {
    public let status: stat
    /// The contents; empty unless the file is a regular file.
    public let bytes: [UInt8]

    /// Opens `path`; the error carries the errno (`ELOOP` for a symlink when not following).
    public static func read(_ path: String, followSymlinks: Bool) -> Result<OpenedFile, ELFError> {
        let flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (followSymlinks ? 0 : O_NOFOLLOW)
        let fd = open(path, flags)
        guard fd >= 0 else { return .failure(.cannotRead(path: path, errno: errno)) }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else { return .failure(.cannotRead(path: path, errno: errno)) }
        guard status.st_mode & S_IFMT == S_IFREG else { return .success(OpenedFile(status: status, bytes: [])) }
        let size = Int(status.st_size)
        var buffer = [UInt8](repeating: 0, count: size)
        var done = 0
        while done < size {
            let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, size - done, off_t(done)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                if n == 0 { break }
                return .failure(.cannotRead(path: path, errno: errno))
            }
            done += n
        }
        return .success(OpenedFile(status: status, bytes: done == size ? buffer : Array(buffer.prefix(done))))
    }
}
